//! The same rules in Rust and in the sidecar's YAML: rules built in code are written out
//! as the files the sidecar loads (`<domain>.yaml` under its `RUNTIME_ROOT/
//! RUNTIME_SUBDIRECTORY/config`), read back as the sidecar reads them, and found equal.
//! Rules the sidecar already has (examples/config) are then extended in code.
//!
//! `cargo run -p ratelimit-core --example shared_rules -- DIRECTORY`
//! (without a directory, the YAML is printed instead of written)

use std::error::Error;
use std::path::Path;

use ratelimit_core::config::{Domain, RateLimit, Rule};
use ratelimit_core::{Config, Unit};

fn main() -> Result<(), Box<dyn Error>> {
    let in_code = Domain::new("api")
        .rule(
            Rule::key("api_key").limit(RateLimit::per(Unit::Minute, 100).token_bucket().burst(20)),
        )
        .rule(
            Rule::key("path")
                .value("/admin/*")
                .limit(RateLimit::per(Unit::Second, 5).sliding_window()),
        )
        .build()?;

    let files = in_code.to_yaml_files();
    match std::env::args().nth(1) {
        Some(directory) => {
            std::fs::create_dir_all(&directory)?;
            for (name, text) in &files {
                std::fs::write(Path::new(&directory).join(name), text)?;
                println!("wrote {directory}/{name}");
            }
            let mut read = Vec::new();
            for entry in std::fs::read_dir(&directory)? {
                let path = entry?.path();
                read.push((path.display().to_string(), std::fs::read_to_string(&path)?));
            }
            assert_eq!(
                Config::from_files(read, false)?,
                in_code,
                "the files are the rules"
            );
            println!("the sidecar reading {directory} gets the same rules");
        }
        None => {
            for (name, text) in &files {
                println!("# {name}\n{text}");
            }
        }
    }

    // The other way: the repository's example rules, extended in code.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = manifest.join("../examples/config/example.yaml");
    let sidecar = Config::from_yaml("example.yaml", &std::fs::read_to_string(path)?)?;
    let extended = sidecar.domains()[0]
        .to_rules()
        .rule(Rule::key("partner").limit(RateLimit::per(Unit::Hour, 1_000)));
    let extended = extended.build()?;
    println!(
        "{}: {} rules from YAML, {} with the one added in code",
        sidecar.domains()[0].domain,
        sidecar.domains()[0].descriptors.len(),
        extended.domains()[0].descriptors.len()
    );
    Ok(())
}
