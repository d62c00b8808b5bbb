//! RFC 9457 problem details for clients that accept `application/problem+json`, against
//! a real broker (tansu); other clients keep the service's JSON.

use ratelimit_tests::intake as support;

use serde_json::json;
use support::{Answer, Intake, Tansu, answer, batch, operation, post, read_topic};

const PROBLEM: (&str, &str) = ("accept", "application/problem+json");

/// Two sells an hour per client, under a named limit; ten operations in all.
const RULES: &str = "domain: operations\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: hour, requests_per_unit: 10}\n    descriptors:\n      - key: operation\n        value: sell\n        rate_limit: {unit: hour, requests_per_unit: 2, name: sells-per-hour}\n";

struct Setup {
    tansu: Tansu,
    service: Intake,
    _rules: tempfile::TempDir,
}

async fn start(topic: &str) -> Setup {
    let tansu = Tansu::start();
    tansu.create_topic(topic, 1).await;
    let rules = tempfile::tempdir().unwrap();
    let path = rules.path().join("limits.yaml");
    std::fs::write(&path, RULES).unwrap();
    let bootstrap = tansu.bootstrap();
    let service = Intake::start(&[
        ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
        ("KAFKA_TOPIC", topic),
        ("RATELIMIT_CONFIG", path.to_str().unwrap()),
    ]);
    Setup {
        tansu,
        service,
        _rules: rules,
    }
}

/// Asserts the problem's content type, `type`, `title` and `status`.
fn assert_problem(answer: &Answer, status: u16, kind: &str, title: &str) {
    assert_eq!(answer.status, status, "{}", answer.body);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    let expected = match kind {
        "quota-exceeded" => {
            "https://iana.org/assignments/http-problem-types#quota-exceeded".to_owned()
        }
        _ => format!("tag:operations-intake,2026:problem:{kind}"),
    };
    assert_eq!(answer.body["type"], expected.as_str(), "{}", answer.body);
    assert_eq!(answer.body["title"], title);
    assert_eq!(answer.body["status"], status);
    assert!(answer.body["detail"].is_string(), "{}", answer.body);
    assert!(answer.body.get("message").is_none(), "{}", answer.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn validation_problems_point_into_the_body_or_name_the_header() {
    let setup = start("pointed").await;
    let service = &setup.service;
    let body = r#"[{"operation":"buy","unit-cost":"1","quantity":1},{"operation":"hold","unit-cost":1,"a/b~c":1}]"#;
    let bad_key = ("idempotency-key", "has space");
    let invalid = post(service, body, &[PROBLEM, bad_key]).await;
    assert_problem(&invalid, 400, "invalid-request", "Invalid request.");
    let located: Vec<(String, String)> = invalid.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(e["detail"].is_string(), "{e}");
            let at = |name: &str| e[name].as_str().unwrap_or_default().to_owned();
            (at("pointer"), at("header"))
        })
        .collect();
    let at = |pointer: &str, header: &str| (pointer.to_owned(), header.to_owned());
    assert_eq!(
        located,
        [
            at("", "Idempotency-Key"),
            at("#/0/unit-cost", ""),
            at("#/1/a~1b~0c", ""),
            at("#/1/operation", ""),
            at("#/1/quantity", ""),
        ]
    );

    let malformed = post(service, "[{", &[PROBLEM]).await;
    assert_problem(
        &malformed,
        400,
        "malformed-json",
        "Malformed JSON request body.",
    );
    assert_eq!(malformed.body["errors"][0]["pointer"], "#");

    // Without the Accept header, or refusing it with q=0: the service's JSON.
    for accept in [None, Some("application/problem+json;q=0")] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let plain = post(service, body, &headers).await;
        assert_eq!(plain.status, 400);
        assert_eq!(plain.header("content-type"), Some("application/json"));
        assert_eq!(plain.body["error"], "Invalid request.");
        assert!(plain.body.get("type").is_none(), "{}", plain.body);
    }
    assert!(read_topic(&setup.tansu.bootstrap(), "pointed").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn over_limit_is_quota_exceeded_with_the_violated_policies() {
    let setup = start("quota").await;
    let service = &setup.service;
    let sold = post(service, &batch("sell", 2), &[PROBLEM]).await;
    assert_eq!(
        sold.status, 202,
        "acceptances are not problems: {}",
        sold.body
    );
    let over = post(service, &batch("sell", 1), &[PROBLEM]).await;
    assert_problem(&over, 429, "quota-exceeded", "Rate limit exceeded.");
    assert_eq!(over.body["violated-policies"], json!(["sells-per-hour"]));
    assert!(over.header("retry-after").is_some(), "headers are kept");
    assert_eq!(over.header("ratelimit-limit"), Some("2"));
    // Buys are within their limit: only the sell limit is violated.
    let mixed = format!(
        "[{},{}]",
        operation("buy", "1", 1),
        operation("sell", "1", 1)
    );
    let over = post(service, &mixed, &[PROBLEM]).await;
    assert_eq!(over.body["violated-policies"], json!(["sells-per-hour"]));

    let client = reqwest::Client::new();
    let lost = client
        .get(service.url("/nope"))
        .header(PROBLEM.0, PROBLEM.1);
    assert_problem(
        &answer(lost.send().await.unwrap()).await,
        404,
        "not-found",
        "Not Found",
    );
    let wrong = client
        .put(service.url("/operations"))
        .header(PROBLEM.0, PROBLEM.1);
    let wrong = answer(wrong.send().await.unwrap()).await;
    assert_problem(&wrong, 405, "method-not-allowed", "Method not allowed.");
    assert_eq!(wrong.header("allow"), Some("POST"));
}
