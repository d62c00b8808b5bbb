//! Easy mistakes of a first deployment fail loudly: a configuration directory with no
//! rules, a relative RUNTIME_ROOT, a Kubernetes ConfigMap mount, upstream's Redis
//! socket default with a host:port.

use ratelimit_tests::sidecar as support;

use std::time::Duration;

use support::{Options, Server, eventually, limit_of};

const RULES: &str =
    "domain: m\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 3}}]\n";

#[test]
fn a_configuration_directory_without_rules_is_a_warning_naming_it() {
    // A typo in RUNTIME_APPDIRECTORY: the directory does not exist.
    let server = Server::start_with(Options {
        env: vec![("RUNTIME_APPDIRECTORY", "confg".into())],
        ..Options::rules(RULES)
    });
    let log = server.log();
    let expected = server.dir.path().join("current/confg");
    assert!(
        log.contains("level=warn")
            && log.contains("every request will be allowed")
            && log.contains("it does not exist")
            && log.contains(&expected.display().to_string()),
        "{log}"
    );
    // A directory that exists but holds no rule file.
    let server = Server::start_with(Options {
        files: vec![("notes.txt", "not yaml".to_owned())],
        ..Options::default()
    });
    assert!(
        server
            .log()
            .contains("no rate limit domain loaded (it holds no .yaml or .yml file with a domain)"),
        "{}",
        server.log()
    );
    // Rules present: no such warning.
    let server = Server::start(&[("rules.yaml", RULES)]);
    assert!(
        !server.log().contains("every request will be allowed"),
        "{}",
        server.log()
    );
}

#[tokio::test]
async fn a_relative_runtime_root_reloads_on_a_symlink_swap() {
    let server = Server::start_with(Options {
        relative_root: true,
        ..Options::rules(RULES)
    });
    assert_eq!(limit_of(&server, "m", &[("user", "a")]).await, Some(3));
    server.swap_root(
        "v2",
        &[(
            "rules.yaml",
            "domain: m\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 9}}]\n",
        )],
    );
    let reloaded = eventually(Duration::from_secs(10), || async {
        limit_of(&server, "m", &[("user", "a")]).await == Some(9)
    })
    .await;
    assert!(reloaded, "{}", server.log());
}

#[tokio::test]
async fn a_configmap_mount_loads_each_file_once() {
    // What the kubelet mounts: the files in a hidden timestamped directory, `..data`
    // pointing at it, and a link per file through `..data`.
    let server = Server::start_with(Options {
        files: vec![("..2026_11_22_10_00_00.1/rules.yaml", RULES.to_owned())],
        links: vec![
            ("..data".into(), "..2026_11_22_10_00_00.1".into()),
            ("rules.yaml".into(), "..data/rules.yaml".into()),
        ],
        ..Options::default()
    });
    assert_eq!(limit_of(&server, "m", &[("user", "a")]).await, Some(3));
    assert!(!server.log().contains("duplicate"), "{}", server.log());
}

#[test]
fn a_host_and_port_with_the_unix_socket_default_stops_start_up_with_a_hint() {
    let log = Server::refused(Options::with_env(&[
        ("BACKEND_TYPE", "redis"),
        ("REDIS_URL", "127.0.0.1:28379"),
    ]));
    assert!(
        log
            .contains("REDIS_URL '127.0.0.1:28379' looks like host:port, but REDIS_SOCKET_TYPE is unix (the default) and no socket exists at that path: set REDIS_SOCKET_TYPE=tcp"), "{log}");
}
