//! What a service that depends on the layer compiles: a fresh crate outside the workspace
//! adds `ratelimit-tower` (or `ratelimit-core` alone) by path, and `cargo tree` lists the
//! packages its build takes. The workspace's unified-features crate, and with it Redis,
//! tonic and the rest of the sidecar's tree, must not reach it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The packages (name and version) a fresh binary crate depending on `crate_dir` builds,
/// itself included, for this machine's target.
fn packages_built_by_a_user_of(name: &str) -> BTreeSet<String> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name);
    let user =
        std::env::temp_dir().join(format!("ratelimit-user-of-{name}-{}", std::process::id()));
    std::fs::create_dir_all(user.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"user\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
         [dependencies]\n{name} = {{ path = {:?} }}\n",
        crate_dir.canonicalize().unwrap()
    );
    std::fs::write(user.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(user.join("src/main.rs"), "fn main() {}\n").unwrap();
    // Offline: the workspace's build has every package these need in cargo's cache.
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .current_dir(&user)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&user).unwrap();
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| line.split(" (").next().unwrap().to_owned())
        .collect()
}

#[test]
fn a_service_adding_the_layer_builds_the_core_and_a_few_http_crates_only() {
    let core = packages_built_by_a_user_of("ratelimit-core");
    let tower = packages_built_by_a_user_of("ratelimit-tower");
    let names = |set: &BTreeSet<String>| -> BTreeSet<String> {
        set.iter()
            .map(|p| p.split(' ').next().unwrap().to_owned())
            .collect()
    };
    let (core_names, tower_names) = (names(&core), names(&tower));
    assert!(
        core_names.contains("ratelimit-core") && core.len() < 40,
        "{core:?}"
    );
    let added: BTreeSet<_> = tower_names.difference(&core_names).cloned().collect();
    let expected: BTreeSet<String> = [
        "bytes",
        "http",
        "pin-project-lite",
        "ratelimit-tower",
        "tower-layer",
        "tower-service",
    ]
    .map(String::from)
    .into();
    assert_eq!(added, expected, "what the layer adds to the core's tree");
    assert!(!tower_names.contains("ratelimit-unified"), "{tower:?}");
}
