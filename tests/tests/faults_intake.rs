//! The intake under faults, with a checker (`ratelimit_tests::faults::intake`): callers
//! post batches with `Idempotency-Key`s and retry 503s (and dropped connections, and 409s
//! while their key is in flight) with the same key while a real tansu broker is paused,
//! or killed and started again, or while one of two replicas sharing a Redis
//! idempotency store is killed and started again; the topic is read back by an
//! independent client. Every batch answered 2xx is on it exactly once, no batch answered
//! only 4xx is on it, and a batch that ended unsure is on it at most once. The pause also
//! checks the case that used to break: a batch answered 503 (the broker did not
//! acknowledge in time) whose first produce lands after all, and whose retry with the
//! same key is answered 2xx, is on the topic once, not twice.

use std::time::Duration;

use ratelimit_tests::faults::intake::{
    Batch, Checked, DROPPED, Senders, check_topic, ids_on_topic,
};
use ratelimit_tests::faults::load::now_us;
use ratelimit_tests::faults::proxy::Proxy;
use ratelimit_tests::faults::run::micros;
use ratelimit_tests::faults::{Schedule, report};
use ratelimit_tests::intake::{Intake, Isolation, Tansu, free_port, read_topic_as};
use ratelimit_tests::kafka::{Kafka, Proxied};
use ratelimit_tests::sidecar::{Redis, eventually};

const TOPIC: &str = "faults";
/// How long a caller retries a 503 with the same key.
const RETRY_FOR: Duration = Duration::from_secs(30);

/// The topic read as a consumer of the intake's must read it: committed records only.
fn committed(tansu: &Tansu) -> (String, Isolation) {
    (tansu.bootstrap(), Isolation::ReadCommitted)
}

async fn broker_and_intake() -> (Tansu, Intake) {
    let tansu = Tansu::start();
    tansu.create_topic(TOPIC, 1).await;
    let bootstrap = tansu.bootstrap();
    let intake = Intake::start(&[
        ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
        ("KAFKA_TOPIC", TOPIC),
        ("KAFKA_DELIVERY_TIMEOUT", "1s"),
    ]);
    (tansu, intake)
}

/// Reads the topic as `isolation` says, checks the batches answered after `since`, and
/// reports; `intakes`: the replicas, whose logs are shown when a promise is broken, with
/// what the other isolation level shows.
fn check_and_report(
    name: &str,
    (bootstrap, isolation): (String, Isolation),
    intakes: &[&Intake],
    batches: &[Batch],
    since: u64,
) -> Checked {
    let (records, seen) = read_topic_as(&bootstrap, TOPIC, isolation);
    let values: Vec<Vec<u8>> = records.into_iter().map(|r| r.value).collect();
    let other = || {
        let other = isolation.other();
        let (records, shown) = read_topic_as(&bootstrap, TOPIC, other);
        let (read, also) = (values.len(), records.len());
        format!("{isolation:?}: {read} records, {seen}{other:?}: {also} records, {shown}")
    };
    let logs = || {
        intakes
            .iter()
            .map(|i| i.log())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let checked = check_topic(batches, &ids_on_topic(&values), since)
        .unwrap_or_else(|broken| panic!("{name}:\n{}\n{}{}", broken.join("\n"), other(), logs()));
    let unsure_answers = batches
        .iter()
        .flat_map(|b| &b.attempts)
        .filter(|a| a.2 == 503 || a.2 == DROPPED)
        .count();
    assert!(
        unsure_answers > 0,
        "{name}: the fault refused no batch: it was not under load"
    );
    assert!(
        checked.accepted > 0,
        "{name}: nothing accepted after the fault: {checked:?}"
    );
    let worst = batches
        .iter()
        .flat_map(|b| &b.attempts)
        .map(|a| a.1 - a.0)
        .max()
        .unwrap_or(0);
    // Retries whose first attempt had landed after all, answered from the topic.
    let found = logs()
        .matches("an unacknowledged batch was on the topic")
        .count();
    report(&format!(
        "| {name} | {} batches checked | {} accepted ({} after retries, {found} of them found on the topic), {} refused 4xx (none on the topic), {} ended unsure ({} on the topic), {unsure_answers} answers 503 or dropped; lost 0, duplicated 0; worst answer {} ms |",
        checked.batches,
        checked.accepted,
        checked.retried,
        checked.refused,
        checked.unsure,
        checked.unsure_on_topic,
        worst / 1_000
    ));
    checked
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_across_a_broker_pause_are_on_the_topic_once() {
    let schedule = Schedule::from_env();
    let (tansu, intake) = broker_and_intake().await;
    let senders = Senders::start(
        &[intake.url("/operations")],
        4 * u64::from(schedule.scale),
        RETRY_FOR,
    );
    tokio::time::sleep(schedule.before).await;
    tansu.pause();
    tokio::time::sleep(schedule.fault).await;
    tansu.resume();
    tokio::time::sleep(schedule.after).await;
    let batches = senders.stop().await;
    let checked = check_and_report(
        "intake: broker SIGSTOP",
        committed(&tansu),
        &[&intake],
        &batches,
        0,
    );
    // The batches in flight at the pause are answered 503 and retried: those are the
    // ones whose first produce may land late, the case this test is about.
    assert!(
        checked.retried > 0,
        "no batch was answered 2xx after a 503: {checked:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_across_a_broker_restart_are_on_the_new_topic_once() {
    let schedule = Schedule::from_env();
    let (mut tansu, intake) = broker_and_intake().await;
    let senders = Senders::start(
        &[intake.url("/operations")],
        4 * u64::from(schedule.scale),
        RETRY_FOR,
    );
    tokio::time::sleep(schedule.before).await;
    tansu.stop();
    tokio::time::sleep(schedule.fault).await;
    // tansu keeps its messages in memory: the new broker starts empty, and what it holds
    // from here on is checked.
    tansu.start_again();
    let since = now_us();
    tansu.create_topic(TOPIC, 1).await;
    tokio::time::sleep(schedule.after).await;
    let batches = senders.stop().await;
    check_and_report(
        "intake: broker killed and started again",
        committed(&tansu),
        &[&intake],
        &batches,
        since,
    );
}

/// A replica of two sharing the Redis on `redis` as their idempotency store, `name` its
/// transactional id, on `port`, producing to the broker at `bootstrap`.
fn replica(bootstrap: &str, redis: u16, name: &str, port: u16) -> Intake {
    let url = format!("redis://127.0.0.1:{redis}");
    Intake::start_on(
        port,
        &[
            ("KAFKA_BOOTSTRAP_SERVERS", bootstrap),
            ("KAFKA_TOPIC", TOPIC),
            ("KAFKA_DELIVERY_TIMEOUT", "1s"),
            ("KAFKA_TRANSACTIONAL_ID", name),
            ("IDEMPOTENCY_STORE", "redis"),
            ("IDEMPOTENCY_REDIS_URL", &url),
            // A claim the killed replica held is free again 4 s later.
            ("IDEMPOTENCY_CLAIM_TTL", "4s"),
            // Its calls held at the proxy wait until it is killed.
            ("IDEMPOTENCY_REDIS_TIMEOUT", "10s"),
        ],
    )
}

/// Two replicas sharing a Redis idempotency store, the callers spread over both; one is
/// killed (SIGKILL) while its batches wait for Redis to answer their claims (it reaches
/// Redis through a proxy that holds the answers back: the claims are made), and started
/// again on its port with its transactional id. A caller whose post dropped retries its
/// batch with the same key on the other replica: 409 while the dead replica's claim
/// lives, then accepted. The answers are held from a moment the replica has nothing in
/// flight, so none of its transactions is open at the kill: killed inside one, it
/// leaves it open, and tansu 0.6 neither times it out nor, once the restart fences it,
/// hides its aborted records from `read_committed` readers (docs/faults.md), so what
/// the topic held would be the broker's doing, not the intake's.
#[tokio::test(flavor = "multi_thread")]
async fn batches_across_a_replica_killed_are_on_the_topic_once() {
    let schedule = Schedule::from_env();
    let redis = Redis::start(&[]);
    let proxy = Proxy::start(redis.port).await;
    let tansu = Tansu::start();
    tansu.create_topic(TOPIC, 1).await;
    let port = free_port();
    let killed = replica(&tansu.bootstrap(), proxy.port, "faults-a", port);
    let other = replica(&tansu.bootstrap(), redis.port, "faults-b", free_port());
    let urls = [killed.url("/operations"), other.url("/operations")];
    let senders = Senders::start(&urls, 4 * u64::from(schedule.scale), RETRY_FOR);
    tokio::time::sleep(schedule.before).await;
    let idle = eventually(Duration::from_secs(5), || async {
        senders.in_flight(0) == 0
    });
    assert!(idle.await, "the replica to kill was never idle");
    proxy.hold();
    let waiting = eventually(Duration::from_secs(5), || async {
        senders.in_flight(0) > 0
    });
    assert!(waiting.await, "no batch went to the replica to kill");
    // Killed once a transaction it began before the hold has ended (committed, or failed
    // at KAFKA_DELIVERY_TIMEOUT): it can begin no other, each batch waiting for Redis to
    // answer its note first. Well before its Redis calls time out, which would release them.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let kill = now_us();
    drop(killed); // SIGKILL
    proxy.release();
    tokio::time::sleep(schedule.fault).await;
    let again = replica(&tansu.bootstrap(), proxy.port, "faults-a", port);
    tokio::time::sleep(schedule.after).await;
    let batches = senders.stop().await;
    let name = "intake: one of two replicas killed (SIGKILL) and started again";
    // Read whole, not as a consumer reads committed transactions: on tansu 0.6 the two
    // views differ only where its last stable offset sticks (docs/faults.md), which two
    // replicas committing at once and one restarted with a new epoch can make happen.
    let whole = (tansu.bootstrap(), Isolation::ReadUncommitted);
    let checked = check_and_report(name, whole, &[&again, &other], &batches, 0);
    // Batches the dead replica had claimed: refused while its claim lived, then accepted.
    let claimed = batches.iter().filter(|batch| {
        let dropped = batch.attempts.iter().any(|a| a.2 == DROPPED && a.0 < kill);
        let refused = batch.attempts.iter().any(|a| a.2 == 409);
        dropped && refused && (200..300).contains(&batch.last())
    });
    let claimed = claimed.count();
    println!("{claimed} batches claimed by the killed replica: 409 from the other, then 2xx");
    assert!(
        claimed > 0,
        "no batch claimed by the killed replica was accepted by the other: {checked:?}"
    );
    let to_again = batches
        .iter()
        .flat_map(|b| &b.attempts)
        .filter(|a| a.0 > kill + micros(schedule.fault) + 1_000_000 && (200..300).contains(&a.2));
    assert!(to_again.count() > 0, "no batch accepted after the restart");
}

/// librdkafka's `EndTxn` request: its API key (26) and the high byte of its version, as
/// they start the request's header.
const END_TXN: [u8; 3] = [0, 26, 0];

/// Two replicas sharing a Redis idempotency store, producing to Apache Kafka, the callers
/// spread over both. One reaches the broker through a proxy that stops its next commit
/// (`EndTxn`) under load: its transaction's batches are on the log, uncommitted, and it
/// is killed (SIGKILL) at once, inside that transaction. Kafka aborts it (at
/// `transaction.timeout.ms`, or when the replica starts again with its transactional id
/// and fences it). Read as a consumer reads (`read_committed`), every batch answered 2xx
/// is on the topic exactly once, and the killed transaction's batches, dropped and
/// retried on the other replica, are not on it twice.
#[tokio::test(flavor = "multi_thread")]
async fn batches_across_a_replica_killed_inside_a_transaction_are_on_kafka_once() {
    let schedule = Schedule::from_env();
    let redis = Redis::start(&[]);
    let listener = free_port();
    let proxy = Proxy::start(listener).await;
    let proxied = Proxied {
        listener,
        proxy: proxy.port,
    };
    let kafka = Kafka::start_with(Some(proxied));
    kafka.create_topic(TOPIC, 1).await;
    let port = free_port();
    let through_proxy = format!("127.0.0.1:{}", proxy.port);
    let killed = replica(&through_proxy, redis.port, "faults-a", port);
    let other = replica(&kafka.bootstrap(), redis.port, "faults-b", free_port());
    let urls = [killed.url("/operations"), other.url("/operations")];
    let senders = Senders::start(&urls, 8 * u64::from(schedule.scale), RETRY_FOR);
    tokio::time::sleep(schedule.before).await;
    proxy.stop_requests_containing(&END_TXN);
    let stopped = eventually(Duration::from_secs(5), || async { proxy.stopped() });
    assert!(stopped.await, "the replica to kill committed nothing");
    let kill = now_us();
    drop(killed); // SIGKILL, well before its commit times out
    tokio::time::sleep(schedule.fault).await;
    let again = replica(&through_proxy, redis.port, "faults-a", port);
    tokio::time::sleep(schedule.after).await;
    let batches = senders.stop().await;
    let name = "intake: one of two replicas killed (SIGKILL) inside a transaction, on Kafka";
    let read = (kafka.bootstrap(), Isolation::ReadCommitted);
    let checked = check_and_report(name, read, &[&again, &other], &batches, 0);
    // The transaction the kill left open had produced: its records are on the log,
    // aborted, and only a `read_uncommitted` reader sees them.
    let (whole, _) = read_topic_as(&kafka.bootstrap(), TOPIC, Isolation::ReadUncommitted);
    let (committed, _) = read_topic_as(&kafka.bootstrap(), TOPIC, Isolation::ReadCommitted);
    let aborted = whole.len() - committed.len();
    println!("{aborted} records aborted by the kill; {checked:?}");
    assert!(aborted > 0, "the kill left no aborted transaction");
    let retried = batches.iter().filter(|batch| {
        let killed = batch.attempts.iter().any(|a| a.2 == DROPPED && a.1 >= kill);
        killed && (200..300).contains(&batch.last())
    });
    assert!(
        retried.count() > 0,
        "no batch dropped by the kill was accepted on retry"
    );
}
