//! The dashboard and alert rules of `deploy/monitoring/`: `promtool check rules` and
//! `promtool test rules` (a unit test per alert) pass, and a real Prometheus scraping
//! two sidecars (Redis and memory backends) and an intake under load returns series for
//! every query of every dashboard panel; when the sidecar's Redis stops, the backend
//! alert fires. Scrapes and evaluations run every second, and the rules' `for:` waits
//! are cut to one second: the expressions are the shipped ones.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_tests::envoy::repo;
use ratelimit_tests::image::require_tool;
use ratelimit_tests::intake::{Intake, batch};
use ratelimit_tests::prometheus::Prometheus;
use ratelimit_tests::sidecar::{
    Options, Redis, Server, eventually, free_port, redis_env, request, run_ok,
};
use serde_json::Value;

fn monitoring(file: &str) -> std::path::PathBuf {
    repo().join("deploy/monitoring").join(file)
}

fn alert_names() -> BTreeSet<String> {
    let text = std::fs::read_to_string(monitoring("alerts.yaml")).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_alert_rules_check_and_every_alert_passes_its_unit_test() {
    require_tool("promtool", "prometheus");
    run_ok(
        Command::new("promtool")
            .arg("check")
            .arg("rules")
            .arg(monitoring("alerts.yaml")),
    );
    let out = run_ok(
        Command::new("promtool")
            .args(["test", "rules", "alerts.test.yaml"])
            .current_dir(monitoring("")),
    );
    assert!(out.contains("SUCCESS"), "{out}");
    let tests = std::fs::read_to_string(monitoring("alerts.test.yaml")).unwrap();
    let tested: BTreeSet<String> = tests
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- name: "))
        .map(str::to_owned)
        .collect();
    let alerts = alert_names();
    assert_eq!(alerts.len(), 17);
    assert_eq!(tested, alerts, "one unit test per alert, named after it");
}

/// Every query of every panel, with Grafana's `$__rate_interval` as 10 s.
fn panel_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(monitoring("grafana-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            queries.push((
                panel["title"].as_str().unwrap().to_owned(),
                expr.replace("$__rate_interval", "10s"),
            ));
        }
    }
    queries
}

const RULES: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 20}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 5}
";

const INTAKE_LIMITS: &str = "domain: operations
descriptors:
  - key: client_id
    rate_limit: {unit: minute, requests_per_unit: 30}
";

/// A sidecar with Prometheus metrics on a port of its own; its `host:port`.
fn sidecar(env: Vec<(&'static str, String)>) -> (Server, String) {
    let port = free_port();
    let mut options = Options::rules(RULES)
        .set("USE_PROMETHEUS", "true")
        .set("PROMETHEUS_ADDR", &format!("127.0.0.1:{port}"));
    options.env.extend(env);
    (Server::start_with(options), format!("127.0.0.1:{port}"))
}

/// Asks both sidecars and posts to the intake until `stop`: within, near and over the
/// limits, and a replayed idempotency key.
async fn load(grpc: Vec<u16>, intake: String, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::new();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for port in &grpc {
            // Not client_on: a refused connection is part of the run, not a failure.
            let Ok(mut client) =
                RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await
            else {
                continue;
            };
            let user = format!("u{}", round % 3);
            let descriptors: [&[(&str, &str)]; 2] =
                [&[("user", &user)], &[("user", &user), ("path", "/a")]];
            let _ = client
                .should_rate_limit(request("edge", &descriptors))
                .await;
        }
        let _ = http
            .post(format!("{intake}/operations"))
            .header("content-type", "application/json")
            .header("x-client-id", format!("c{}", round % 2))
            .header("idempotency-key", format!("k{}", round / 2))
            .body(batch("buy", 2))
            .send()
            .await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Alert rules as shipped, with every `for:` wait cut to one second.
fn quick_rules() -> String {
    let text = std::fs::read_to_string(monitoring("alerts.yaml")).unwrap();
    text.lines()
        .map(|line| match line.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 1s", &line[..line.len() - line.trim_start().len()]),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn firing(prometheus: &Prometheus, name: &str) -> bool {
    let alerts = prometheus.alerts().await;
    alerts
        .iter()
        .any(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_returns_series_from_prometheus_and_the_backend_alert_fires() {
    let mut redis = Redis::start(&[]);
    let (on_redis, redis_metrics) = sidecar(redis_env(redis.port));
    let (on_memory, memory_metrics) = sidecar(Vec::new());
    let limits = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(limits.path(), INTAKE_LIMITS).unwrap();
    let intake = Intake::start(&[
        ("KAFKA_MOCK_BROKER", "true"),
        ("RATELIMIT_CONFIG", limits.path().to_str().unwrap()),
    ]);
    let intake_address = intake.url("").trim_start_matches("http://").to_owned();
    let prometheus = Prometheus::start(
        &[
            ("ratelimit", vec![redis_metrics, memory_metrics]),
            ("operations-intake", vec![intake_address]),
        ],
        &quick_rules(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let loading = tokio::spawn(load(
        vec![on_redis.grpc, on_memory.grpc],
        intake.url(""),
        stop.clone(),
    ));

    // A rejected rules update, for the panel of loads and rejections.
    on_memory.swap_root(
        "v2",
        &[("rules.yaml", "domain: edge\ndescriptors: [{key: 1\n")],
    );
    for (title, expr) in panel_queries() {
        let answered = eventually(Duration::from_secs(30), || async {
            !prometheus.query(&expr).await.is_empty()
        })
        .await;
        assert!(
            answered,
            "{title}: no series for {expr}\n{}",
            prometheus.log()
        );
    }
    assert!(!firing(&prometheus, "RateLimitBackendErrors").await);

    redis.kill();
    // The two alerts fire in either order: each waits for its own `for`
    // after its own first failing scrape.
    let fired = eventually(Duration::from_secs(30), || async {
        firing(&prometheus, "RateLimitBackendErrors").await
            && firing(&prometheus, "RateLimitBreakerOpen").await
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    loading.await.unwrap();
    assert!(fired, "{:#?}", prometheus.alerts().await);
    let alerting = prometheus.alerts().await;
    let instances: BTreeSet<&str> = alerting
        .iter()
        .filter(|a| a["labels"]["alertname"] == "RateLimitBackendErrors")
        .map(|a| a["labels"]["instance"].as_str().unwrap())
        .collect();
    assert_eq!(
        instances.len(),
        1,
        "only the sidecar on Redis: {alerting:#?}"
    );
}
