//! Idempotency shared through a real Redis: replicas behind one address, replicas killed
//! and restarted, and a claim whose holder died. Messages are read back from a real
//! broker (tansu) by an independent client.

use std::time::Duration;

use bytes::Bytes;
use operations_intake::auth::keys::hex;
use operations_intake::idempotency::{self, Claim, Pending};
use ratelimit_tests::faults::proxy::Proxy;
use ratelimit_tests::intake as support;
use ratelimit_tests::sidecar::Redis;
use sha2::{Digest, Sha256};
use support::{Intake, Tansu, batch, post, read_topic};

fn replica(tansu: &Tansu, redis: &Redis, topic: &str) -> Intake {
    replica_with(tansu, redis, topic, &[])
}

/// A replica with `more` settings.
fn replica_with(tansu: &Tansu, redis: &Redis, topic: &str, more: &[(&str, &str)]) -> Intake {
    replica_via(tansu, redis.port, topic, more)
}

/// A replica with `more` settings that reaches Redis on `redis_port` (a proxy's).
fn replica_via(tansu: &Tansu, redis_port: u16, topic: &str, more: &[(&str, &str)]) -> Intake {
    let bootstrap = tansu.bootstrap();
    let url = format!("redis://127.0.0.1:{redis_port}");
    let mut env = vec![
        ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
        ("KAFKA_TOPIC", topic),
        ("IDEMPOTENCY_STORE", "redis"),
        ("IDEMPOTENCY_REDIS_URL", &url),
    ];
    env.extend_from_slice(more);
    Intake::start(&env)
}

/// A store on `redis`, as a replica keeps one, with a claim TTL of 300 ms.
async fn store(redis: &Redis) -> idempotency::Store {
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let store = idempotency::redis::Store::connect(
        &url,
        Duration::from_millis(300),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    idempotency::Store::Redis(store.await.unwrap())
}

/// The claim of `key` (body `body`) by `retry` after a holder died holding it: in
/// progress while the holder's lease lasts, then taken over with its note.
async fn taken_over_after_its_lease<'a>(
    retry: &'a idempotency::Store,
    key: &str,
) -> (Pending<'a>, String) {
    assert!(matches!(
        retry.claim(key, b"body").await,
        Ok(Claim::InProgress)
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Ok(Claim::Unsure(held, note)) = retry.claim(key, b"body").await else {
        panic!("taken over")
    };
    (held, note)
}

/// The messages on `topic` whose key is `key`.
fn with_key(tansu: &Tansu, topic: &str, key: &str) -> usize {
    read_topic(&tansu.bootstrap(), topic)
        .iter()
        .filter(|r| r.key == key.as_bytes())
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_sharing_redis_produce_a_key_sent_to_both_at_once_exactly_once() {
    let redis = Redis::start(&[]);
    let tansu = Tansu::start();
    tansu.create_topic("shared", 1).await;
    let replicas = [
        replica(&tansu, &redis, "shared"),
        replica(&tansu, &redis, "shared"),
    ];
    let body = batch("buy", 3);
    let sends = (0..50).map(|i| {
        let (service, body) = (&replicas[i % 2], body.as_str());
        async move { post(service, body, &[("idempotency-key", "order-50")]).await }
    });
    let answers = futures_util::future::join_all(sends).await;
    let mut accepted = Vec::new();
    for answer in &answers {
        match answer.status {
            202 => accepted.push(answer.body.clone()),
            409 => assert!(
                answer.body["message"]
                    .as_str()
                    .unwrap()
                    .contains("still being processed")
            ),
            other => panic!("{other}: {}", answer.body),
        }
    }
    assert!(!accepted.is_empty());
    assert!(
        accepted.iter().all(|a| *a == accepted[0]),
        "every 202 is the one answer: {accepted:?}"
    );
    // Retries after the fact, to either replica, replay it.
    for service in &replicas {
        let retry = post(service, &body, &[("idempotency-key", "order-50")]).await;
        assert_eq!(retry.status, 202);
        assert_eq!(retry.body, accepted[0]);
        assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(
        with_key(&tansu, "shared", "127.0.0.1 order-50"),
        1,
        "one message"
    );
    assert_eq!(read_topic(&tansu.bootstrap(), "shared").len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_between_a_request_and_its_retry_produces_once() {
    let mut redis = Redis::start(&[]);
    let tansu = Tansu::start();
    tansu.create_topic("killed", 1).await;
    let first = replica(&tansu, &redis, "killed");
    let body = batch("sell", 2);
    let key = [("idempotency-key", "order-k")];
    let answered = post(&first, &body, &key).await;
    assert_eq!(answered.status, 202, "{}", answered.body);
    drop(first); // SIGKILL: nothing in its memory survives.

    let restarted = replica(&tansu, &redis, "killed");
    let retry = post(&restarted, &body, &key).await;
    assert_eq!(retry.status, 202, "{}", retry.body);
    assert_eq!(retry.body, answered.body);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(with_key(&tansu, "killed", "127.0.0.1 order-k"), 1);
    let ready = support::get(&restarted, "/health/ready").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.body["checks"]["idempotency"]["status"], "up");

    // Without Redis a keyed batch cannot be checked: refused, and nothing recorded. A
    // batch without a key does not need it.
    redis.kill();
    let refused = post(
        &restarted,
        &batch("buy", 1),
        &[("idempotency-key", "order-r")],
    )
    .await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap()
            .contains("idempotency store is unavailable")
    );
    let unkeyed = post(&restarted, &batch("buy", 1), &[]).await;
    assert_eq!(unkeyed.status, 202, "{}", unkeyed.body);
    // Not ready, saying why; the broker is fine.
    let unready = support::get(&restarted, "/health/ready").await;
    assert_eq!(unready.status, 503, "{}", unready.body);
    assert_eq!(unready.body["failed"], serde_json::json!(["idempotency"]));
    assert_eq!(unready.body["checks"]["kafka"]["status"], "up");
    assert_eq!(read_topic(&tansu.bootstrap(), "killed").len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_holder_died_expires_and_a_refused_batch_releases_its_claim() {
    let redis = Redis::start(&[]);
    let (holder, other) = (store(&redis).await, store(&redis).await);
    let key = idempotency::scoped("acme", "k1");
    let Ok(Claim::New(pending)) = holder.claim(&key, b"body").await else {
        panic!("the first claim wins")
    };
    std::mem::forget(pending); // The holder dies: no release, no answer.
    assert!(matches!(
        other.claim(&key, b"body").await,
        Ok(Claim::InProgress)
    ));
    assert!(matches!(
        other.claim(&key, b"another").await,
        Ok(Claim::Mismatch)
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Ok(Claim::New(pending)) = other.claim(&key, b"body").await else {
        panic!("the expired claim is taken over")
    };
    pending.finish(Bytes::from_static(b"{\"ok\":true}")).await;
    assert!(matches!(
        holder.claim(&key, b"body").await,
        Ok(Claim::Replay(answer)) if answer == "{\"ok\":true}"
    ));
    // The answer outlives the claim's TTL: it is kept for IDEMPOTENCY_TTL.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        other.claim(&key, b"body").await,
        Ok(Claim::Replay(_))
    ));

    // A claim given up (a refused batch) is free again at once.
    let released = idempotency::scoped("acme", "k2");
    let Ok(Claim::New(pending)) = holder.claim(&released, b"body").await else {
        panic!("new")
    };
    drop(pending);
    support::wait_until("the claim is released", || async {
        match other.claim(&released, b"body").await {
            Ok(Claim::New(pending)) => {
                std::mem::forget(pending);
                true
            }
            _ => false,
        }
    })
    .await;
    let stored = redis.keys();
    assert!(
        stored.contains(&"operations-intake:idempotency:acme k1".to_owned()),
        "{stored:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unacknowledged_batch_retried_on_another_replica_is_on_the_topic_once() {
    let redis = Redis::start(&[]);
    let tansu = Tansu::start();
    tansu.create_topic("unsure", 1).await;
    let quick = [
        ("KAFKA_DELIVERY_TIMEOUT", "1s"),
        ("IDEMPOTENCY_CLAIM_TTL", "3s"),
    ];
    let first = replica_with(&tansu, &redis, "unsure", &quick);
    let second = replica_with(&tansu, &redis, "unsure", &quick);
    let (body, key) = (batch("sell", 3), [("idempotency-key", "order-u")]);
    assert_eq!(post(&first, &batch("buy", 1), &[]).await.status, 202);

    tansu.pause();
    let lost = post(&first, &body, &key).await;
    tansu.resume();
    assert_eq!(lost.status, 503, "{}", lost.body);
    // The other replica cannot fence the first one's producer: it waits for the broker
    // to end that transaction (IDEMPOTENCY_CLAIM_TTL), and says so meanwhile.
    let early = post(&second, &body, &key).await;
    assert_eq!(early.status, 503, "{}", early.body);
    let message = early.body["message"].as_str().unwrap();
    assert!(
        message.contains("cannot be looked for on the topic yet")
            && message.contains("another process"),
        "{message}"
    );
    let mut answer = early;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while answer.status == 503 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        answer = post(&second, &body, &key).await;
    }
    assert_eq!(answer.status, 202, "{}", answer.body);
    let replay = post(&first, &body, &key).await;
    assert_eq!(
        replay.body, answer.body,
        "the one answer, from either replica"
    );
    assert_eq!(with_key(&tansu, "unsure", "127.0.0.1 order-u"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unsure_key_is_held_by_one_retry_at_a_time_and_outlives_a_holder_that_died() {
    let redis = Redis::start(&[]);
    let (first, retry) = (store(&redis).await, store(&redis).await);
    let key = idempotency::scoped("acme", "u1");
    let Ok(Claim::New(pending)) = first.claim(&key, b"body").await else {
        panic!("new")
    };
    pending.unsure("0 7 1 1700 p#1".to_owned()).await;
    let Ok(Claim::Unsure(held, note)) = retry.claim(&key, b"body").await else {
        panic!("unsure")
    };
    assert_eq!(note, "0 7 1 1700 p#1");
    assert!(matches!(
        first.claim(&key, b"body").await,
        Ok(Claim::InProgress)
    ));
    assert!(matches!(
        first.claim(&key, b"other").await,
        Ok(Claim::Mismatch)
    ));
    // Given up (it could not look yet): unsure again, not forgotten.
    drop(held);
    support::wait_until("the key is unsure again", || async {
        match first.claim(&key, b"body").await {
            Ok(Claim::Unsure(held, _)) => {
                std::mem::forget(held); // This holder dies, holding it.
                true
            }
            _ => false,
        }
    })
    .await;
    // Its lease (IDEMPOTENCY_CLAIM_TTL) ends; the note is still there for the next retry.
    let (held, note) = taken_over_after_its_lease(&retry, &key).await;
    assert_eq!(note, "0 7 1 1700 p#1");
    held.finish(Bytes::from_static(b"{\"found\":true}")).await;
    assert!(matches!(
        first.claim(&key, b"body").await,
        Ok(Claim::Replay(answer)) if answer == "{\"found\":true}"
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_before_it_remembered_an_acknowledged_batch_leaves_it_on_the_topic_once() {
    let redis = Redis::start(&[]);
    let proxy = Proxy::start(redis.port).await;
    let tansu = Tansu::start();
    tansu.create_topic("killed", 1).await;
    let quick = [
        ("KAFKA_DELIVERY_TIMEOUT", "1s"),
        ("IDEMPOTENCY_CLAIM_TTL", "2s"),
    ];
    let first = replica_via(&tansu, proxy.port, "killed", &quick);
    let second = replica_with(&tansu, &redis, "killed", &quick);
    let (body, key) = (batch("buy", 2), [("idempotency-key", "order-k")]);
    // The first replica's write of the batch's answer never reaches Redis: the broker
    // has the batch, the store does not know it was acknowledged.
    let digest = hex(&Sha256::digest(body.as_bytes()));
    proxy.stop_requests_containing(format!("D{digest}").as_bytes());
    let _ = tokio::time::timeout(Duration::from_millis(500), post(&first, &body, &key)).await;
    support::wait_until("the batch is on the topic", || async {
        with_key(&tansu, "killed", "127.0.0.1 order-k") == 1
    })
    .await;
    drop(first); // SIGKILL, before it remembered the answer.

    // Its claim ends; the retry on the other replica must find the batch, not send it
    // again.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut answer = post(&second, &body, &key).await;
    while answer.status != 202 && std::time::Instant::now() < deadline {
        assert!([409, 503].contains(&answer.status), "{}", answer.body);
        tokio::time::sleep(Duration::from_millis(250)).await;
        answer = post(&second, &body, &key).await;
    }
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert_eq!(with_key(&tansu, "killed", "127.0.0.1 order-k"), 1);
    let replay = post(&second, &body, &key).await;
    assert_eq!(replay.body, answer.body, "remembered since");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_outlives_a_holder_that_died_and_one_that_sent_nothing_is_undone() {
    let redis = Redis::start(&[]);
    let (first, retry) = (store(&redis).await, store(&redis).await);
    let key = idempotency::scoped("acme", "a1");
    let Ok(Claim::New(mut pending)) = first.claim(&key, b"body").await else {
        panic!("new")
    };
    pending
        .attempt("0 7 18446744073709551615 1700 p#1")
        .await
        .unwrap();
    // A refusal that sent nothing (a full queue, a broker known down) gives the key up.
    drop(pending);
    support::wait_until("the key is free again", || async {
        match first.claim(&key, b"body").await {
            Ok(Claim::New(mut pending)) => {
                pending
                    .attempt("0 9 18446744073709551615 1800 p#1")
                    .await
                    .unwrap();
                std::mem::forget(pending); // This holder dies after noting its attempt.
                true
            }
            _ => false,
        }
    })
    .await;
    // Its lease (IDEMPOTENCY_CLAIM_TTL) ends: the retry gets the attempt's note.
    let (mut held, note) = taken_over_after_its_lease(&retry, &key).await;
    assert_eq!(note, "0 9 18446744073709551615 1800 p#1");
    // The retry's own attempt, refused unsent, leaves the key unsure with the note it had.
    held.attempt("0 12 18446744073709551615 1900 p#2")
        .await
        .unwrap();
    drop(held);
    support::wait_until("the key is unsure again", || async {
        matches!(first.claim(&key, b"body").await,
            Ok(Claim::Unsure(_, note)) if note == "0 9 18446744073709551615 1800 p#1")
    })
    .await;
}
