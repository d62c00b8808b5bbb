//! The service recovers by itself when its transactional producer can no longer produce
//! to a real broker (tansu): after a pause that times a transaction out, and after a
//! restart that loses its producer id, the producer is replaced, and a batch answered 503
//! meanwhile, retried with its id, is on the topic once. Until then `/health` is down
//! with the reason, and the readiness probe follows the broker.

use ratelimit_tests::intake as support;

use std::time::{Duration, Instant};

use support::{Answer, Intake, Tansu, batch, get, health, post, read_topic, wait_until};

async fn broker_with_topic(topic: &str) -> Tansu {
    let tansu = Tansu::start();
    tansu.create_topic(topic, 1).await;
    tansu
}

fn intake(tansu: &Tansu, topic: &str) -> Intake {
    let bootstrap = tansu.bootstrap();
    Intake::start(&[
        ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
        ("KAFKA_TOPIC", topic),
        ("KAFKA_DELIVERY_TIMEOUT", "3s"),
    ])
}

/// Posts a batch every 100 ms until one is accepted (its id), for up to 30 s; `failed` sees
/// each other answer.
async fn post_until_accepted(service: &Intake, mut failed: impl AsyncFnMut(&Answer)) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let answer = post(service, &batch("sell", 1), &[]).await;
        if answer.status == 202 {
            return answer.body["id"].as_str().unwrap().to_owned();
        }
        failed(&answer).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no POST was accepted within 30 s after the broker came back");
}

/// The replacement warnings in the service's log.
fn replacements(service: &Intake) -> Vec<String> {
    service
        .log()
        .lines()
        .filter(|l| l.contains("replaced the Kafka producer"))
        .map(str::to_owned)
        .collect()
}

/// Asserts that each of `ids` is on `topic` exactly once.
fn on_topic_once(tansu: &Tansu, topic: &str, ids: &[&str]) {
    let keys: Vec<String> = read_topic(&tansu.bootstrap(), topic)
        .iter()
        .map(|r| r.header("request-id").unwrap().to_owned())
        .collect();
    for id in ids {
        assert_eq!(
            keys.iter().filter(|k| k == id).count(),
            1,
            "{id} in {keys:?}"
        );
    }
}

/// Asserts that every replacement was logged once, as a warning.
fn replaced_with_warnings(service: &Intake) {
    let replaced = replacements(service);
    assert!(!replaced.is_empty(), "the producer was replaced");
    assert!(
        replaced.iter().all(|l| l.contains("level=warn")),
        "{replaced:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_producer_timed_out_by_a_broker_pause_is_replaced() {
    let tansu = broker_with_topic("paused").await;
    let service = intake(&tansu, "paused");
    let before = post(&service, &batch("buy", 1), &[]).await;
    assert_eq!(before.status, 202, "{}", before.body);

    // A batch in flight while the broker is frozen: its transaction times out, and the
    // producer is replaced by one that fences it once the broker answers again.
    tansu.pause();
    let lost = post(&service, &batch("buy", 2), &[]).await;
    let down = health(&service).await;
    tansu.resume();
    assert_eq!(lost.status, 503, "{}", lost.body);
    let message = lost.body["message"].as_str().unwrap();
    assert!(
        message.contains("may or may not have been recorded"),
        "the batch was sent before the probe saw the pause: {message}"
    );
    assert_eq!(
        down.status, 503,
        "down while the producer is replaced: {}",
        down.body
    );

    let accepted = post_until_accepted(&service, async |_: &Answer| {}).await;
    assert_eq!(health(&service).await.status, 200);
    replaced_with_warnings(&service);
    // Its retry finds out whether the first attempt landed before producing it again.
    let id = lost.body["id"].as_str().unwrap();
    let retry = post(&service, &batch("buy", 2), &[("idempotency-key", id)]).await;
    assert_eq!(retry.status, 202, "{}", retry.body);
    on_topic_once(
        &tansu,
        "paused",
        &[before.body["id"].as_str().unwrap(), &accepted, id],
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_producer_id_lost_in_a_broker_restart_is_replaced() {
    let mut tansu = broker_with_topic("restarted").await;
    let service = intake(&tansu, "restarted");
    assert_eq!(post(&service, &batch("buy", 1), &[]).await.status, 202);

    // The new broker has never heard of the producer id or its transactional id: the
    // next transaction fails, and a new producer starts over.
    tansu.restart();
    tansu.create_topic("restarted", 1).await;
    let accepted = post_until_accepted(&service, async |_: &Answer| {}).await;
    replaced_with_warnings(&service);
    on_topic_once(&tansu, "restarted", &[&accepted]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ready_probe_follows_the_broker_and_the_live_probe_does_not() {
    let mut tansu = broker_with_topic("probed").await;
    let service = intake(&tansu, "probed");
    let ready = get(&service, "/health/ready").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.body["status"], "up");
    assert_eq!(ready.body["checks"]["kafka"]["status"], "up");
    assert_eq!(ready.body["failed"], serde_json::json!([]));

    tansu.stop();
    wait_until("the ready probe says the broker is down", || async {
        get(&service, "/health/ready").await.status == 503
    })
    .await;
    let unready = get(&service, "/health/ready").await;
    assert_eq!(unready.body["status"], "down");
    assert_eq!(unready.body["failed"], serde_json::json!(["kafka"]));
    let kafka = &unready.body["checks"]["kafka"];
    assert_eq!(kafka["status"], "down");
    assert!(kafka["reason"].is_string(), "{}", unready.body);
    let live = get(&service, "/health/live").await;
    assert_eq!(
        (live.status, &live.body["status"]),
        (200, &serde_json::json!("up"))
    );

    tansu.start_again();
    tansu.create_topic("probed", 1).await;
    wait_until("the ready probe says the broker is back", || async {
        get(&service, "/health/ready").await.status == 200
    })
    .await;
    assert_eq!(get(&service, "/health/live").await.status, 200);
}
