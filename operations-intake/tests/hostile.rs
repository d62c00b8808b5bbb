//! Requests made to confuse or to bloat the service, against a real broker (tansu): two
//! `Authorization` headers, and a body whose problems would fill megabytes.

use ratelimit_tests::intake as support;

mod common;

use common::broker_and_intake;

use support::{batch, bearer, keygen, post, read_topic};

#[tokio::test(flavor = "multi_thread")]
async fn two_authorization_headers_are_refused_whatever_their_order() {
    let (key, entry) = keygen("acme", None);
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), entry).unwrap();
    let settings = [
        ("AUTH", "api-keys"),
        ("API_KEYS_FILE", keys.path().to_str().unwrap()),
    ];
    let (tansu, service) = broker_and_intake("twice", &settings).await;
    let (name, good) = bearer(&key);
    let bad = "Bearer oik_0000".to_owned();
    for pair in [[&good, &bad], [&bad, &good], [&good, &good]] {
        let headers = [(name, pair[0].as_str()), (name, pair[1].as_str())];
        let refused = post(&service, &batch("buy", 1), &headers).await;
        assert_eq!(refused.status, 401, "{pair:?}: {}", refused.body);
        assert_eq!(refused.body["error"], "Authentication required.");
        assert!(
            refused.body["message"]
                .as_str()
                .unwrap()
                .contains("one Authorization header"),
            "{}",
            refused.body
        );
        assert!(
            refused
                .header("www-authenticate")
                .unwrap()
                .contains("invalid_request")
        );
    }
    let once = post(&service, &batch("buy", 1), &[(name, good.as_str())]).await;
    assert_eq!(once.status, 202, "{}", once.body);
    assert_eq!(read_topic(&tansu.bootstrap(), "twice").len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_400_lists_at_most_100_problems_and_counts_the_rest() {
    let (_tansu, service) = broker_and_intake("bloated", &[("MAX_BODY_BYTES", "2000000")]).await;
    // One object with 110 000 unknown fields (and none of the three it needs).
    let fields: Vec<String> = (0..110_000).map(|i| format!("\"{i:x}\":0")).collect();
    let body = format!("[{{{}}}]", fields.join(","));
    let response = reqwest::Client::new()
        .post(service.url("/operations"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let text = response.text().await.unwrap();
    assert!(text.len() < 20_000, "a {} byte answer", text.len());
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    let errors = answer["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 100);
    assert_eq!(
        (errors[0]["index"].clone(), errors[0]["field"].clone()),
        (0.into(), "0".into())
    );
    // 110 000 unknown fields and 3 missing ones, 100 of them listed.
    assert_eq!(answer["errors_omitted"], 110_003 - 100);
    assert_eq!(answer["error"], "Invalid request.");
}
