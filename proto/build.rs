//! Compiles `proto/rls.proto` with protox (no system protoc) and prost.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/rls.proto");
    let descriptors = protox::compile(["proto/rls.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
