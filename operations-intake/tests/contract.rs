//! The original service's HTTP contract (../shared/spec/operations-intake-service.md):
//! its documented requests, replayed against the service and a real broker (tansu),
//! get the original's statuses and members, beside what this service adds.

use ratelimit_tests::intake as support;

mod common;

use common::broker_and_intake;

use serde_json::json;
use support::{Answer, Intake, Tansu, answer, health, operation, post, read_topic};

/// The spec's request: a JSON array of operations with `operation`, `unit-cost` and
/// `quantity`.
fn documented_batch() -> String {
    format!(
        "[{},{}]",
        operation("buy", "10.10", 100),
        operation("sell", "15.00", 50)
    )
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    answer(request.send().await.unwrap()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_original_services_requests_get_its_answers() {
    let (tansu, service) = broker_and_intake("contract", &[]).await;

    let accepted = post(&service, &documented_batch(), &[]).await;
    assert_eq!(accepted.status, 202, "{}", accepted.body);
    assert_eq!(
        accepted.body["message"],
        "Operations received and processing initiated."
    );
    assert_eq!(accepted.body["count"], 2);
    assert_eq!(
        (
            accepted.body["partition"].clone(),
            accepted.body["offset"].clone()
        ),
        (json!(0), json!(0))
    );
    let id = accepted.body["id"].as_str().expect("an id").to_owned();

    let empty = post(&service, "[]", &[]).await;
    assert_eq!(empty.status, 202, "{}", empty.body);
    assert_eq!(
        empty.body,
        json!({"message": "No operations provided, but request accepted.", "count": 0})
    );
    let spaced = post(&service, " [\n] ", &[("idempotency-key", "nothing-1")]).await;
    assert_eq!((spaced.status, &spaced.body), (202, &empty.body));
    let again = post(&service, " [\n] ", &[("idempotency-key", "nothing-1")]).await;
    assert_eq!((again.status, &again.body), (202, &empty.body));

    let health = health(&service).await;
    assert_eq!(health.status, 200, "{}", health.body);
    assert_eq!(health.body["app"], "operations-service");
    assert_eq!(health.body["status"], "up");
    let kafka = &health.body["kafka"];
    assert_eq!(kafka["status"], "connected");
    assert_eq!(kafka["bootstrap-servers"], tansu.bootstrap().as_str());
    assert_eq!(kafka["topic"], "contract");
    // What the service reported before, under its names.
    assert_eq!(kafka["bootstrap_servers"], tansu.bootstrap().as_str());
    assert_eq!(kafka["partitions"], 1);

    // Only the documented batch is on the topic: the empty arrays produced nothing.
    let records = read_topic(&tansu.bootstrap(), "contract");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value, documented_batch().as_bytes());
    assert_eq!(records[0].header("request-id"), Some(id.as_str()));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_refusal_carries_the_originals_error_member() {
    let (tansu, service) = broker_and_intake("refusals", &[("MAX_OPERATIONS", "1")]).await;
    let client = reqwest::Client::new();

    let malformed = post(&service, "[{\"operation\": \"buy\",", &[]).await;
    assert_eq!(malformed.status, 400, "{}", malformed.body);
    assert_eq!(malformed.body["error"], "Malformed JSON request body.");
    assert!(malformed.body["errors"][0]["message"].is_string());
    // JSON of the wrong shape is not malformed: another error, same members.
    let wrong_shape = post(&service, r#"{"operation":"buy"}"#, &[]).await;
    assert_eq!(wrong_shape.status, 400);
    assert_eq!(wrong_shape.body["error"], "Invalid request.");

    for path in ["/", "/nope", "/operations/", "/health/x"] {
        for method in [reqwest::Method::GET, reqwest::Method::POST] {
            let lost = send(client.request(method.clone(), service.url(path))).await;
            assert_eq!(lost.status, 404, "{method} {path}");
            assert_eq!(lost.body["error"], "Not Found", "{method} {path}");
            assert!(lost.body["message"].is_string());
        }
    }

    let too_many = format!("[{0},{0}]", operation("buy", "1", 1));
    let cases = [
        (
            send(client.delete(service.url("/operations"))).await,
            405,
            "Method not allowed.",
        ),
        (
            send(
                client
                    .post(service.url("/operations"))
                    .header("content-type", "text/plain")
                    .body(documented_batch()),
            )
            .await,
            415,
            "Unsupported media type.",
        ),
        (
            post(&service, &too_many, &[]).await,
            413,
            "Request too large.",
        ),
    ];
    for (refused, status, error) in cases {
        assert_eq!(refused.status, status, "{}", refused.body);
        assert_eq!(refused.body["error"], error);
        assert!(refused.body["message"].is_string(), "{}", refused.body);
    }
    let keyed = [("idempotency-key", "k-1")];
    let one = format!("[{}]", operation("buy", "1", 1));
    assert_eq!(post(&service, &one, &keyed).await.status, 202);
    let reused = post(
        &service,
        &format!("[{}]", operation("sell", "1", 1)),
        &keyed,
    )
    .await;
    assert_eq!(reused.status, 409, "{}", reused.body);
    assert_eq!(
        reused.body["error"],
        "Idempotency-Key reused with a different body."
    );
    let replayed = post(&service, &one, &keyed).await;
    assert_eq!(
        replayed.status, 202,
        "a replay answers as the first answer did"
    );
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    assert_eq!(read_topic(&tansu.bootstrap(), "refusals").len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_is_down_and_disconnected_while_the_topic_is_missing() {
    let tansu = Tansu::start();
    let bootstrap = tansu.bootstrap();
    let service = Intake::start(&[
        ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
        ("KAFKA_TOPIC", "absent"),
    ]);
    let state = health(&service).await;
    assert_eq!(state.status, 503, "{}", state.body);
    assert_eq!(state.body["app"], "operations-service");
    assert_eq!(state.body["status"], "down");
    assert_eq!(state.body["kafka"]["status"], "disconnected");
    assert_eq!(state.body["kafka"]["bootstrap-servers"], bootstrap.as_str());
    assert!(state.body["kafka"]["reason"].is_string(), "{}", state.body);
    let refused = post(&service, &documented_batch(), &[]).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.body["error"], "Service unavailable.");
    // An empty array produces nothing, so it does not need the broker.
    assert_eq!(post(&service, "[]", &[]).await.status, 202);
}
