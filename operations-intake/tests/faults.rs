//! Broker failures: librdkafka's mock cluster (served over loopback TCP to the service
//! process) takes brokers down and fails requests on purpose. The sidecar's failures are
//! in the workspace's tests/intake_with_sidecar.rs.

use ratelimit_tests::intake as support;

use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use support::{Intake, batch, health, mock_with_topic, post, wait_until};

/// The service on `mock`'s topic `ops` with `KAFKA_DELIVERY_TIMEOUT=timeout`, once it
/// has produced a first batch.
async fn start_on(
    mock: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    timeout: &str,
) -> Intake {
    let service = Intake::start(&[
        ("KAFKA_BOOTSTRAP_SERVERS", &mock.bootstrap_servers()),
        ("KAFKA_TOPIC", "ops"),
        ("KAFKA_DELIVERY_TIMEOUT", timeout),
    ]);
    assert_eq!(post(&service, &batch("buy", 1), &[]).await.status, 202);
    service
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_outage_answers_503_promptly_and_the_service_recovers() {
    let mock = mock_with_topic("ops");
    let bootstrap = mock.bootstrap_servers();
    // Deliveries may take a minute: a prompt 503 can only come from knowing the broker
    // is down, not from waiting for a delivery to time out.
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("limits.yaml");
    std::fs::write(&rules, "domain: operations\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: hour, requests_per_unit: 2}\n").unwrap();
    let service = Intake::start(&[
        ("KAFKA_BOOTSTRAP_SERVERS", &bootstrap),
        ("KAFKA_TOPIC", "ops"),
        ("KAFKA_DELIVERY_TIMEOUT", "60s"),
        ("RATELIMIT_CONFIG", rules.to_str().unwrap()),
    ]);
    assert_eq!(post(&service, &batch("buy", 1), &[]).await.status, 202);

    mock.broker_down(1).unwrap();
    wait_until("/health reports the broker down", || async {
        let answer = health(&service).await;
        answer.status == 503 && answer.body["status"] == "down"
    })
    .await;
    let answer = health(&service).await;
    assert_eq!(answer.body["kafka"]["status"], "disconnected");
    assert!(answer.body["kafka"]["reason"].is_string());

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let response = client
        .post(service.url("/operations"))
        .header("content-type", "application/json")
        .body(batch("buy", 1))
        .send()
        .await
        .expect("answered well before the 60 s delivery timeout");
    let refused = support::answer(response).await;
    assert_eq!(refused.status, 503);
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap()
            .contains("nothing was recorded"),
        "{}",
        refused.body
    );
    // Refused during the outage, so not counted: the limit of 2 still has room for one.
    for _ in 0..3 {
        assert_eq!(post(&service, &batch("buy", 1), &[]).await.status, 503);
    }

    mock.broker_up(1).unwrap();
    wait_until("/health reports the broker up again", || async {
        health(&service).await.status == 200
    })
    .await;
    let again = post(&service, &batch("buy", 1), &[]).await;
    assert_eq!(again.status, 202, "{}", again.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unacknowledged_batch_is_503_with_an_id_to_retry_with() {
    let mock = mock_with_topic("ops");
    // The retry settles the earlier attempt and reads the partition back within one
    // delivery timeout: with 1 s, a loaded clean-clone CI run once had 0.5 s left for
    // the read and missed it; 2 s leaves it about twice as long.
    let service = start_on(&mock, "2s").await;
    assert_eq!(health(&service).await.status, 200);
    // Every produce request fails with a retriable error until the delivery times out.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 500],
    );
    let answer = post(&service, &batch("sell", 2), &[]).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(answer.body["error"], "Operations not acknowledged.");
    let id = answer.body["id"].as_str().unwrap().to_owned();
    let message = answer.body["message"].as_str().unwrap();
    assert!(
        message.contains("may or may not have been recorded"),
        "{message}"
    );
    assert!(message.contains(&id), "{message}");

    mock.clear_request_errors(RDKafkaApiKey::Produce);
    let retry = post(&service, &batch("sell", 2), &[("idempotency-key", &id)]).await;
    assert_eq!(retry.status, 202, "{}", retry.body);
    assert_eq!(retry.body["id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fatal_producer_error_is_reported_and_the_producer_replaced() {
    let mock = mock_with_topic("ops");
    let service = start_on(&mock, "5s").await;

    // The next produce request is answered out of sequence at the head of the line,
    // which librdkafka treats as fatal for an idempotent producer; and every producer id
    // asked for is refused as fenced, so each replacement fails fatally too, for now.
    mock.request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED; 200],
    );
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
    );
    let lost = post(&service, &batch("sell", 2), &[]).await;
    assert_eq!(lost.status, 503, "{}", lost.body);
    let id = lost.body["id"].as_str().unwrap().to_owned();
    assert!(
        lost.body["message"]
            .as_str()
            .unwrap()
            .contains("may or may not have been recorded"),
        "{}",
        lost.body
    );
    let state = health(&service).await;
    assert_eq!(state.status, 503, "{}", state.body);
    assert_eq!(state.body["status"], "down");
    let reason = state.body["kafka"]["reason"].as_str().unwrap();
    assert!(reason.contains("OutOfOrderSequenceNumber"), "{reason}");

    wait_until("/health names the replacement's fatal error", || async {
        let state = health(&service).await;
        assert_eq!(state.status, 503, "never UP while fenced: {}", state.body);
        state.body["kafka"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("Fenced"))
    })
    .await;
    // The first attempt may be on the topic, and its producer cannot be fenced while
    // every new one fails: the retry cannot look for it yet, and says so.
    let refused = post(&service, &batch("sell", 2), &[("idempotency-key", &id)]).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    let message = refused.body["message"].as_str().unwrap();
    assert!(
        message.contains("cannot be looked for on the topic yet")
            && message.contains("may or may not have been recorded"),
        "{message}"
    );

    mock.clear_request_errors(RDKafkaApiKey::InitProducerId);
    wait_until("/health is UP with a new producer", || async {
        health(&service).await.status == 200
    })
    .await;
    let retry = post(&service, &batch("sell", 2), &[("idempotency-key", &id)]).await;
    assert_eq!(retry.status, 202, "{}", retry.body);
    assert_eq!(retry.body["id"], id.as_str());
    let warnings: Vec<String> = service
        .log()
        .lines()
        .filter(|l| l.contains("replaced the Kafka producer"))
        .map(str::to_owned)
        .collect();
    assert!(warnings.len() >= 2, "{warnings:?}");
    assert!(
        warnings.iter().all(|l| l.contains("level=warn")),
        "{warnings:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_producer_whose_id_the_broker_lost_is_replaced() {
    let mock = mock_with_topic("ops");
    let service = start_on(&mock, "60s").await;

    // As after a broker restart: the producer id is unknown. The transaction fails at
    // once (an idempotent producer used to bump its epoch and retry until the delivery
    // timeout): the batch is answered promptly and the producer replaced.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID; 400],
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(45))
        .build()
        .unwrap();
    let response = client
        .post(service.url("/operations"))
        .header("content-type", "application/json")
        .body(batch("sell", 1))
        .send()
        .await
        .expect("answered before the 60 s delivery timeout");
    let lost = support::answer(response).await;
    assert_eq!(lost.status, 503, "{}", lost.body);
    let message = lost.body["message"].as_str().unwrap();
    assert!(
        message.contains("may or may not have been recorded")
            && message.contains("Unknown Producer Id"),
        "{message}"
    );
    let id = lost.body["id"].as_str().unwrap().to_owned();
    assert!(
        service.log().contains("replaced the Kafka producer"),
        "{}",
        service.log()
    );

    mock.clear_request_errors(RDKafkaApiKey::Produce);
    wait_until("/health is UP with a new producer", || async {
        health(&service).await.status == 200
    })
    .await;
    let retry = post(&service, &batch("sell", 1), &[("idempotency-key", &id)]).await;
    assert_eq!(retry.status, 202, "{}", retry.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_makes_the_service_unhealthy() {
    let mock = mock_with_topic("ops");
    let bootstrap = mock.bootstrap_servers();
    let service = Intake::start(&[
        ("KAFKA_BOOTSTRAP_SERVERS", &bootstrap),
        ("KAFKA_TOPIC", "nowhere"),
    ]);
    mock.topic_error(
        "nowhere",
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
    )
    .unwrap();
    wait_until("/health reports the topic missing", || async {
        let answer = health(&service).await;
        answer.status == 503
            && answer.body["kafka"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("nowhere"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_settings_stop_start_up_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("bad.yaml");
    std::fs::write(&rules, "domain: operations\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n").unwrap();
    let output = std::process::Command::new(support::binary("operations-intake"))
        .env_clear()
        .env("PORT", support::free_port().to_string())
        .env("RATELIMIT_CONFIG", &rules)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("RATELIMIT_CONFIG"), "{stderr}");
    assert!(stderr.contains("fortnight"), "{stderr}");

    let output = std::process::Command::new(support::binary("operations-intake"))
        .env_clear()
        .env("PORT", support::free_port().to_string())
        .env("AUTH", "none")
        .env("KAFKA_PROPERTIES", "linger.ms=5,acks=1")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`acks` is set by the service"), "{stderr}");

    // The sidecar URL needs its scheme: without one every batch used to pass.
    let output = std::process::Command::new(support::binary("operations-intake"))
        .env_clear()
        .env("PORT", support::free_port().to_string())
        .env("AUTH", "none")
        .env("RATELIMIT_GRPC_URL", "127.0.0.1:8081")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("RATELIMIT_GRPC_URL `127.0.0.1:8081` is not valid")
            && stderr.contains("http://host:port"),
        "{stderr}"
    );
}
