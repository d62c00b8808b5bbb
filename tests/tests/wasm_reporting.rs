//! The proxy-wasm filter's global tier in reporting mode (`report_interval_ms`) through
//! two real Envoys with two workers each and one sidecar: no request waits for a
//! callout, and the fleet admits at least the limit and at most the limit plus what it
//! admitted within 2T + D (T the report interval, D a report's round trip), each admitted
//! hit reported once.

use std::time::{Duration, Instant};

use ratelimit_tests::envoy::{repo, start_envoy_workers, upstream};
use ratelimit_tests::sidecar::{Options, Server, eventually};
use ratelimit_tests::{most_within, within_one_minute};

/// The report interval, in milliseconds.
const REPORT_MS: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_share_one_limit_within_the_written_bound() {
    // One minute window for the whole run.
    within_one_minute(10).await;
    let upstream = upstream().await;
    // envoy/rules.yaml: 3 requests a minute per user.
    let rules = std::fs::read_to_string(repo().join("envoy/rules.yaml")).unwrap();
    let sidecar = Server::start_with(Options::rules(&rules));
    let reporting = [(
        "GLOBAL_OPTIONS",
        format!(r#", "report_interval_ms": {REPORT_MS}"#),
    )];
    let proxies: Vec<_> = (0..2)
        .map(|_| {
            start_envoy_workers(
                "wasm-global.yaml",
                2,
                upstream,
                sidecar.grpc,
                false,
                &reporting,
            )
        })
        .collect();
    let since = Instant::now();
    let (mut admitted, mut statuses) = (Vec::new(), Vec::new());
    for i in 0..80 {
        // A new connection each time spreads the requests over both proxies' workers.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let url = format!("http://127.0.0.1:{}/", proxies[i % 2].port);
        let status = client
            .get(url)
            .header("x-user", "kim")
            .send()
            .await
            .unwrap()
            .status();
        if status == 200 {
            admitted.push(since.elapsed().as_millis() as u64);
        }
        statuses.push(status.as_u16());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // D: a report's round trip, at most the filter's 500 ms timeout.
    let bound = 3 + most_within(&admitted, 2 * REPORT_MS + 500);
    assert!(admitted.len() >= 3, "{statuses:?}");
    assert!(
        admitted.len() <= bound,
        "{} > {bound}: {statuses:?}",
        admitted.len()
    );
    assert!(
        statuses[60..].iter().all(|&s| s == 429),
        "once reported, the fleet's count refuses on every worker: {statuses:?}"
    );
    eprintln!(
        "{} admitted of 80 against a limit of 3, bound {bound}",
        admitted.len()
    );
    let stat = "ratelimit.service.rate_limit.edge.user.total_hits";
    let reported = eventually(Duration::from_secs(3), || async {
        sidecar.stat(stat).await == Some(admitted.len() as u64)
    })
    .await;
    assert!(
        reported,
        "{:?} reported, {} admitted",
        sidecar.stat(stat).await,
        admitted.len()
    );
}
