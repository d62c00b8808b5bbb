//! Batches reach the topic in transactions: the batches waiting when a transaction ends
//! go together in the next one (a group commit), so a transaction costs its round trips
//! once for many batches.
//!
//! Transactions are what make a retry safe. When a transaction does not commit in time,
//! its batches may or may not be on the topic, and a request the broker has not read yet
//! may still land there later. The producer is then replaced, and the new one's
//! `init_transactions` (same `transactional.id`) fences the old epoch: the broker refuses
//! whatever the old producer still sends, and ends its open transaction. From that point,
//! what the partition holds is final, and a retry reads it back before producing again
//! (see [`super::readback`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer};
use tokio::sync::{mpsc, oneshot};

use super::producer::{Generation, Producers, Shared};
use super::{Ack, ProduceError, Unsettled, refused, up};

/// Most batches in one transaction.
const MAX_GROUP: usize = 512;

/// The least time a commit is given, even when its deliveries took the whole delivery
/// timeout.
const MIN_COMMIT_TIMEOUT: Duration = Duration::from_millis(500);

/// How often the committer looks for a producer to initialise while no batch comes, so
/// a replaced producer fences its predecessor without waiting for traffic.
const IDLE_TICK: Duration = Duration::from_millis(200);

/// One batch waiting for a transaction.
pub(super) struct Job {
    pub(super) value: Bytes,
    pub(super) key: String,
    pub(super) headers: OwnedHeaders,
    pub(super) partition: i32,
    /// The first offset the batch can have on its partition (see [`Bounds`]).
    pub(super) from: i64,
    pub(super) reply: oneshot::Sender<Result<Ack, ProduceError>>,
    /// Whether a transaction took it, or its request gave up waiting.
    pub(super) taken: Arc<Taken>,
}

/// Whether a queued batch was taken into a transaction, or given up by its request
/// (which then answers that nothing was sent): whichever comes first.
#[derive(Default)]
pub(super) struct Taken(AtomicU8);

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const GIVEN_UP: u8 = 2;

impl Taken {
    /// Marks the batch taken; `false` when its request gave it up.
    fn take(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the batch up; `false` when a transaction took it already.
    pub(super) fn give_up(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Per partition, an offset no batch sent from now on can be below: the offset after
/// the last one acknowledged, or the end of the partition when the producer was
/// initialised (0 when unknown). A retry reads the partition back from there.
#[derive(Default)]
pub(super) struct Bounds(Mutex<HashMap<i32, i64>>);

impl Bounds {
    /// The bound for `partition` (0, its start, when nothing is known yet).
    pub(super) fn get(&self, partition: i32) -> i64 {
        let bounds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        bounds.get(&partition).copied().unwrap_or(0)
    }

    /// Starts over from the partitions' `ends`, as a new producer found them: after a
    /// broker restart that lost the topic, or its recreation, the old bounds are too high.
    fn reset(&self, ends: Vec<(i32, i64)>) {
        let mut bounds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *bounds = ends.into_iter().collect();
    }

    /// Raises the bound of `partition` to `next` if it is higher.
    fn raise(&self, partition: i32, next: i64) {
        let mut bounds = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let bound = bounds.entry(partition).or_default();
        *bound = (*bound).max(next);
    }
}

/// What the committer needs of the producer side.
pub(super) struct Committer {
    pub(super) producers: Arc<Producers>,
    pub(super) shared: Arc<Shared>,
    pub(super) bounds: Arc<Bounds>,
    pub(super) topic: String,
    /// How long a transaction (and an initialisation) may take.
    pub(super) timeout: Duration,
    /// Who sends, as [`Unsettled::producer`] names it.
    pub(super) identity: String,
}

impl Committer {
    /// Commits the batches sent to `jobs` until every sender is gone.
    pub(super) async fn run(self, mut jobs: mpsc::Receiver<Job>) {
        loop {
            let ready = self.ready().await.is_some();
            let first = tokio::select! {
                job = jobs.recv() => job,
                () = tokio::time::sleep(IDLE_TICK), if !ready => continue,
            };
            let Some(first) = first else { return };
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match jobs.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            self.commit(group).await;
        }
    }

    /// Whether the producer in use has initialised its transactions, initialising them
    /// if not (and if it is not condemned). Its first successful initialisation fences
    /// every producer before it.
    async fn ready(&self) -> Option<Arc<Generation>> {
        let generation = self.producers.current();
        if !self.shared.usable(generation.number) {
            return None;
        }
        if generation.is_ready() {
            return Some(generation);
        }
        let (initialising, timeout) = (generation.clone(), self.timeout);
        let topic = self.topic.clone();
        let outcome =
            tokio::task::spawn_blocking(move || initialise(&initialising, &topic, timeout)).await;
        match outcome {
            Ok(Ok((partitions, ends))) => {
                self.bounds.reset(ends);
                generation.set_ready();
                self.shared.fenced(generation.number);
                tracing::debug!(
                    generation = generation.number,
                    "transactional producer ready"
                );
                // The broker answered: a replacement need not wait for the next probe.
                let seen = self.shared.health.load_full();
                if !seen.is_up() && partitions > 0 {
                    self.shared
                        .store_probe(generation.number, &seen, up(&seen, partitions));
                }
                Some(generation)
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, generation = generation.number, "cannot initialise the transactional producer yet");
                self.producers.check(&generation, Some(&error));
                None
            }
            Err(error) => {
                tracing::error!(%error, "the producer initialisation panicked");
                None
            }
        }
    }

    /// Produces `group` in one transaction and answers each batch.
    async fn commit(&self, group: Vec<Job>) {
        let Some(generation) = self.ready().await else {
            let why = self.shared.health.load().reason.clone();
            let why = why.unwrap_or_else(|| "the producer is not ready".to_owned());
            for job in group {
                let _ = job.reply.send(Err(ProduceError::Unavailable(why.clone())));
            }
            return;
        };
        if let Err(error) = generation.producer.begin_transaction() {
            self.condemn(&generation, &error);
            for job in group {
                let _ = job
                    .reply
                    .send(Err(ProduceError::Unavailable(error.to_string())));
            }
            return;
        }
        let started = Instant::now();
        let mut sent = Vec::new();
        // Each delivery is awaited before the commit: librdkafka's commit would wait for
        // them too, but only as fast as the binding's poll loop hands them over (100 ms).
        for (batch, delivery) in self.send(&generation, group) {
            let delivered = match delivery.await {
                Ok(Ok(done)) => Ok(Ack {
                    partition: done.partition,
                    offset: done.offset,
                }),
                Ok(Err((error, _))) => Err(error),
                Err(_) => Err(KafkaError::Canceled),
            };
            sent.push(Sent { delivered, ..batch });
        }
        let committed = match sent.iter().find_map(|batch| batch.delivered.as_ref().err()) {
            Some(error) => Err(error.clone()),
            None => {
                let committing = generation.clone();
                let left = self.timeout.saturating_sub(started.elapsed());
                let timeout = left.max(MIN_COMMIT_TIMEOUT);
                tokio::task::spawn_blocking(move || commit_delivered(&committing, timeout))
                    .await
                    .unwrap_or(Err(KafkaError::Canceled))
            }
        };
        match committed {
            Ok(()) => self.acknowledge(&generation, sent),
            Err(error) => {
                self.condemn(&generation, &error);
                self.unsettle(&generation, sent, &error);
            }
        }
    }

    /// Queues each batch in the open transaction; a batch librdkafka would not queue is
    /// answered at once (nothing of it was sent).
    fn send(&self, generation: &Generation, group: Vec<Job>) -> Vec<(Sent, DeliveryFuture)> {
        let mut sent = Vec::with_capacity(group.len());
        for job in group.into_iter().filter(|job| job.taken.take()) {
            let record = FutureRecord::to(&self.topic)
                .partition(job.partition)
                .key(&job.key)
                .payload(&job.value[..])
                .headers(job.headers);
            match generation.producer.send_result(record) {
                Ok(delivery) => sent.push((
                    Sent {
                        reply: job.reply,
                        partition: job.partition,
                        from: job.from,
                        delivered: Err(KafkaError::Canceled),
                    },
                    delivery,
                )),
                Err((error, _)) => {
                    let _ = job.reply.send(Err(refused(&error)));
                }
            }
        }
        sent
    }

    /// Answers the batches of a committed transaction with where they landed.
    fn acknowledge(&self, generation: &Generation, sent: Vec<Sent>) {
        generation.acknowledged();
        for batch in sent {
            if let Ok(ack) = &batch.delivered {
                self.bounds.raise(ack.partition, ack.offset + 1);
            }
            let answer = batch.delivered.map_err(|error| {
                ProduceError::Unacknowledged(
                    error.to_string(),
                    self.unsettled(generation, batch.partition, batch.from),
                )
            });
            let _ = batch.reply.send(answer);
        }
    }

    /// Answers the batches of a transaction that did not commit: each may or may not be
    /// on the topic, except one the broker refused as too large.
    fn unsettle(&self, generation: &Generation, sent: Vec<Sent>, error: &KafkaError) {
        tracing::warn!(%error, batches = sent.len(), generation = generation.number, "a transaction did not commit; its batches are answered 503 and the producer is replaced");
        for batch in sent {
            let answer = match &batch.delivered {
                Err(refusal)
                    if refusal.rdkafka_error_code()
                        == Some(RDKafkaErrorCode::MessageSizeTooLarge) =>
                {
                    ProduceError::TooLarge(refusal.to_string())
                }
                _ => ProduceError::Unacknowledged(
                    error.to_string(),
                    self.unsettled(generation, batch.partition, batch.from),
                ),
            };
            let _ = batch.reply.send(Err(answer));
        }
    }

    /// Condemns `generation` and replaces it at once, so that the new producer fences
    /// it as soon as the broker answers (the probe would replace it a second later).
    fn condemn(&self, generation: &Generation, error: &KafkaError) {
        self.producers.check(generation, Some(error));
        self.shared.condemn(
            generation.number,
            &format!("a transaction did not complete: {error}"),
        );
        self.producers.replace_if_unusable();
    }

    fn unsettled(&self, generation: &Generation, partition: i32, from: i64) -> Unsettled {
        let since_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Unsettled {
            partition,
            from,
            generation: generation.number,
            since_ms,
            producer: self.identity.clone(),
        }
    }
}

/// Commits `generation`'s open transaction, whose deliveries were all reported. Blocks.
///
/// The binding's poll thread wakes a delivery's future before it frees the message, and
/// the binding's commit flushes first: a flush that finds a message not yet freed polls
/// the event queue itself for up to 100 ms, racing the poll thread for reports that
/// never come (one commit in a few hundred took 100 ms more). So the commit waits for
/// the poll thread to free every message first, which takes microseconds.
fn commit_delivered(generation: &Generation, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    while generation.producer.in_flight_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(20));
    }
    let left = deadline.saturating_duration_since(Instant::now());
    generation.producer.commit_transaction(left)
}

/// Initialises `generation`'s transactions (which fences the producers before it), then
/// finds the topic's partitions and where each ends: nothing sent from now on can be
/// below. Blocks.
fn initialise(
    generation: &Generation,
    topic: &str,
    timeout: Duration,
) -> Result<(usize, Vec<(i32, i64)>), KafkaError> {
    generation.init_transactions_once(timeout)?;
    let client = generation.producer.client();
    let metadata = client.fetch_metadata(Some(topic), timeout)?;
    let partitions = metadata
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len());
    let ends = (0..partitions)
        .filter_map(|p| i32::try_from(p).ok())
        .filter_map(|p| Some((p, client.fetch_watermarks(topic, p, timeout).ok()?.1)))
        .collect();
    Ok((partitions, ends))
}

/// A batch queued in the open transaction, and how its delivery went.
struct Sent {
    reply: oneshot::Sender<Result<Ack, ProduceError>>,
    partition: i32,
    from: i64,
    delivered: Result<Ack, KafkaError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_batch_is_taken_or_given_up_never_both() {
        let taken = Taken::default();
        assert!(taken.take());
        assert!(!taken.give_up(), "taken: its request waits for the answer");
        let given_up = Taken::default();
        assert!(given_up.give_up());
        assert!(!given_up.take(), "given up: not sent");
    }

    #[test]
    fn bounds_only_rise_until_a_new_producer_starts_them_over() {
        let bounds = Bounds::default();
        assert_eq!(bounds.get(0), 0, "unknown: the partition's start");
        bounds.raise(0, 10);
        bounds.raise(0, 7);
        assert_eq!(bounds.get(0), 10);
        bounds.reset(vec![(1, 4)]);
        assert_eq!((bounds.get(0), bounds.get(1)), (0, 4));
    }

    /// The topic's metadata can fail to come after `init_transactions` succeeded (a
    /// broker's transport failing in between, as a CI run once saw): the initialisation
    /// is tried again, and must not ask for the transactions a second time, which
    /// librdkafka refuses, leaving the producer never ready.
    #[test]
    fn an_initialisation_tried_again_after_its_transactions_succeeds() {
        let tansu = ratelimit_tests::intake::Tansu::start();
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", tansu.bootstrap())
            .set("transactional.id", "initialised-twice");
        let health = crate::kafka::BrokerHealth {
            status: "UP",
            bootstrap_servers: tansu.bootstrap(),
            topic: "t".to_owned(),
            partitions: None,
            reason: None,
        };
        let shared = Arc::new(Shared::new(health));
        let retire = Duration::from_secs(1);
        let generation = Producers::new(config, shared, retire).unwrap().current();
        let timeout = Duration::from_secs(30);
        initialise(&generation, "t", timeout).expect("the first initialisation");
        initialise(&generation, "t", timeout).expect("the same, tried again");
    }
}
