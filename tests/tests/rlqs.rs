//! The Rate Limit Quota Service with real Envoys (`envoy/rlqs.yaml`, two workers each):
//! Envoy enforces the sidecar's assignments itself and reports usage every 5 s, so a
//! limit holds across Envoys within what Envoy lets through before an assignment exists
//! (a bucket's first request) and what is in flight; and a user whose requests are spread
//! within each Envoy's even share of the limit is never denied, on one sidecar or on two
//! replicas sharing Redis.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimit_tests::envoy::{Envoy, start_envoy_workers, upstream};
use ratelimit_tests::sidecar::{Options, Redis, Server, free_port, redis_env};

const LIMIT: u64 = 20;
/// What Envoy may let through beyond its share: the bucket's first request, admitted
/// before any assignment exists, and one in flight.
const SLACK_PER_ENVOY: u64 = 2;

fn rules(limit: u64) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n"
    )
}

fn sidecar(env: Vec<(&'static str, String)>) -> Server {
    sidecar_with(LIMIT, env)
}

fn sidecar_with(limit: u64, env: Vec<(&'static str, String)>) -> Server {
    Server::start_with(Options {
        files: vec![("rules.yaml", rules(limit))],
        env,
        ..Options::default()
    })
}

/// Two replicas on one Redis, each told that there are two.
fn replicas(limit: u64) -> (Redis, Server, Server) {
    let redis = Redis::start(&[]);
    let env = || {
        let mut env = redis_env(redis.port);
        env.push(("BACKEND_FALLBACK_REPLICAS", "2".to_owned()));
        env
    };
    let (one, two) = (sidecar_with(limit, env()), sidecar_with(limit, env()));
    (redis, one, two)
}

/// The light user at 10 a minute: 2 requests over both Envoys, a pause of 1 s,
/// then 4 more, alternating; every answer.
async fn light_user(a: &Envoy, b: &Envoy, user: &str) -> Vec<u16> {
    let mut codes = Vec::new();
    for envoy in [a, b] {
        codes.push(status(envoy.port, user).await);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for envoy in [a, b, a, b] {
        codes.push(status(envoy.port, user).await);
    }
    codes
}

fn envoy(upstream: u16, grpc: u16, expired: &str) -> Envoy {
    let expired = [("EXPIRED_RULE", expired.to_owned())];
    start_envoy_workers("rlqs.yaml", 2, upstream, grpc, false, &expired)
}

/// Two Envoys, on the sidecars at gRPC ports `one` and `two`, denying once an assignment
/// expires.
fn two_envoys(upstream: u16, one: u16, two: u16) -> (Envoy, Envoy) {
    (
        envoy(upstream, one, "DENY_ALL"),
        envoy(upstream, two, "DENY_ALL"),
    )
}

async fn status(port: u16, user: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/"))
        .header("x-user", user)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn minute() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60
}

/// Sends `rounds` requests for `user` to each Envoy in turn, 10 ms apart, and returns
/// how many were admitted in each minute window.
async fn admitted_per_window(envoys: &[&Envoy], user: &str, rounds: usize) -> BTreeMap<u64, u64> {
    let mut admitted = BTreeMap::new();
    for _ in 0..rounds {
        for envoy in envoys {
            let window = minute();
            let code = status(envoy.port, user).await;
            assert!(code == 200 || code == 429, "{code}");
            *admitted.entry(window).or_default() += u64::from(code == 200);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    admitted
}

/// Waits until `user` gets `code` from `envoy`, for at most `within`.
async fn until(envoy: &Envoy, user: &str, code: u16, within: Duration) {
    let deadline = Instant::now() + within;
    while status(envoy.port, user).await != code {
        assert!(Instant::now() < deadline, "{user} never got {code}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each window admits at most the limit plus the slack of each Envoy; a server that gave
/// every Envoy the whole limit would let both admit 20 (40 in a window).
fn assert_shared(admitted: &BTreeMap<u64, u64>, envoys: u64) {
    let bound = LIMIT + SLACK_PER_ENVOY * envoys;
    for (window, n) in admitted {
        assert!(
            *n <= bound,
            "window {window}: {n} admitted, bound {bound}: {admitted:?}"
        );
    }
    let most = admitted.values().max().copied().unwrap_or(0);
    assert!(most >= LIMIT / 2, "the limit is used: {admitted:?}");
}

#[tokio::test]
async fn two_envoys_share_one_limit_and_other_users_are_unaffected() {
    let upstream = upstream().await;
    let sidecar = sidecar(Vec::new());
    let (a, b) = two_envoys(upstream, sidecar.grpc, sidecar.grpc);
    let admitted = admitted_per_window(&[&a, &b], "alice", 40).await;
    assert_shared(&admitted, 2);
    assert_eq!(status(a.port, "bob").await, 200);
    assert_eq!(status(b.port, "bob").await, 200);
    assert!(sidecar.stat("ratelimit.rlqs.streams").await.unwrap() >= 2);
    assert!(
        sidecar
            .stat("ratelimit.service.rate_limit.edge.user.total_hits")
            .await
            .unwrap()
            >= 2
    );
}

/// 6 requests of a limit of 10 over two Envoys are 6 × 200: the second Envoy to see the
/// user finds the first holding the whole limit, which gives back above its even share
/// at once.
#[tokio::test]
async fn a_light_user_spread_over_two_envoys_is_never_denied() {
    let upstream = upstream().await;
    let sidecar = sidecar_with(10, Vec::new());
    let (a, b) = two_envoys(upstream, sidecar.grpc, sidecar.grpc);
    assert_eq!(light_user(&a, &b, "light").await, [200; 6]);
}

/// The same on two replicas sharing Redis: each replica starts its Envoy on an even share
/// of two replicas' Envoys.
#[tokio::test]
async fn a_light_user_spread_over_two_replicas_is_never_denied() {
    let upstream = upstream().await;
    let (_redis, one, two) = replicas(10);
    let (a, b) = two_envoys(upstream, one.grpc, two.grpc);
    assert_eq!(light_user(&a, &b, "light").await, [200; 6]);
}

#[tokio::test]
async fn two_sidecar_replicas_on_one_redis_share_the_limit() {
    let upstream = upstream().await;
    let (_redis, one, two) = replicas(LIMIT);
    let (a, b) = two_envoys(upstream, one.grpc, two.grpc);
    let admitted = admitted_per_window(&[&a, &b], "carol", 40).await;
    assert_shared(&admitted, 2);
}

#[tokio::test]
async fn a_reload_that_lowers_the_limit_takes_effect_within_a_reporting_interval() {
    let upstream = upstream().await;
    let sidecar = Server::start_with(Options {
        files: vec![("rules.yaml", rules(LIMIT))],
        watch_root: true,
        ..Options::default()
    });
    let a = envoy(upstream, sidecar.grpc, "DENY_ALL");
    let start = minute();
    for _ in 0..3 {
        assert_eq!(status(a.port, "dave").await, 200);
    }
    // The shrunk bucket is the new limit less the usage Envoy reported: let a report
    // (every 5 s) carry the three requests first, or the reload cannot count them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reports = || sidecar.stat("ratelimit.rlqs.usage_reports");
    let reported = reports().await.unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(8);
    while reports().await.unwrap_or(0) <= reported {
        assert!(Instant::now() < deadline, "Envoy did not report");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sidecar.swap_root("v2", &[("rules.yaml", &rules(5))]);
    // Once the new rules are in, the next assignment (at Envoy's next report, within 5 s)
    // carries the lowered limit: wait for it rather than for a guessed time, since a
    // loaded machine delays the report.
    let loaded = || sidecar.stat("ratelimit.service.config_load_success");
    let deadline = Instant::now() + Duration::from_secs(10);
    while loaded().await.unwrap_or(0) < 2 {
        assert!(Instant::now() < deadline, "the new rules were not loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let assignments = || sidecar.stat("ratelimit.rlqs.assignments");
    let before = assignments().await.unwrap_or(0);
    while assignments().await.unwrap_or(0) <= before {
        assert!(Instant::now() < deadline, "no assignment after the reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut later = 0;
    for _ in 0..10 {
        later += u64::from(status(a.port, "dave").await == 200);
    }
    if minute() != start {
        return; // a new window began: it allows 5 again
    }
    assert!(
        3 + later <= 5 + SLACK_PER_ENVOY / 2,
        "{later} more admitted after the reload"
    );
}

#[tokio::test]
async fn a_sidecar_restart_makes_envoy_follow_its_expired_behaviour_then_recover() {
    let upstream = upstream().await;
    let grpc = free_port();
    let env = || {
        vec![
            ("GRPC_PORT", grpc.to_string()),
            ("RLQS_ASSIGNMENT_TTL", "2s".to_owned()),
        ]
    };
    let first = sidecar(env());
    let a = envoy(upstream, grpc, "DENY_ALL");
    assert_eq!(status(a.port, "erin").await, 200);
    until(&a, "erin", 200, Duration::from_secs(2)).await;
    // Only a bucket with an assignment can see it expire: one without stays on
    // no_assignment_behavior (ALLOW_ALL). Under load the first assignment can still be on
    // its way when the sidecar is stopped, so wait for it, and for Envoy to take it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while first.stat("ratelimit.rlqs.assignments").await.unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "no assignment was sent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(first);
    // The assignment runs out 2 s later and the bucket falls back to DENY_ALL.
    until(&a, "erin", 429, Duration::from_secs(6)).await;
    let _second = sidecar(env());
    // Envoy reconnects with its next report (every 5 s) and gets a new assignment.
    until(&a, "erin", 200, Duration::from_secs(12)).await;
}
