//! A real Envoy (two workers) in front of a loopback upstream, started with the files of
//! `envoy/`: asking the real sidecar (`sidecar.yaml`), running the wasm filter alone
//! (`wasm.yaml`), the filter with the sidecar as its global tier (`wasm-global.yaml`),
//! and routes that charge and refund (`refunds.yaml`). `ENVOY_BIN` names the Envoy binary and `WASM_FILTER` the built
//! filter (scripts/test.sh provides both).

use ratelimit_tests::sf_list;
use ratelimit_tests::sidecar as support;

use std::time::{Duration, Instant};

use ratelimit_tests::envoy::{
    Envoy, repo, start_envoy, start_envoy_on, start_envoy_with, upstream,
};
use ratelimit_tests::pki::{CLIENT_NAME, temp_pki};
use support::{Options, Server, get_text};

/// A sidecar on the example's rules (`envoy/rules.yaml`) with the response headers on.
fn sidecar() -> Server {
    sidecar_with(vec![("LIMIT_RESPONSE_HEADERS_ENABLED", "true".into())])
}

/// A sidecar on the example's rules with the settings `env`.
fn sidecar_with(env: Vec<(&'static str, String)>) -> Server {
    let rules = std::fs::read_to_string(repo().join("envoy/rules.yaml")).unwrap();
    Server::start_with(Options {
        env,
        ..Options::rules(&rules)
    })
}

async fn get(port: u16, path: &str, user: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(format!("http://127.0.0.1:{port}{path}"));
    if let Some(user) = user {
        request = request.header("x-user", user);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn envoy_enforces_the_sidecars_decisions_and_passes_its_headers() {
    let upstream = upstream().await;
    let sidecar = sidecar();
    let envoy = start_envoy(upstream, sidecar.grpc, false);
    for remaining in ["2", "1", "0"] {
        let r = get(envoy.port, "/", Some("alice")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["ratelimit-limit"], "3");
        assert_eq!(r.headers()["ratelimit-remaining"], remaining);
        assert!(r.headers().contains_key("ratelimit-reset"));
        assert_eq!(r.text().await.unwrap(), "upstream");
    }
    let over = get(envoy.port, "/", Some("alice")).await;
    assert_eq!(over.status(), 429);
    assert_eq!(over.headers()["x-envoy-ratelimited"], "true");
    assert_eq!(
        get(envoy.port, "/", Some("bob")).await.status(),
        200,
        "counters are per user"
    );
    assert_eq!(
        get(envoy.port, "/", None).await.status(),
        200,
        "no header, no descriptor"
    );
    // Nested wildcard rule: (generic_key=api, path=/slow/*), one counter per path.
    assert_eq!(get(envoy.port, "/slow/a", None).await.status(), 200);
    assert_eq!(get(envoy.port, "/slow/a", None).await.status(), 429);
    assert_eq!(get(envoy.port, "/slow/b", None).await.status(), 200);
}

#[tokio::test]
async fn envoy_passes_the_draft_11_headers() {
    let upstream = upstream().await;
    let sidecar = sidecar_with(vec![
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true".into()),
        ("LIMIT_RESPONSE_HEADERS_FORMAT", "ietf-draft-11".into()),
    ]);
    let envoy = start_envoy(upstream, sidecar.grpc, false);
    let policy = |q: i64| {
        vec![(
            "edge.user".to_owned(),
            vec![("q".to_owned(), q), ("w".to_owned(), 60)],
        )]
    };
    for remaining in [2, 1, 0] {
        let r = get(envoy.port, "/", Some("carol")).await;
        assert_eq!(r.status(), 200);
        assert!(!r.headers().contains_key("ratelimit-limit"));
        assert_eq!(
            sf_list(r.headers()["ratelimit-policy"].to_str().unwrap()),
            policy(3)
        );
        let current = sf_list(r.headers()["ratelimit"].to_str().unwrap());
        assert_eq!(current[0].0, "edge.user");
        assert_eq!(current[0].1[0], ("r".to_owned(), remaining));
        let reset = current[0].1[1].1;
        assert!((1..=60).contains(&reset), "t={reset}");
    }
    let over = get(envoy.port, "/", Some("carol")).await;
    assert_eq!(over.status(), 429);
    let current = sf_list(over.headers()["ratelimit"].to_str().unwrap());
    assert_eq!(current[0].1[0], ("r".to_owned(), 0));
}

#[tokio::test]
async fn envoy_asks_the_sidecar_over_mutual_tls() {
    let pki = temp_pki();
    let file = |name: &str| pki.path().join(name).display().to_string();
    let upstream = upstream().await;
    let sidecar = sidecar_with(vec![
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", file("server.crt")),
        ("GRPC_SERVER_TLS_KEY", file("server.key")),
        ("GRPC_CLIENT_TLS_CACERT", file("ca.crt")),
        ("GRPC_CLIENT_TLS_SAN", CLIENT_NAME.into()),
    ]);
    let tls_dir = pki.path().display().to_string();
    // failure_mode_deny: a handshake that failed would answer 500, never 200 or 429.
    let envoy = start_envoy_with(
        "sidecar-mtls.yaml",
        upstream,
        sidecar.grpc,
        true,
        &[("TLS_DIR", tls_dir)],
    );
    let statuses = [
        get(envoy.port, "/", Some("carol")).await.status(),
        get(envoy.port, "/", Some("carol")).await.status(),
        get(envoy.port, "/", Some("carol")).await.status(),
        get(envoy.port, "/", Some("carol")).await.status(),
    ];
    assert_eq!(statuses, [200, 200, 200, 429]);
}

/// Stops the sidecar: the proxy that fails open lets `user` through, the one that fails
/// closed answers 500.
async fn fails_open_and_closed(sidecar: &mut Server, open: &Envoy, closed: &Envoy, user: &str) {
    sidecar.signal("TERM");
    sidecar
        .wait_exit(Duration::from_secs(15))
        .expect("sidecar stops");
    let status = |envoy: &Envoy| get(envoy.port, "/", Some(user));
    assert_eq!(status(open).await.status(), 200, "fail open");
    assert_eq!(status(closed).await.status(), 500, "fail closed");
}

#[tokio::test]
async fn a_sidecar_outage_follows_failure_mode_deny() {
    let upstream = upstream().await;
    let mut sidecar = sidecar();
    let open = start_envoy(upstream, sidecar.grpc, false);
    let closed = start_envoy(upstream, sidecar.grpc, true);
    assert_eq!(get(closed.port, "/", Some("carol")).await.status(), 200);
    fails_open_and_closed(&mut sidecar, &open, &closed, "carol").await;
}

#[tokio::test]
async fn the_wasm_filter_asks_the_sidecar_as_its_global_tier() {
    let upstream = upstream().await;
    let mut sidecar = sidecar();
    let open = start_envoy_on("wasm-global.yaml", upstream, sidecar.grpc, false);
    let closed = start_envoy_on("wasm-global.yaml", upstream, sidecar.grpc, true);
    // The local limit is 100/minute; the sidecar's 3/minute decides, across both proxies.
    for port in [open.port, open.port, closed.port] {
        assert_eq!(get(port, "/", Some("dave")).await.status(), 200);
    }
    let over = get(closed.port, "/", Some("dave")).await;
    assert_eq!(over.status(), 429);
    assert_eq!(over.headers()["x-envoy-ratelimited"], "true");
    assert_eq!(
        over.headers()["ratelimit-limit"],
        "3",
        "the sidecar's headers come along"
    );
    assert_eq!(get(open.port, "/", Some("dave")).await.status(), 429);
    assert_eq!(get(open.port, "/", Some("erin")).await.status(), 200);
    assert_eq!(
        sidecar
            .stat("ratelimit.service.rate_limit.edge.user.total_hits")
            .await,
        Some(6)
    );

    fails_open_and_closed(&mut sidecar, &open, &closed, "frank").await;
}

#[tokio::test]
async fn the_wasm_filter_limits_locally_across_worker_threads() {
    let upstream = upstream().await;
    let envoy = start_envoy_on("wasm.yaml", upstream, 0, false);
    let url = format!("http://127.0.0.1:{}/", envoy.port);
    // A new connection per request spreads requests over Envoy's two workers; the
    // counters live in shared data, so the limit holds across them.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let r = client
            .get(&url)
            .header("x-user", "alice")
            .send()
            .await
            .unwrap();
        let remaining = r
            .headers()
            .get("ratelimit-remaining")
            .map(|v| v.to_str().unwrap().to_owned());
        let limited = r.headers().get("x-envoy-ratelimited").is_some();
        statuses.push((r.status().as_u16(), remaining, limited));
    }
    assert_eq!(statuses[0], (200, Some("2".into()), false), "{statuses:?}");
    assert_eq!(statuses[2], (200, Some("0".into()), false), "{statuses:?}");
    assert_eq!(statuses[3], (429, Some("0".into()), true), "{statuses:?}");
    assert_eq!(statuses[4].0, 429);
    let bob = reqwest::get(&url).await.unwrap();
    assert_eq!(
        bob.status(),
        200,
        "no x-user header: only the per-address descriptor applies"
    );
    assert_eq!(bob.headers()["ratelimit-limit"], "100");
    assert_eq!(bob.text().await.unwrap(), "upstream");

    // Each worker exports its counts every second; Envoy sums them.
    let stats_url = format!(
        "http://127.0.0.1:{}/stats?filter=ratelimit_wasm",
        envoy.admin
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = get_text(&stats_url).await;
        let value = |name: &str| {
            stats
                .lines()
                .find_map(|l| l.trim().split_once(": ").filter(|(n, _)| n.ends_with(name)))
                .and_then(|(_, v)| v.parse::<u64>().ok())
        };
        if value("ratelimit_wasm.edge.user.total_hits") == Some(5) {
            assert_eq!(
                value("ratelimit_wasm.edge.user.over_limit"),
                Some(2),
                "{stats}"
            );
            assert_eq!(
                value("ratelimit_wasm.edge.user.within_limit"),
                Some(3),
                "{stats}"
            );
            assert_eq!(
                value("ratelimit_wasm.edge.generic_key_all.remote_address.total_hits"),
                Some(6),
                "{stats}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never reached 5 hits:\n{stats}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `envoy/refunds.yaml`: a route whose rate-limit action sets `is_negative_hits` gives
/// back what another route charged.
#[tokio::test]
async fn a_refund_route_gives_back_what_the_charge_route_spent() {
    let upstream = upstream().await;
    let rules = std::fs::read_to_string(repo().join("envoy/refunds-rules.yaml")).unwrap();
    let sidecar = Server::start_with(Options {
        files: vec![("rules.yaml", rules)],
        ..Options::default()
    });
    let envoy = start_envoy_on("refunds.yaml", upstream, sidecar.grpc, false);
    let status = |path: &'static str| async move {
        get(envoy.port, path, Some("carol")).await.status().as_u16()
    };
    // 5 a minute, 2 per charge: 2, 4, then 6 is over.
    assert_eq!(status("/charge").await, 200);
    assert_eq!(status("/charge").await, 200);
    assert_eq!(status("/charge").await, 429);
    // Two refunds take the counter from 6 back to 2, so one more charge fits.
    assert_eq!(status("/refund").await, 200);
    assert_eq!(status("/refund").await, 200);
    assert_eq!(status("/charge").await, 200, "the refunds were taken off");
    assert_eq!(status("/charge").await, 429);
    assert_eq!(
        sidecar
            .stat("ratelimit.service.rate_limit.tokens.user.total_negative_hits")
            .await,
        Some(4)
    );
}
