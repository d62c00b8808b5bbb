//! The live dashboard: its JSON, the page for browsers, and the page itself in headless
//! Chromium (Debian's), which must draw non-empty charts after traffic. The screenshot
//! is kept in target/test-artifacts/dashboard.png.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use ratelimit_tests::sidecar as support;
use serde_json::Value;
use support::{Server, ask, get_text, request};

const RULES: &str = "domain: dash\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 4}\n    descriptors:\n      - key: method\n        value: POST\n        shadow_mode: true\n        rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: open\n";

/// Sends `n` requests for one user, 4 of which fit its hourly limit.
async fn traffic(server: &Server, n: usize) {
    let mut client = server.client().await;
    for _ in 0..n {
        ask(&mut client, "dash", &[&[("user", "carol")]]).await;
    }
}

#[tokio::test]
async fn the_dashboard_data_shows_rules_counters_and_the_nearest_keys() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    traffic(&server, 6).await;
    let json: Value = reqwest::get(server.debug_url("/dashboard.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(json["health"], "ok");
    assert_eq!(json["lastLoad"]["ok"], true);
    assert_eq!(json["lastLoad"]["domains"][0], "dash");
    let rules = json["rules"].as_array().unwrap();
    let shape: Vec<(u64, &str, &str)> = rules
        .iter()
        .map(|r| {
            (
                r["depth"].as_u64().unwrap(),
                r["key"].as_str().unwrap(),
                r["limit"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (0, "user", "4/HOUR"),
            (1, "method", "100/MINUTE"),
            (0, "open", "")
        ]
    );
    assert_eq!(rules[1]["shadow"], true);
    assert_eq!(json["stats"]["dash.user"]["total_hits"], 6);
    assert_eq!(json["stats"]["dash.user"]["over_limit"], 2);
    let nearest = &json["nearest"][0];
    assert!(
        nearest["key"]
            .as_str()
            .unwrap()
            .starts_with("dash_user_carol_"),
        "{json}"
    );
    assert_eq!(
        (nearest["count"].as_u64(), nearest["limit"].as_u64()),
        (Some(6), Some(4))
    );

    let client = reqwest::Client::new();
    let page = client
        .get(server.debug_url("/"))
        .header("accept", "text/html,application/xhtml+xml")
        .send()
        .await
        .unwrap();
    assert!(
        page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(page.text().await.unwrap().contains("dashboard.json"));
    let list = get_text(&server.debug_url("/")).await;
    assert!(
        list.contains("/rlconfig:"),
        "scripts still get the list: {list}"
    );
}

fn chromium() -> String {
    let found = ["chromium", "chromium-browser"].into_iter().find(|name| {
        Command::new("which")
            .arg(name)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    found
        .expect(
            "chromium is not installed: run the tests through scripts/test.sh, which installs it",
        )
        .to_owned()
}

fn headless(server: &Server, extra: &[&str]) -> std::process::Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1100,800",
        ])
        .arg("--virtual-time-budget=6000")
        .args(extra)
        .arg(server.debug_url("/"))
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn chromium_draws_the_charts_after_traffic() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    traffic(&server, 3).await;
    // Traffic goes on while the page polls, so its rates are not all zero.
    let busy = tokio::spawn({
        let grpc = server.grpc;
        async move {
            let url = format!("http://127.0.0.1:{grpc}");
            let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(url).await.unwrap();
            for _ in 0..400 {
                let _ = client
                    .should_rate_limit(request("dash", &[&[("user", "dave")]]))
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let server_ref = &server;
    let dom = tokio::task::block_in_place(|| headless(server_ref, &["--dump-dom"]));
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(dom.contains("data-rule=\"dash.user\""), "{dom}");
    let drawn = dom
        .split("data-max=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max);
    assert!(drawn > 0.0, "every chart is flat: {dom}");
    assert!(
        dom.contains("4/HOUR") && dom.contains("shadow mode"),
        "the rule tree: {dom}"
    );

    let artifacts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let screenshot = format!("--screenshot={}", shot.display());
    tokio::task::block_in_place(|| headless(server_ref, &[&screenshot]));
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "no screenshot at {}", shot.display());
    busy.abort();
}
