//! Upstream main's last details, end to end on every backend, through gRPC and `/json`:
//! quota mode with unlimited rules, the descriptor behind the `RateLimit-*` headers,
//! dynamic metadata, refunds (`is_negative_hits`) and their statistic.

use ratelimit_tests::on_every_backend;
use ratelimit_tests::sidecar as support;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::Value;
use support::{Options, Server, Store, codes, post, request};

const OK: i32 = 1;
const OVER: i32 = 2;

const RULES: &str = include_str!("fixtures/parity.yaml");

fn start(store: &Store) -> Server {
    let mut options = Options {
        ..Options::rules(RULES)
    };
    options.env.extend(store.env());
    options.env.extend([
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true".to_owned()),
        ("RESPONSE_DYNAMIC_METADATA", "true".to_owned()),
    ]);
    Server::start_with(options)
}

fn hits(mut request: RateLimitRequest, index: usize, hits: u64, refund: bool) -> RateLimitRequest {
    let descriptor = &mut request.descriptors[index];
    descriptor.hits_addend = Some(UInt64Value { value: hits });
    descriptor.is_negative_hits = refund;
    request
}

async fn json(server: &Server, body: &str) -> (u16, Value) {
    let (status, text) = post(&server.http_url("/json"), body).await;
    (status, serde_json::from_str(&text).unwrap())
}

on_every_backend!(quota_mode_headers_and_metadata_follow_upstream);

async fn quota_mode_headers_and_metadata_follow_upstream(store: &Store) {
    let server = start(store);
    let mut client = server.client().await;
    let pair = || request("p", &[&[("quota", "a")], &[("free", "a")]]);
    client.should_rate_limit(pair()).await.unwrap();
    let second = client.should_rate_limit(pair()).await.unwrap().into_inner();
    assert_eq!(codes(&second), [(OVER, 0), (OK, u32::MAX)]);
    assert_eq!(
        second.overall_code, OVER,
        "unlimited is not a passing quota one"
    );

    // A failing regular descriptor reports the headers, not the failing quota one.
    let spent = hits(request("p", &[&[("plain", "h")]]), 0, 5, false);
    client.should_rate_limit(spent).await.unwrap();
    let mixed = request("p", &[&[("plain", "h")], &[("quota", "a")]]);
    let over = client.should_rate_limit(mixed).await.unwrap().into_inner();
    let limit = over
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "RateLimit-Limit");
    assert_eq!(limit.map(|h| h.value.as_str()), Some("5"));

    // Only passed, limited descriptors contribute metadata; /json carries it.
    let body = r#"{"domain":"p","descriptors":[
        {"entries":[{"key":"tagged","value":"m"}]},{"entries":[{"key":"free","value":"m"}]}]}"#;
    let (status, answer) = json(&server, body).await;
    assert_eq!(status, 200, "{answer}");
    let metadata = &answer["dynamicMetadata"];
    assert_eq!(metadata["domain"], "p", "{answer}");
    assert_eq!(metadata["metadata"], serde_json::json!({"team": "tagged"}));
    assert_eq!(metadata["descriptors"][1]["entries"][0], "free=m");
}

on_every_backend!(a_refund_gives_hits_back_and_counts_only_as_negative_hits);

async fn a_refund_gives_hits_back_and_counts_only_as_negative_hits(store: &Store) {
    let server = start(store);
    let mut client = server.client().await;
    for key in ["window", "bucket"] {
        let one = || request("p", &[&[(key, "r")]]);
        let spent = client
            .should_rate_limit(hits(one(), 0, 3, false))
            .await
            .unwrap();
        assert_eq!(codes(&spent.into_inner()), [(OK, 0)], "{key}");
        let refund = client
            .should_rate_limit(hits(one(), 0, 2, true))
            .await
            .unwrap();
        assert_eq!(codes(&refund.into_inner()), [(OK, 2)], "{key}: gRPC refund");
        // The same through /json, past zero: it stops at zero.
        let body = format!(
            r#"{{"domain":"p","descriptors":[{{"entries":[{{"key":"{key}","value":"r"}}],
            "hitsAddend":"50","isNegativeHits":true}}]}}"#
        );
        let (status, answer) = json(&server, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer["statuses"][0]["limitRemaining"], 3,
            "{key}: {answer}"
        );
        let full = client
            .should_rate_limit(hits(one(), 0, 3, false))
            .await
            .unwrap();
        assert_eq!(
            codes(&full.into_inner()),
            [(OK, 0)],
            "{key}: all three again"
        );
        let over = client.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(over.overall_code, OVER, "{key}");
        let stat = |name: &str| format!("ratelimit.service.rate_limit.p.{key}.{name}");
        assert_eq!(server.stat(&stat("total_negative_hits")).await, Some(52));
        assert_eq!(server.stat(&stat("total_hits")).await, Some(7), "{key}");
        assert_eq!(server.stat(&stat("over_limit")).await, Some(1), "{key}");
    }
}
