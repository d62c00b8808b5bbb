//! The intake and the ratelimit sidecar together: limits shared by replicas through a
//! real sidecar, the sidecar's outage under each failure mode, and a sidecar that does
//! not know the intake's domain.

use ratelimit_tests::intake::{Intake, batch, mock_with_topic, post};
use ratelimit_tests::sidecar::Server;
use ratelimit_tests::{binary, free_port};

const SIDECAR_RULES: &str = "domain: operations\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

/// A sidecar on `rules`, and the URL of its gRPC listener.
fn sidecar(rules: &str) -> (Server, String) {
    let sidecar = Server::start(&[("rules.yaml", rules)]);
    let url = format!("http://127.0.0.1:{}", sidecar.grpc);
    (sidecar, url)
}

/// An intake producing to topic `ops` of the broker at `bootstrap` and asking the sidecar
/// at `url`, with `extra` settings.
fn intake(bootstrap: &str, url: &str, extra: &[(&str, &str)]) -> Intake {
    let mut env = vec![
        ("KAFKA_BOOTSTRAP_SERVERS", bootstrap),
        ("KAFKA_TOPIC", "ops"),
        ("RATELIMIT_GRPC_URL", url),
    ];
    env.extend_from_slice(extra);
    Intake::start(&env)
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_limits_are_shared_through_the_sidecar() {
    let mock = mock_with_topic("ops");
    let bootstrap = mock.bootstrap_servers();
    let (_sidecar, url) = sidecar(SIDECAR_RULES);
    let replicas = [intake(&bootstrap, &url, &[]), intake(&bootstrap, &url, &[])];
    let first = post(&replicas[0], &batch("buy", 3), &[("x-client-id", "z")]).await;
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(first.header("ratelimit-remaining"), Some("2"));
    let second = post(&replicas[1], &batch("buy", 3), &[("x-client-id", "z")]).await;
    assert_eq!(
        second.status, 429,
        "the other replica sees the same counter: {}",
        second.body
    );
    assert_eq!(second.header("ratelimit-limit"), Some("5"));
    assert!(second.header("retry-after").is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sidecar_outage_follows_the_failure_mode() {
    let mock = mock_with_topic("ops");
    let bootstrap = mock.bootstrap_servers();
    let (sidecar, url) = sidecar(SIDECAR_RULES);
    drop(sidecar);
    let open = intake(&bootstrap, &url, &[]);
    let allowed = post(&open, &batch("buy", 1), &[]).await;
    assert_eq!(
        allowed.status, 202,
        "fail open by default: {}",
        allowed.body
    );

    let closed = intake(&bootstrap, &url, &[("RATELIMIT_FAILURE_MODE_DENY", "true")]);
    let refused = post(&closed, &batch("buy", 1), &[]).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    let message = refused.body["message"].as_str().unwrap();
    assert!(message.contains("rate-limit service"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sidecar_without_the_domain_stops_start_up_unless_allowed() {
    let elsewhere = SIDECAR_RULES.replace("domain: operations", "domain: elsewhere");
    let (_sidecar, url) = sidecar(&elsewhere);
    let output = std::process::Command::new(binary("operations-intake"))
        .env_clear()
        .env("PORT", free_port().to_string())
        .env("AUTH", "none")
        .env("RATELIMIT_GRPC_URL", &url)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started: {stderr}");
    for expected in [
        "has no limit for a client in domain `operations`",
        "RATELIMIT_ALLOW_UNKNOWN_DOMAIN=true",
    ] {
        assert!(stderr.contains(expected), "{stderr}");
    }
    // The operator may opt in: the service starts and lets batches through.
    let mock = mock_with_topic("ops");
    let bootstrap = mock.bootstrap_servers();
    let allowing = intake(
        &bootstrap,
        &url,
        &[("RATELIMIT_ALLOW_UNKNOWN_DOMAIN", "true")],
    );
    let allowed = post(&allowing, &batch("buy", 1), &[]).await;
    assert_eq!(allowed.status, 202, "{}", allowed.body);
}
