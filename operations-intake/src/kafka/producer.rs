//! The producer in use, and its replacement when it cannot go on: a transaction that did
//! not commit (see [`super::commit`]); a fatal error; a delivery failed because the broker
//! no longer accepts its producer id or epoch (fenced, unknown producer id, sequence out
//! of order); or the epoch bumped again and again with nothing acknowledged.
//!
//! librdkafka answers a timed-out batch in flight, or an unknown producer id, by bumping
//! the epoch itself, which a broker that did not hand out that epoch (tansu) fences, and
//! one that lost the producer id answers again and again. A fresh producer is accepted
//! at once: so the service makes one, with the same transactional id, and its first
//! `init_transactions` fences the one before (recorded here, for the retries waiting on
//! it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use rdkafka::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, Producer, PurgeConfig};
use serde::Deserialize;

use super::{BrokerHealth, down};

/// The wait after a first replacement before another one; it doubles while new producers
/// keep failing, up to [`MAX_BACKOFF`], and starts over once the broker is seen healthy.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Epoch bumps without an acknowledgement after which the producer is deemed stuck. One
/// bump follows each timed-out or refused batch; a producer whose id the broker lost
/// bumps about ten times a second.
const MAX_BUMPS_WITHOUT_ACK: i64 = 5;

/// How often librdkafka reports the statistics the bumps are read from, unless
/// `statistics.interval.ms` is among the extra properties.
pub(super) const STATISTICS_INTERVAL_MS: &str = "1000";

/// Whether a delivery failed with `code` because the producer's id or epoch is no longer
/// usable: librdkafka fails every later batch the same way (or has raised a fatal error),
/// while a new producer, with a new id, is accepted.
pub(super) fn lost_producer_state(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::UnknownProducerId
            | RDKafkaErrorCode::OutOfOrderSequenceNumber
            | RDKafkaErrorCode::InvalidProducerIdMapping
            | RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::Fatal
            | RDKafkaErrorCode::GaplessGuarantee
    )
}

/// One producer and its number; each replacement has the next number.
pub(super) struct Generation {
    pub(super) number: u64,
    pub(super) producer: FutureProducer<Context>,
    bumps: Arc<Bumps>,
    /// Whether `init_transactions` succeeded.
    transactions: AtomicBool,
    /// Whether its transactions are initialised and the topic's ends known, so it may
    /// produce.
    ready: AtomicBool,
}

impl Generation {
    /// Initialises its transactions unless that already succeeded. What follows it (the
    /// topic's metadata) can fail, and the whole is then tried again; librdkafka refuses
    /// a second `init_transactions` ("Operation not valid in state Ready"), which would
    /// keep the producer from ever being ready. Blocks.
    pub(super) fn init_transactions_once(&self, timeout: Duration) -> KafkaResult<()> {
        if !self.transactions.load(Ordering::Acquire) {
            self.producer.init_transactions(timeout)?;
            self.transactions.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Whether its transactions are initialised, so it may produce.
    pub(super) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Records that its transactions are initialised.
    pub(super) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Records an acknowledged delivery: the epoch bumps so far are forgiven.
    pub(super) fn acknowledged(&self) {
        self.bumps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .acknowledged = true;
    }
}

/// The producer id and epoch from which bumps are counted.
#[derive(Default)]
struct Baseline {
    since: Option<(i64, i64)>,
    acknowledged: bool,
    /// Whether the broker was last seen down: the next count while up starts over.
    down: bool,
}

type Bumps = Mutex<Baseline>;

/// The epoch bumps of `producer_id` seen while the broker is `up`, since the baseline,
/// which starts over after an acknowledgement, with a new producer id, and while the
/// broker is down and when it is seen up again: the batches that timed out during an
/// outage bump the epoch for a reason of their own, and must not condemn the producer
/// once the broker is back.
fn count_bumps(bumps: &Bumps, producer_id: i64, epoch: i64, up: bool) -> i64 {
    let mut baseline = bumps.lock().unwrap_or_else(PoisonError::into_inner);
    match baseline.since {
        Some((id, first))
            if up && !baseline.down && id == producer_id && !baseline.acknowledged =>
        {
            epoch - first
        }
        _ => {
            *baseline = Baseline {
                since: Some((producer_id, epoch)),
                acknowledged: false,
                down: !up,
            };
            0
        }
    }
}

/// The part of librdkafka's statistics read here.
#[derive(Deserialize)]
struct Statistics {
    eos: Option<Eos>,
}

#[derive(Deserialize)]
struct Eos {
    producer_id: i64,
    producer_epoch: i64,
}

/// The broker's health and the replacement state, shared with every producer's context.
pub(super) struct Shared {
    pub(super) health: ArcSwap<BrokerHealth>,
    state: Mutex<State>,
    /// The latest generation whose transactions were initialised: every generation
    /// before it is fenced, and can no longer write to the topic.
    fenced_before: AtomicU64,
}

struct State {
    /// The generation in use.
    current: u64,
    /// Why it must be replaced, once it must.
    unusable: Option<String>,
    /// No replacement before this.
    not_before: Instant,
    /// The wait after the next replacement.
    backoff: Duration,
}

impl Shared {
    pub(super) fn new(health: BrokerHealth) -> Shared {
        Shared {
            health: ArcSwap::from_pointee(health),
            state: Mutex::new(State {
                current: 0,
                unusable: None,
                not_before: Instant::now(),
                backoff: FIRST_BACKOFF,
            }),
            fenced_before: AtomicU64::new(0),
        }
    }

    /// Records that generation `number` initialised its transactions, fencing every
    /// generation before it.
    pub(super) fn fenced(&self, number: u64) {
        self.fenced_before.fetch_max(number, Ordering::AcqRel);
    }

    /// Whether generation `number` can no longer write to the topic.
    pub(super) fn is_fenced(&self, number: u64) -> bool {
        self.fenced_before.load(Ordering::Acquire) > number
    }

    /// Whether generation `number` is in use and not condemned.
    pub(super) fn usable(&self, number: u64) -> bool {
        let state = self.lock();
        state.current == number && state.unusable.is_none()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks generation `number` for replacement and the service down, with `why`; only
    /// the first reason for the generation in use counts.
    pub(super) fn condemn(&self, number: u64, why: &str) {
        let mut state = self.lock();
        if state.current != number || state.unusable.is_some() {
            return;
        }
        let reason = format!("the Kafka producer cannot continue ({why}); it is being replaced");
        tracing::debug!(reason, generation = number, "Kafka producer unusable");
        self.health.rcu(|h| down(h, reason.clone()));
        state.unusable = Some(reason);
    }

    /// Stores a probe's answer, made with generation `number`, unless that generation is
    /// unusable or gone, or the health changed since `seen` (newer news wins). Whether it
    /// was stored.
    pub(super) fn store_probe(
        &self,
        number: u64,
        seen: &Arc<BrokerHealth>,
        next: BrokerHealth,
    ) -> bool {
        let mut state = self.lock();
        if state.current != number || state.unusable.is_some() {
            return false;
        }
        let up = next.is_up();
        let previous = self.health.compare_and_swap(seen, Arc::new(next));
        let stored = Arc::ptr_eq(&previous, seen);
        if stored && up {
            state.backoff = FIRST_BACKOFF;
        }
        stored
    }

    fn is_current(&self, number: u64) -> bool {
        self.lock().current == number
    }
}

/// Records the global errors a producer reports between probes, and counts its epoch
/// bumps in its statistics.
pub(super) struct Context {
    shared: Arc<Shared>,
    generation: u64,
    bumps: Arc<Bumps>,
}

impl ClientContext for Context {
    fn stats_raw(&self, statistics: &[u8]) {
        let Ok(Statistics { eos: Some(eos) }) = serde_json::from_slice(statistics) else {
            return;
        };
        if eos.producer_id < 0 {
            return;
        }
        // While the broker is down, timed-out batches bump the epoch for a reason of its own:
        // only the bumps seen since the broker was last seen up again count.
        let up = self.shared.health.load().is_up();
        let bumps = count_bumps(&self.bumps, eos.producer_id, eos.producer_epoch, up);
        if bumps >= MAX_BUMPS_WITHOUT_ACK && up {
            self.shared.condemn(
                self.generation,
                &format!(
                    "librdkafka bumped its epoch {bumps} times with nothing acknowledged while the broker was up: the broker keeps refusing its producer id, as after an unknown producer id"
                ),
            );
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(%error, reason, generation = self.generation, "Kafka client error");
        // A replaced producer finishing its last deliveries says nothing of the broker.
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown)
            && self.shared.is_current(self.generation)
        {
            self.shared
                .health
                .rcu(|h| down(h, format!("all brokers are down: {reason}")));
        }
    }
}

/// The producer in use, made again from the same configuration when it cannot go on.
pub(super) struct Producers {
    config: ClientConfig,
    current: ArcSwap<Generation>,
    shared: Arc<Shared>,
    /// How long a replaced producer has to finish the deliveries in flight.
    retire_timeout: Duration,
}

impl Producers {
    pub(super) fn new(
        config: ClientConfig,
        shared: Arc<Shared>,
        retire_timeout: Duration,
    ) -> KafkaResult<Producers> {
        let first = create(&config, &shared, 0)?;
        Ok(Producers {
            config,
            current: ArcSwap::from_pointee(first),
            shared,
            retire_timeout,
        })
    }

    /// The producer in use.
    pub(super) fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Condemns `generation` when its producer raised a fatal error, or when `error` (a
    /// failed send or delivery) shows that its producer id or epoch is lost.
    pub(super) fn check(&self, generation: &Generation, error: Option<&KafkaError>) {
        let why = match generation.producer.client().fatal_error() {
            Some((code, text)) => format!("fatal producer error {code:?}: {text}"),
            None => match error {
                Some(e) if e.rdkafka_error_code().is_some_and(lost_producer_state) => e.to_string(),
                _ => return,
            },
        };
        self.shared.condemn(generation.number, &why);
    }

    /// Replaces a condemned producer with a new one made from the same configuration,
    /// unless the last replacement was too recent. Whether the producer in use is (or
    /// was, until now) unusable, so that the service stays down until the next probe.
    pub(super) fn replace_if_unusable(&self) -> bool {
        let mut state = self.shared.lock();
        let Some(reason) = state.unusable.clone() else {
            return false;
        };
        let now = Instant::now();
        if now < state.not_before {
            return true;
        }
        let number = state.current + 1;
        state.not_before = now + state.backoff;
        match create(&self.config, &self.shared, number) {
            Ok(generation) => {
                let old = self.current.swap(Arc::new(generation));
                state.current = number;
                state.unusable = None;
                state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
                tracing::warn!(
                    reason,
                    generation = number,
                    "replaced the Kafka producer with a new one; batches still in flight on the old one are answered 503 with their id to retry with"
                );
                retire(old, self.retire_timeout);
            }
            Err(error) => {
                tracing::error!(%error, reason, "cannot create a new Kafka producer; will try again");
            }
        }
        true
    }
}

fn create(config: &ClientConfig, shared: &Arc<Shared>, number: u64) -> KafkaResult<Generation> {
    let bumps = Arc::new(Bumps::default());
    let producer = config.create_with_context(Context {
        shared: shared.clone(),
        generation: number,
        bumps: bumps.clone(),
    })?;
    Ok(Generation {
        number,
        producer,
        bumps,
        transactions: AtomicBool::new(false),
        ready: AtomicBool::new(false),
    })
}

/// Fails the batches still queued or in flight on a replaced producer (they are answered
/// 503, "may or may not have been recorded", with the id to retry with), then closes it,
/// on a thread of its own: closing a client blocks, and requests may still hold it.
fn retire(old: Arc<Generation>, timeout: Duration) {
    let closing = move || {
        old.producer
            .purge(PurgeConfig::default().queue().inflight());
        if let Err(error) = old.producer.flush(timeout) {
            tracing::warn!(%error, generation = old.number, "the replaced Kafka producer did not report every delivery");
        }
        let mut old = old;
        loop {
            match Arc::try_unwrap(old) {
                Ok(generation) => return drop(generation),
                Err(held) => old = held,
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    if let Err(error) = std::thread::Builder::new()
        .name("kafka-retire".to_owned())
        .spawn(closing)
    {
        tracing::error!(%error, "cannot start a thread to close the replaced Kafka producer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        Shared::new(BrokerHealth {
            status: "UP",
            bootstrap_servers: "b:9092".to_owned(),
            topic: "t".to_owned(),
            partitions: Some(1),
            reason: None,
        })
    }

    #[test]
    fn epoch_bumps_count_from_the_last_acknowledgement_and_producer_id() {
        let bumps = Bumps::default();
        assert_eq!(count_bumps(&bumps, 7, 0, true), 0);
        assert_eq!(count_bumps(&bumps, 7, 3, true), 3);
        bumps.lock().unwrap().acknowledged = true;
        assert_eq!(count_bumps(&bumps, 7, 4, true), 0);
        assert_eq!(count_bumps(&bumps, 7, 9, true), 5);
        assert_eq!(
            count_bumps(&bumps, 8, 0, true),
            0,
            "a new producer id starts over"
        );
        assert_eq!(count_bumps(&bumps, 8, 2, true), 2);
    }

    #[test]
    fn epoch_bumps_while_the_broker_is_down_do_not_count_once_it_is_up() {
        let bumps = Bumps::default();
        assert_eq!(count_bumps(&bumps, 7, 0, true), 0);
        assert_eq!(count_bumps(&bumps, 7, 2, true), 2);
        // An outage: timed-out batches bump the epoch, which is not counted.
        assert_eq!(count_bumps(&bumps, 7, 4, false), 0);
        assert_eq!(count_bumps(&bumps, 7, 9, false), 0);
        // Bumps between the last report while down and the first while up are not either.
        assert_eq!(count_bumps(&bumps, 7, 12, true), 0, "up again: starts over");
        assert_eq!(count_bumps(&bumps, 7, 13, true), 1);
        assert_eq!(
            count_bumps(&bumps, 7, 12 + MAX_BUMPS_WITHOUT_ACK, true),
            MAX_BUMPS_WITHOUT_ACK,
            "bumps while up still count"
        );
    }

    #[test]
    fn a_producer_that_bumped_during_an_outage_is_not_condemned_once_the_broker_is_up() {
        let shared = Arc::new(shared());
        let context = Context {
            shared: shared.clone(),
            generation: 0,
            bumps: Arc::new(Bumps::default()),
        };
        let report = |epoch: i64| {
            context.stats_raw(
                format!(r#"{{"eos":{{"producer_id":7,"producer_epoch":{epoch}}}}}"#).as_bytes(),
            );
        };
        report(0);
        let seen = shared.health.load_full();
        shared
            .health
            .rcu(|h| down(h, "all brokers are down".to_owned()));
        for epoch in 1..=20 {
            report(epoch);
        }
        let down_health = shared.health.load_full();
        assert_ne!(down_health.status, seen.status);
        assert!(shared.store_probe(0, &down_health, (*seen).clone()));
        report(25);
        report(25 + MAX_BUMPS_WITHOUT_ACK - 1);
        assert!(shared.health.load().is_up(), "not condemned for the outage");
        assert!(shared.lock().unusable.is_none());
        report(25 + MAX_BUMPS_WITHOUT_ACK);
        assert!(
            shared.lock().unusable.is_some(),
            "bumps while up condemn it"
        );
        assert_eq!(shared.health.load().status, "DOWN");
    }

    #[test]
    fn only_errors_that_lose_the_producer_id_condemn_it() {
        for code in [
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::InvalidProducerEpoch,
            RDKafkaErrorCode::UnknownProducerId,
            RDKafkaErrorCode::OutOfOrderSequenceNumber,
            RDKafkaErrorCode::Fatal,
        ] {
            assert!(lost_producer_state(code), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::QueueFull,
        ] {
            assert!(!lost_producer_state(code), "{code:?}");
        }
    }

    #[test]
    fn a_condemned_producer_keeps_the_service_down_with_the_first_reason() {
        let shared = shared();
        shared.condemn(1, "not the generation in use");
        assert!(shared.health.load().is_up());

        shared.condemn(0, "ProducerFenced");
        shared.condemn(0, "a later error");
        let health = shared.health.load_full();
        assert_eq!(health.status, "DOWN");
        let reason = health.reason.clone().unwrap();
        assert!(reason.contains("ProducerFenced"), "{reason}");
        assert!(!reason.contains("later"), "{reason}");

        let up = BrokerHealth {
            status: "UP",
            reason: None,
            ..(*health).clone()
        };
        assert!(!shared.store_probe(0, &health, up), "no UP while condemned");
        assert_eq!(shared.health.load().status, "DOWN");
    }
}
