//! Compiles `proto/rls.proto` (and, with the `xds` feature, `proto/rls_conf.proto`) with
//! protox (no system protoc) and prost.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/rls.proto");
    println!("cargo:rerun-if-changed=proto/rls_conf.proto");
    let mut files = vec!["proto/rls.proto"];
    if std::env::var_os("CARGO_FEATURE_XDS").is_some() {
        files.push("proto/rls_conf.proto");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
