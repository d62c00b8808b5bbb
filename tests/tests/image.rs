//! The container images of `deploy/image/`: built with podman from the binaries the
//! tests run (the debug build, which `deploy/image/build.sh` strips: the same code as a
//! release image, built in seconds), then exported and run under `chroot` as the image
//! says (user, entrypoint, environment). The sidecar's answers a decision over gRPC and
//! through the `ratelimit-client` inside it; the intake's accepts a batch from a client
//! whose key its own `keygen` made.

use std::path::Path;

use ratelimit_tests::image::{Image, TEST_SOURCE, in_image, rootfs, spawn};
use ratelimit_tests::sidecar::{client_on, free_port, request, run_ok};
use ratelimit_tests::wait_for_port;
use serde_json::Value;

/// What both images promise: a numeric non-root user, the ports, the OCI labels.
fn check_config(config: &Value, title: &str, ports: &[u16], entrypoint: &str) {
    assert_eq!(config["User"], "65532:65532", "{config}");
    let exposed: Vec<&String> = config["ExposedPorts"].as_object().unwrap().keys().collect();
    let mut expected: Vec<String> = ports.iter().map(|p| format!("{p}/tcp")).collect();
    expected.sort();
    assert_eq!(exposed, expected.iter().collect::<Vec<_>>());
    assert_eq!(config["Entrypoint"], serde_json::json!([entrypoint]));
    let labels = &config["Labels"];
    for (label, value) in [
        ("title", title),
        ("version", env!("CARGO_PKG_VERSION")),
        ("source", TEST_SOURCE),
        ("licenses", "Apache-2.0"),
    ] {
        assert_eq!(
            labels[format!("org.opencontainers.image.{label}")],
            value,
            "{labels}"
        );
    }
}

/// Nothing in the image but what the binaries need: no shell, no package manager.
fn check_minimal(root: &Path, binaries: &[&str]) {
    let mut present: Vec<String> = std::fs::read_dir(root.join("bin"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    present.sort();
    assert_eq!(present, binaries);
    assert!(!root.join("usr").exists() && !root.join("sbin").exists());
}

const RULES: &str = "domain: image
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1 }
";

#[tokio::test]
async fn the_sidecar_image_answers_a_decision_from_its_exported_root_filesystem() {
    let image = Image::build("ratelimit");
    let config = image.config();
    check_config(&config, "ratelimit", &[6070, 8080, 8081], "/bin/ratelimit");
    let export = image.export();
    let root = rootfs(&export);
    check_minimal(
        &root,
        &["ratelimit", "ratelimit-client", "ratelimit-config-check"],
    );
    // The rules where a volume would put them: the default RUNTIME_ROOT.
    let rules = root.join("srv/runtime_data/current/config");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("rules.yaml"), RULES).unwrap();
    let checked = run_ok(&mut in_image(
        &config,
        &root,
        Some("/bin/ratelimit-config-check"),
        &["-config_dir", "/srv/runtime_data/current/config"],
        &[],
    ));
    assert!(checked.contains("image"), "{checked}");

    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    let env = [
        ("HOST", "127.0.0.1".to_owned()),
        ("GRPC_HOST", "127.0.0.1".to_owned()),
        ("DEBUG_HOST", "127.0.0.1".to_owned()),
        ("PORT", http.to_string()),
        ("GRPC_PORT", grpc.to_string()),
        ("DEBUG_PORT", debug.to_string()),
        ("BACKEND_TYPE", "memory".to_owned()),
        ("USE_STATSD", "false".to_owned()),
    ];
    let server = spawn(
        in_image(&config, &root, None, &[], &env),
        export.path().join("ratelimit.log"),
    );
    wait_for_port(grpc, "the sidecar in its image", &server.log);
    wait_for_port(http, "the sidecar in its image", &server.log);
    let mut client = client_on(grpc).await;
    let first = client
        .should_rate_limit(request("image", &[&[("user", "alice")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, 1, "OK: {first:?}");
    let told = run_ok(&mut in_image(
        &config,
        &root,
        Some("/bin/ratelimit-client"),
        &[
            "-dial_string",
            &format!("127.0.0.1:{grpc}"),
            "-domain",
            "image",
            "-descriptors",
            "user=alice",
        ],
        &[],
    ));
    assert!(told.contains("OVER_LIMIT"), "{told}");
    let health = reqwest::get(format!("http://127.0.0.1:{http}/healthcheck"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn the_intake_image_accepts_a_batch_from_its_exported_root_filesystem() {
    let image = Image::build("operations-intake");
    let config = image.config();
    check_config(
        &config,
        "operations-intake",
        &[3000],
        "/bin/operations-intake",
    );
    let export = image.export();
    let root = rootfs(&export);
    check_minimal(&root, &["operations-intake"]);
    // The image's own keygen writes the client's entry; its /tmp is writable by its user.
    let printed = run_ok(&mut in_image(
        &config,
        &root,
        None,
        &[
            "keygen",
            "--client-id",
            "acme",
            "--append-to",
            "/tmp/keys.yaml",
        ],
        &[],
    ));
    let key = printed
        .lines()
        .find_map(|line| line.trim().strip_prefix("oik_").map(|k| format!("oik_{k}")))
        .unwrap_or_else(|| panic!("keygen printed no key: {printed}"));
    let port = free_port();
    let env = [
        ("HOST", "127.0.0.1".to_owned()),
        ("PORT", port.to_string()),
        ("KAFKA_MOCK_BROKER", "true".to_owned()),
        ("API_KEYS_FILE", "/tmp/keys.yaml".to_owned()),
    ];
    let intake = spawn(
        in_image(&config, &root, None, &[], &env),
        export.path().join("intake.log"),
    );
    wait_for_port(port, "the intake in its image", &intake.log);
    let batch = r#"[{"operation":"buy","unit-cost":10.50,"quantity":2}]"#;
    let answer = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/operations"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(batch)
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let body = answer.text().await.unwrap();
    assert_eq!(status, 202, "{body}");
    let refused = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/operations"))
        .bearer_auth("oik_0000")
        .body(batch)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
}
