//! `POST /explain` on the debug server and `ratelimit-client -explain`: why a request
//! would get its answer, on both backends, without counting it.

use ratelimit_tests::on_every_backend;
use ratelimit_tests::sidecar as support;

use serde_json::Value;
use support::{Options, Server, Store, ask, post, run_ok};

const RULES: &str = "domain: ex\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n    descriptors:\n      - key: path\n        value: \"/api/*\"\n        rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: open\n";

async fn explain(server: &Server, body: &str) -> (u16, String) {
    post(&server.debug_url("/explain"), body).await
}

async fn explanations_read_counters_without_counting(store: &Store) {
    let server = Server::start_with(Options {
        env: store.env(),
        ..Options::rules(RULES)
    });
    let mut client = server.client().await;
    ask(&mut client, "ex", &[&[("user", "a"), ("path", "/api/x")]]).await;
    let body = r#"{"domain":"ex","descriptors":[
        {"entries":[{"key":"user","value":"a"},{"key":"path","value":"/api/x"}]},
        {"entries":[{"key":"open","value":"1"}]},
        {"entries":[{"key":"nothing","value":"1"}]}]}"#;
    for _ in 0..2 {
        let (status, text) = explain(&server, body).await;
        assert_eq!(status, 200, "{text}");
        let json: Value = serde_json::from_str(&text).unwrap();
        let first = &json["descriptors"][0];
        assert_eq!(first["outcome"], "limited", "{text}");
        assert_eq!(first["rule"], "descriptors[0].descriptors[0]");
        assert_eq!(first["matched"][1]["match"], "wildcard");
        assert_eq!(first["current"], 1, "the one request so far: {text}");
        assert_eq!(
            first["code"], "OVER_LIMIT",
            "a second would pass 1 per minute"
        );
        assert!(
            first["cacheKey"]
                .as_str()
                .unwrap()
                .starts_with("ex_user_a_path_/api/x_")
        );
        assert_eq!(json["descriptors"][1]["outcome"], "whitelisted");
        assert_eq!(json["descriptors"][2]["outcome"], "no_rule");
        assert_eq!(json["overallCode"], "OVER_LIMIT");
    }
    // Explaining twice counted nothing.
    let key = "ratelimit.service.rate_limit.ex.user.path_/api/*.total_hits";
    assert_eq!(server.stat(key).await, Some(1));
    let (status, text) = explain(&server, "{").await;
    assert_eq!(status, 400, "{text}");
}
on_every_backend!(explanations_read_counters_without_counting);

#[tokio::test]
async fn the_client_explains_through_the_debug_server() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    let stdout = run_ok(
        std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-client"))
            .args(["-domain", "ex", "-descriptors", "user=b", "-explain"])
            .arg("-debug_address")
            .arg(format!("127.0.0.1:{}", server.debug)),
    );
    assert!(
        stdout.contains("\"outcome\": \"limited\"") && stdout.contains("\"current\": 0"),
        "{stdout}"
    );
    let stats = server.stats().await;
    assert_eq!(stats["ratelimit.service.rate_limit.ex.user.total_hits"], 0);
}
