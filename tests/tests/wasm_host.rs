//! The built proxy-wasm filter (`WASM_FILTER`) in a test host on wasmtime: what a real
//! Envoy cannot show deterministically — two workers racing on shared data, a clock the
//! test moves, the shared-data footprint, each callout to a real sidecar — and the
//! instructions one request costs.

mod proxy_wasm_host;
use ratelimit_tests::sidecar as support;

use std::path::PathBuf;

use proxy_wasm_host::{Outcome, Plugin, Worker};
use support::Server;

/// 2026-01-01T00:00:00Z: a minute boundary.
const T0: u64 = 1_767_225_600;

fn plugin() -> Plugin {
    let path = PathBuf::from(
        std::env::var("WASM_FILTER")
            .expect("WASM_FILTER must name the built filter: run scripts/test.sh"),
    );
    let plugin = Plugin::load(&path);
    plugin.set_time(T0);
    plugin
}

/// The plugin, and one worker configured with [`RULES`].
fn on_rules() -> (Plugin, Worker) {
    let plugin = plugin();
    let worker = plugin.worker(&configuration(RULES, "")).unwrap();
    (plugin, worker)
}

/// A request from [`PEER`] by `user` (the `x-user` header).
fn as_user(worker: &mut Worker, user: &str) -> Outcome {
    worker.request(&[("x-user", user)], PEER)
}

/// A filter configuration with `rules` (YAML for domain `edge`) and extra JSON fields.
fn configuration(rules: &str, extra: &str) -> String {
    let rules = serde_json::to_string(rules).unwrap();
    format!(
        r#"{{"domain":"edge","rules":{rules},
            "descriptors":[
              [{{"request_headers":{{"header_name":"x-user","descriptor_key":"user"}}}}],
              [{{"generic_key":{{"descriptor_value":"all"}}}},{{"remote_address":{{}}}}]
            ],
            "response_headers":true{extra}}}"#
    )
}

const RULES: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: generic_key
    value: all
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 5}
";

const PEER: &str = "10.0.0.1:5555";

#[test]
fn a_bad_configuration_is_refused_with_the_sidecars_error() {
    let plugin = plugin();
    let bad_rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n";
    let Err(log) = plugin.worker(&configuration(bad_rules, "")) else {
        panic!("a bad unit was accepted");
    };
    let expected = ratelimit_core::Config::from_yaml("rules", bad_rules)
        .unwrap_err()
        .kind
        .to_string();
    assert!(log.contains(&expected), "{log}\nexpected: {expected}");
    assert!(plugin.worker("{not json").is_err());
    assert!(plugin.worker(&configuration(RULES, "")).is_ok());
}

#[test]
fn header_descriptors_answer_429_locally_with_headers() {
    let (_plugin, mut worker) = on_rules();
    for remaining in ["2", "1", "0"] {
        let Outcome::Passed(headers) = as_user(&mut worker, "alice") else {
            panic!("within the limit");
        };
        let value = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(value("ratelimit-limit"), Some("3"));
        assert_eq!(value("ratelimit-remaining"), Some(remaining));
        assert_eq!(value("ratelimit-reset"), Some("60"));
    }
    let outcome = as_user(&mut worker, "alice");
    let response = outcome.local().expect("answered by the filter");
    assert_eq!(response.status, 429);
    assert_eq!(response.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(response.header("ratelimit-limit"), Some("3"));
    assert_eq!(response.header("ratelimit-remaining"), Some("0"));
    assert_eq!(response.body, b"Too Many Requests\n");
    assert_eq!(
        as_user(&mut worker, "bob").status(),
        200,
        "bob has his own counter"
    );
}

#[test]
fn buckets_and_sliding_windows_run_in_the_filter_with_draft_11_headers() {
    let plugin = plugin();
    let rules = "domain: edge
descriptors:
  - key: user
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 2}
      - {name: minute, unit: minute, requests_per_unit: 4, algorithm: sliding_window}
";
    let config = configuration(rules, r#","response_headers_format":"ietf-draft-11""#);
    let mut worker = plugin.worker(&config).unwrap();
    let mut send = |time: u64| {
        plugin.set_time(time);
        match as_user(&mut worker, "dana") {
            Outcome::Passed(headers) => {
                let value = |name: &str| {
                    headers
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.clone())
                };
                (200, value("ratelimit"), value("ratelimit-policy"))
            }
            Outcome::Local(response) => (
                response.status,
                response.header("ratelimit").map(str::to_owned),
                response.header("ratelimit-policy").map(str::to_owned),
            ),
        }
    };
    let policy = Some(r#""burst";q=1;w=1, "minute";q=4;w=60"#.to_owned());
    let answer = |status, current: &str| (status, Some(current.to_owned()), policy.clone());
    assert_eq!(send(T0), answer(200, r#""burst";r=1;t=0"#));
    assert_eq!(send(T0), answer(200, r#""burst";r=0;t=1"#));
    assert_eq!(
        send(T0),
        answer(429, r#""burst";r=0;t=1"#),
        "the bucket is empty"
    );
    // One token a second later; the sliding window counted the refused hit too.
    assert_eq!(send(T0 + 1), answer(200, r#""burst";r=0;t=1"#));
    // 5 of 4 this minute: one more fits once 5 × (time left) / 60 s <= 3 in the next
    // minute, 24 s into it: 58 + 24 s from now.
    assert_eq!(send(T0 + 2), answer(429, r#""minute";r=0;t=82"#));
}

#[test]
fn address_and_generic_key_descriptors_count_per_peer() {
    let (_plugin, mut worker) = on_rules();
    let statuses: Vec<u32> = (0..6).map(|_| worker.request(&[], PEER).status()).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert_eq!(
        worker.request(&[], "10.0.0.2:1").status(),
        200,
        "another address"
    );
    // Envoy's remote_address is the first x-forwarded-for hop when there is one.
    let forwarded = worker.request(&[("x-forwarded-for", "10.0.0.3, 10.0.0.1")], PEER);
    assert_eq!(forwarded.status(), 200);
}

#[test]
fn the_window_rolls_over_with_the_clock() {
    let (plugin, mut worker) = on_rules();
    for _ in 0..3 {
        assert_eq!(as_user(&mut worker, "carol").status(), 200);
    }
    plugin.set_time(T0 + 59);
    let over = as_user(&mut worker, "carol");
    assert_eq!(over.local().unwrap().header("ratelimit-reset"), Some("1"));
    plugin.set_time(T0 + 60);
    assert_eq!(as_user(&mut worker, "carol").status(), 200, "a new window");
}

#[test]
fn two_workers_never_admit_more_than_the_limit() {
    let plugin = plugin();
    let limit = 50;
    let rules = format!(
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n"
    );
    let config = configuration(&rules, "");
    let workers = [
        plugin.worker(&config).unwrap(),
        plugin.worker(&config).unwrap(),
    ];
    let admitted: Vec<usize> = std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|mut worker| {
                scope.spawn(move || {
                    (0..80)
                        .filter(|_| as_user(&mut worker, "dave").status() == 200)
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total: usize = admitted.iter().sum();
    // A never-used slot's first write cannot be compare-and-swapped (README), so one hit
    // can be lost in a race on the very first request; never more than the limit.
    assert!(total <= limit + 1, "admitted {admitted:?}");
    assert!(total >= limit, "admitted {admitted:?}");
    assert!(
        admitted.iter().all(|&n| n > 0),
        "both workers took part: {admitted:?}"
    );
}

#[test]
fn shared_data_stays_bounded_as_windows_and_keys_change() {
    let plugin = plugin();
    let config = configuration(RULES, r#","shared_slots":64"#);
    let mut worker = plugin.worker(&config).unwrap();
    for window in 0..10 {
        plugin.set_time(T0 + 60 * window);
        for user in 0..40 {
            let (user, peer) = (
                format!("user-{window}-{user}"),
                format!("10.1.{window}.{user}:1"),
            );
            assert_eq!(worker.request(&[("x-user", &user)], &peer).status(), 200);
        }
    }
    assert!(
        plugin.shared.data_len() <= 64,
        "{} entries",
        plugin.shared.data_len()
    );
    let bytes = plugin.shared.data_bytes();
    assert!(bytes < 64 * 256, "{bytes} bytes of shared data");
    // In a new window, a reused slot counts from zero for its new key.
    plugin.set_time(T0 + 600);
    for _ in 0..3 {
        assert_eq!(as_user(&mut worker, "erin").status(), 200);
    }
    assert_eq!(as_user(&mut worker, "erin").status(), 429);
}

#[test]
fn statistics_are_exported_as_metrics_on_the_tick() {
    let (plugin, mut worker) = on_rules();
    assert_eq!(worker.host().tick_period_ms, 1000);
    for _ in 0..4 {
        as_user(&mut worker, "frank");
    }
    worker.tick();
    assert_eq!(
        plugin.shared.metric("ratelimit_wasm.edge.user.total_hits"),
        Some(4)
    );
    assert_eq!(
        plugin.shared.metric("ratelimit_wasm.edge.user.over_limit"),
        Some(1)
    );
    as_user(&mut worker, "frank");
    worker.tick();
    assert_eq!(
        plugin.shared.metric("ratelimit_wasm.edge.user.total_hits"),
        Some(5),
        "deltas, not totals, are added"
    );
}

const GLOBAL_RULES: &str = "domain: fleet
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";

#[test]
fn the_global_tier_is_answered_by_a_real_sidecar() {
    let sidecar = Server::start(&[("fleet.yaml", GLOBAL_RULES)]);
    let mut plugin = plugin();
    plugin.upstream("ratelimit", &format!("http://127.0.0.1:{}", sidecar.grpc));
    let global = r#","global":{"cluster":"ratelimit","timeout_ms":2000,"domain":"fleet"}"#;
    let mut worker = plugin.worker(&configuration(RULES, global)).unwrap();
    // Local limit 3, fleet limit 2: the third request is refused by the sidecar.
    assert_eq!(as_user(&mut worker, "gina").status(), 200);
    assert_eq!(as_user(&mut worker, "gina").status(), 200);
    let third = as_user(&mut worker, "gina");
    let response = third.local().expect("the sidecar said over limit");
    assert_eq!(response.status, 429);
    assert_eq!(response.header("x-envoy-ratelimited"), Some("true"));
    // The fourth is over the local limit: refused without asking the sidecar, whose
    // counter therefore stays at 3.
    assert_eq!(as_user(&mut worker, "gina").status(), 429);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let hits = runtime.block_on(sidecar.stat("ratelimit.service.rate_limit.fleet.user.total_hits"));
    assert_eq!(hits, Some(3));
}

/// With `report_interval_ms`, workers decide from the service's last reports plus their
/// own unreported hits, with no callout per request, and each tick reports their hits.
#[test]
fn reporting_workers_decide_without_a_callout_and_share_the_fleet_count() {
    let fleet = "domain: fleet\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let sidecar = Server::start(&[("fleet.yaml", fleet)]);
    let mut plugin = plugin();
    plugin.upstream("ratelimit", &format!("http://127.0.0.1:{}", sidecar.grpc));
    let local = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    let global = r#","global":{"cluster":"ratelimit","timeout_ms":2000,"domain":"fleet","report_interval_ms":100}"#;
    let mut a = plugin.worker(&configuration(local, global)).unwrap();
    let mut b = plugin.worker(&configuration(local, global)).unwrap();
    for _ in 0..3 {
        assert_eq!(as_user(&mut a, "ivy").status(), 200);
    }
    assert_eq!(a.waiting_callouts(), 0, "no callout per request");
    // A reports its 3; B then sees the fleet at 3 of 5, and its own 2 more fill it.
    a.tick();
    assert_eq!(as_user(&mut b, "ivy").status(), 200);
    assert_eq!(as_user(&mut b, "ivy").status(), 200);
    let refused = as_user(&mut b, "ivy");
    assert_eq!(refused.status(), 429);
    assert_eq!(
        refused.local().unwrap().header("x-envoy-ratelimited"),
        Some("true")
    );
    b.tick();
    assert_eq!(as_user(&mut a, "ivy").status(), 429, "B's report reached A");
    assert_eq!(
        as_user(&mut a, "jo").status(),
        200,
        "another user's count is its own"
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let stat = "ratelimit.service.rate_limit.fleet.user.total_hits";
    assert_eq!(
        runtime.block_on(sidecar.stat(stat)),
        Some(5),
        "admitted hits, reported once"
    );
}

#[test]
fn a_sidecar_outage_follows_the_failure_mode() {
    let sidecar = Server::start(&[("fleet.yaml", GLOBAL_RULES)]);
    let mut plugin = plugin();
    plugin.upstream("ratelimit", &format!("http://127.0.0.1:{}", sidecar.grpc));
    drop(sidecar);
    let open = r#","global":{"cluster":"ratelimit","timeout_ms":500,"domain":"fleet"}"#;
    let mut worker = plugin.worker(&configuration(RULES, open)).unwrap();
    assert_eq!(as_user(&mut worker, "hank").status(), 200, "fail open");
    let closed = r#","failure_mode_deny":true,"global":{"cluster":"ratelimit","timeout_ms":500,"domain":"fleet"}"#;
    let mut worker = plugin.worker(&configuration(RULES, closed)).unwrap();
    assert_eq!(as_user(&mut worker, "hank").status(), 500, "fail closed");
}

/// The cost of one request in the filter, in wasmtime fuel (about one unit per wasm
/// instruction), printed for the benchmark notes; the bound only catches a regression
/// by an order of magnitude.
#[test]
fn cost_per_request_in_instructions() {
    let (_plugin, mut worker) = on_rules();
    let mut costs = Vec::new();
    for i in 0..200 {
        let user = format!("user-{}", i % 20);
        let (_, fuel) = worker.request_metered(&[("x-user", &user)], PEER);
        costs.push(fuel);
    }
    costs.sort_unstable();
    let median = costs[costs.len() / 2];
    println!(
        "on_http_request_headers: median {median} fuel, max {}",
        costs[costs.len() - 1]
    );
    assert!(median > 1_000, "the filter did its work: {median}");
    assert!(median < 1_000_000, "median {median} fuel per request");
}
