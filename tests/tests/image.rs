//! The container images of `deploy/image/`: built with podman from the binaries the
//! tests run (the debug build, which `deploy/image/build.sh` strips: the same code as a
//! release image, built in seconds), then exported and run under `chroot` as the image
//! says (user, entrypoint, environment). The sidecar's runs as the `podman run` line of
//! docs/deploy.md runs it (its mount of the example rules, its environment) and answers
//! as the page says, over gRPC, `/json` and through the `ratelimit-client` inside it;
//! the intake's, built with no `IMAGE_SOURCE` and no git remote, accepts a batch from a
//! client whose key its own `keygen` made.

use std::path::Path;

use ratelimit_tests::envoy::repo;
use ratelimit_tests::image::{Image, TEST_SOURCE, in_image, rootfs, spawn};
use ratelimit_tests::sidecar::{client_on, free_port, request, run_ok};
use ratelimit_tests::wait_for_port;
use serde_json::Value;

/// What both images promise: a numeric non-root user, the ports, the OCI labels (the
/// source label is `source`).
fn check_config(config: &Value, title: &str, ports: &[u16], entrypoint: &str, source: &str) {
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
        ("source", source),
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

/// The `podman run` line of docs/deploy.md.
struct DocumentedRun {
    /// The published ports, `HOST:CONTAINER`.
    ports: Vec<String>,
    /// The one mount: the directory, relative to the repository, and where it is
    /// mounted in the image (read-only).
    mount: (String, String),
    /// The `-e` settings.
    env: Vec<(String, String)>,
    image: String,
}

/// Reads the `podman run` line of docs/deploy.md (its lines joined): `--rm`, `-p`, `-v`
/// and `-e` arguments, then the image.
fn documented_run() -> DocumentedRun {
    let page = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    let start = page
        .find("\npodman run ")
        .expect("docs/deploy.md shows a `podman run` line")
        + 1;
    let end = start + page[start..].find("\n```").unwrap();
    let line = page[start..end].replace("\\\n", " ");
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[..2], ["podman", "run"], "{line}");
    let (arguments, image) = words[2..].split_at(words.len() - 3);
    let mut run = DocumentedRun {
        ports: Vec::new(),
        mount: (String::new(), String::new()),
        env: Vec::new(),
        image: image[0].to_owned(),
    };
    let mut arguments = arguments.iter();
    while let Some(argument) = arguments.next() {
        if *argument == "--rm" {
            continue;
        }
        let value = arguments
            .next()
            .unwrap_or_else(|| panic!("{argument} without a value: {line}"))
            .trim_matches('"');
        match *argument {
            "-p" => run.ports.push(value.to_owned()),
            "-v" => {
                let parts: Vec<&str> = value.split(':').collect();
                assert_eq!(parts.len(), 3, "{value}");
                assert_eq!(parts[2], "ro", "a read-only mount: {value}");
                let host = parts[0].strip_prefix("$PWD/").expect("$PWD/DIR");
                assert!(run.mount.0.is_empty(), "one mount: {line}");
                run.mount = (host.to_owned(), parts[1].to_owned());
            }
            "-e" => {
                let (key, value) = value.split_once('=').unwrap();
                run.env.push((key.to_owned(), value.to_owned()));
            }
            other => panic!("{other}: an argument this test does not read: {line}"),
        }
    }
    run
}

/// The `/json` request of docs/deploy.md, which the example rules answer `OVER_LIMIT`.
const BLOCKED: &str = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.66"}]}]}"#;

#[tokio::test]
async fn the_sidecar_image_runs_as_documented_from_its_exported_root_filesystem() {
    let image = Image::build("ratelimit");
    let config = image.config();
    check_config(
        &config,
        "ratelimit",
        &[6070, 8080, 8081],
        "/bin/ratelimit",
        TEST_SOURCE,
    );
    let export = image.export();
    let root = rootfs(&export);
    check_minimal(
        &root,
        &["ratelimit", "ratelimit-client", "ratelimit-config-check"],
    );

    // The documented run: the image build.sh tags by default, every exposed port
    // published as itself, the example rules where the image reads rules by default.
    let run = documented_run();
    assert_eq!(
        run.image,
        format!("ratelimit:{}", env!("CARGO_PKG_VERSION"))
    );
    let mut published: Vec<String> = run.ports.clone();
    published.sort();
    assert_eq!(published, ["6070:6070", "8080:8080", "8081:8081"]);
    let page = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    assert!(page.contains(BLOCKED), "the page's /json request");
    // The mount, as a volume would lay it out: the documented directory's files, and a
    // rule of the test's own.
    let (host, in_image_path) = &run.mount;
    let rules = root.join(in_image_path.trim_start_matches('/'));
    std::fs::create_dir_all(&rules).unwrap();
    for entry in std::fs::read_dir(repo().join(host)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, rules.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(rules.join("image.yaml"), RULES).unwrap();
    let checked = run_ok(&mut in_image(
        &config,
        &root,
        Some("/bin/ratelimit-config-check"),
        &["-config_dir", in_image_path],
        &[],
    ));
    assert!(checked.contains("image"), "{checked}");

    // The documented settings; only the addresses are the test's (loopback, free ports).
    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    let mut env: Vec<(&str, String)> = run
        .env
        .iter()
        .map(|(key, value)| (key.as_str(), value.clone()))
        .collect();
    env.extend([
        ("HOST", "127.0.0.1".to_owned()),
        ("GRPC_HOST", "127.0.0.1".to_owned()),
        ("DEBUG_HOST", "127.0.0.1".to_owned()),
        ("PORT", http.to_string()),
        ("GRPC_PORT", grpc.to_string()),
        ("DEBUG_PORT", debug.to_string()),
    ]);
    let server = spawn(
        in_image(&config, &root, None, &[], &env),
        export.path().join("ratelimit.log"),
    );
    wait_for_port(grpc, "the sidecar in its image", &server.log);
    wait_for_port(http, "the sidecar in its image", &server.log);
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("every request will be allowed"), "{log}");

    // What the page says it answers: the blocked address is over the limit, on /json
    // with a 429.
    let answer = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{http}/json"))
        .body(BLOCKED)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let body = answer.text().await.unwrap();
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("OVER_LIMIT"), "{body}");
    let rlconfig = reqwest::get(format!("http://127.0.0.1:{debug}/rlconfig"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(rlconfig.contains("edge"), "{rlconfig}");

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
async fn the_intake_image_built_without_a_source_accepts_a_batch_from_its_exported_rootfs() {
    // A checkout with no git remote, and no IMAGE_SOURCE: the build needs no variable,
    // and the source label is empty.
    let image = Image::build_with_source("operations-intake", None);
    let config = image.config();
    check_config(
        &config,
        "operations-intake",
        &[3000],
        "/bin/operations-intake",
        "",
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
