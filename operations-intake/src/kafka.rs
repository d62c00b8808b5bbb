//! The Kafka side: a transactional `acks=all` producer, replaced by a new one when it
//! cannot go on, a read-back of the topic for retries whose first attempt was not
//! acknowledged, and the broker's health as last seen by a background probe, so neither
//! `/health` nor a POST waits on a dead broker.

mod commit;
mod producer;
mod readback;
mod unsettled;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::Producer;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use commit::{Bounds, Committer, Job, Taken};
use producer::{Producers, Shared};
pub use unsettled::{BEFORE_SENDING, Unsettled};

/// How often the background probe asks the broker for metadata.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The broker as last seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BrokerHealth {
    /// `UP` or `DOWN`.
    pub status: &'static str,
    /// The bootstrap servers asked.
    pub bootstrap_servers: String,
    /// The topic produced to.
    pub topic: String,
    /// Its partition count, when it is up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions: Option<usize>,
    /// Why it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl BrokerHealth {
    /// Whether the last probe succeeded.
    pub fn is_up(&self) -> bool {
        self.status == "UP"
    }
}

/// Why a batch was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    /// The broker is known to be unreachable: nothing was sent.
    #[error("Kafka is unavailable ({0}); nothing was recorded")]
    Unavailable(String),
    /// The producer's local queue is full: nothing was sent.
    #[error("the producer queue is full; nothing was recorded")]
    QueueFull,
    /// The message is larger than the broker accepts: nothing was recorded.
    #[error("the batch is larger than the broker accepts ({0})")]
    TooLarge(String),
    /// Sent, but not acknowledged: the broker may or may not have it, at the place the
    /// [`Unsettled`] names.
    #[error("{0}")]
    Unacknowledged(String, Unsettled),
}

/// Where an acknowledged batch landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The partition.
    pub partition: i32,
    /// The offset in it.
    pub offset: i64,
}

/// Metadata carried in each message's headers.
#[derive(Clone, Copy, Debug)]
pub struct MessageMeta<'a> {
    /// The message key: the client id and the request id, space-separated, unique
    /// across clients.
    pub key: &'a str,
    /// The request id: the `Idempotency-Key`, else a new UUID.
    pub request_id: &'a str,
    /// Who sent the batch.
    pub client_id: &'a str,
    /// When it arrived, RFC 3339 in UTC.
    pub received_at: &'a str,
}

/// The content type of every message value.
pub const CONTENT_TYPE: &str = "application/json";

/// The producer and the broker's last known health.
pub struct Kafka {
    producers: Arc<Producers>,
    shared: Arc<Shared>,
    topic: String,
    health_timeout: Duration,
    delivery_timeout: Duration,
    /// How long another process's transaction may stay open before the broker aborts it.
    transaction_timeout: Duration,
    jobs: mpsc::Sender<Job>,
    bounds: Arc<Bounds>,
    /// Who sends, as [`Unsettled::producer`] names it.
    identity: String,
    /// The client configuration a read-back consumer starts from.
    readback: ClientConfig,
    /// Read-backs at once, at most [`READBACKS`].
    readbacks: tokio::sync::Semaphore,
}

/// Read-backs at once, at most: each is a consumer of its own, on a blocking thread.
const READBACKS: usize = 8;

/// `health`, seen up with the topic's `partitions`.
fn up(health: &BrokerHealth, partitions: usize) -> BrokerHealth {
    BrokerHealth {
        status: "UP",
        partitions: Some(partitions),
        reason: None,
        ..health.clone()
    }
}

fn down(health: &BrokerHealth, reason: String) -> BrokerHealth {
    BrokerHealth {
        status: "DOWN",
        partitions: None,
        reason: Some(reason),
        ..health.clone()
    }
}

/// librdkafka properties the service sets itself, because its promises rest on them: no
/// loss (`acks=all`), no duplicates from producer retries (idempotence), a 503 at the
/// delivery timeout, and no topic created by accident.
pub const MANAGED_PROPERTIES: [&str; 10] = [
    "bootstrap.servers",
    "metadata.broker.list",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "allow.auto.create.topics",
    "transactional.id",
    "transaction.timeout.ms",
];

/// Why the producer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A property the service manages was given.
    #[error(
        "the librdkafka property `{0}` is set by the service (use KAFKA_BOOTSTRAP_SERVERS, KAFKA_DELIVERY_TIMEOUT, KAFKA_TRANSACTIONAL_ID or IDEMPOTENCY_CLAIM_TTL); remove it from KAFKA_PROPERTIES"
    )]
    Managed(String),
    /// librdkafka refused the configuration.
    #[error("cannot create the Kafka producer: {0}")]
    Client(#[from] KafkaError),
}

/// What the producer is made from.
#[derive(Clone, Debug)]
pub struct ProducerSettings<'a> {
    /// Brokers to bootstrap from.
    pub bootstrap_servers: &'a str,
    /// Topic produced to.
    pub topic: &'a str,
    /// Extra librdkafka properties.
    pub properties: &'a [(String, String)],
    /// Acknowledgement deadline.
    pub delivery_timeout: Duration,
    /// Metadata probe deadline.
    pub health_timeout: Duration,
    /// Largest message value the service will send.
    pub max_value_bytes: usize,
    /// The producer's `transactional.id`: stable for this replica, unique in the fleet.
    pub transactional_id: &'a str,
    /// How long a transaction may stay open before the broker aborts it (and fences its
    /// producer): the longest another replica waits before reading back a batch this
    /// one did not settle.
    pub transaction_timeout: Duration,
}

/// Batches waiting for a transaction, at most.
const QUEUED_JOBS: usize = 4096;

/// Room for the key, headers and batch framing around a value.
const MESSAGE_OVERHEAD: usize = 64 * 1024;

impl Kafka {
    /// A producer with the service's guarantees (transactions, `acks=all`,
    /// `message.timeout.ms` from the delivery timeout, no topic auto-creation) and the
    /// extra properties, which may not touch [`MANAGED_PROPERTIES`]; and the task that
    /// commits its transactions (so this runs inside the tokio runtime).
    pub fn new(settings: &ProducerSettings<'_>) -> Result<Arc<Kafka>, SetupError> {
        if let Some((name, _)) = settings
            .properties
            .iter()
            .find(|(name, _)| MANAGED_PROPERTIES.contains(&name.as_str()))
        {
            return Err(SetupError::Managed(name.clone()));
        }
        let mut common = ClientConfig::new();
        for (name, value) in settings.properties {
            common.set(name, value);
        }
        common.set("bootstrap.servers", settings.bootstrap_servers);
        let mut config = ClientConfig::new();
        config.set("linger.ms", "2").set(
            "message.max.bytes",
            (settings.max_value_bytes + MESSAGE_OVERHEAD).to_string(),
        );
        // The producer's statistics show an epoch bumped again and again (see `producer`).
        config.set("statistics.interval.ms", producer::STATISTICS_INTERVAL_MS);
        for (name, value) in common.config_map() {
            config.set(name, value);
        }
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("allow.auto.create.topics", "false")
            .set("transactional.id", settings.transactional_id)
            .set(
                "transaction.timeout.ms",
                millis(settings.transaction_timeout.max(settings.delivery_timeout)),
            )
            .set("message.timeout.ms", millis(settings.delivery_timeout));
        let shared = Arc::new(Shared::new(BrokerHealth {
            status: "DOWN",
            bootstrap_servers: settings.bootstrap_servers.to_owned(),
            topic: settings.topic.to_owned(),
            partitions: None,
            reason: Some("not probed yet".to_owned()),
        }));
        // A replaced producer has as long as a delivery may take to finish its own.
        let retire_timeout = settings.delivery_timeout + Duration::from_secs(1);
        let producers = Arc::new(Producers::new(config, shared.clone(), retire_timeout)?);
        let identity = format!(
            "{}#{}",
            settings.transactional_id,
            uuid::Uuid::new_v4().simple()
        );
        let (jobs, queued) = mpsc::channel(QUEUED_JOBS);
        let bounds = Arc::new(Bounds::default());
        let committer = Committer {
            producers: producers.clone(),
            shared: shared.clone(),
            bounds: bounds.clone(),
            topic: settings.topic.to_owned(),
            timeout: settings.delivery_timeout,
            identity: identity.clone(),
        };
        tokio::spawn(committer.run(queued));
        Ok(Arc::new(Kafka {
            producers,
            shared,
            topic: settings.topic.to_owned(),
            health_timeout: settings.health_timeout,
            delivery_timeout: settings.delivery_timeout,
            transaction_timeout: settings.transaction_timeout,
            jobs,
            bounds,
            identity,
            readback: readback::config(common),
            readbacks: tokio::sync::Semaphore::new(READBACKS),
        }))
    }

    /// The broker as last seen.
    pub fn health(&self) -> Arc<BrokerHealth> {
        self.shared.health.load_full()
    }

    /// Replaces the producer if it cannot go on; otherwise asks the broker for the
    /// topic's metadata (bounded by the health timeout) and records the answer. After a
    /// replacement the service stays down until the next probe, made with the new
    /// producer, sees the broker.
    pub async fn probe(self: &Arc<Self>) -> Arc<BrokerHealth> {
        let generation = self.producers.current();
        self.producers.check(&generation, None);
        if self.producers.replace_if_unusable() {
            return self.health();
        }
        let number = generation.number;
        let (topic, timeout) = (self.topic.clone(), self.health_timeout);
        let asked = tokio::task::spawn_blocking(move || {
            generation
                .producer
                .client()
                .fetch_metadata(Some(&topic), timeout)
        });
        let current = self.shared.health.load_full();
        let next = match tokio::time::timeout(timeout + Duration::from_millis(100), asked).await {
            Ok(Ok(Ok(metadata))) => match metadata.topics().first() {
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                    up(&current, t.partitions().len())
                }
                Some(t) => down(
                    &current,
                    match t.error() {
                        Some(e) => format!("topic {}: {:?}", self.topic, RDKafkaErrorCode::from(e)),
                        None => format!("topic {} has no partitions", self.topic),
                    },
                ),
                None => down(&current, format!("topic {} does not exist", self.topic)),
            },
            Ok(Ok(Err(error))) => down(&current, format!("metadata request failed: {error}")),
            Ok(Err(_)) | Err(_) => down(&current, format!("no metadata answer within {timeout:?}")),
        };
        let (status, reason, next_up, changed) = (
            next.status,
            next.reason.clone(),
            next.is_up(),
            next.is_up() != current.is_up(),
        );
        // If the client reported the brokers down, or a delivery showed the producer
        // unusable, while this probe was out, that newer news wins over its answer.
        if self.shared.store_probe(number, &current, next) && changed {
            if next_up {
                tracing::info!(status, "Kafka health changed");
            } else {
                tracing::warn!(status, reason, "Kafka health changed");
            }
        }
        self.health()
    }

    /// Probes the broker every [`PROBE_INTERVAL`] until the task is dropped.
    pub async fn watch(self: Arc<Self>) {
        loop {
            tokio::time::sleep(PROBE_INTERVAL).await;
            self.probe().await;
        }
    }

    /// `Ok` when the last probe saw the broker and the topic.
    pub fn available(&self) -> Result<(), ProduceError> {
        let health = self.shared.health.load();
        if health.is_up() {
            Ok(())
        } else {
            Err(ProduceError::Unavailable(
                health.reason.clone().unwrap_or_default(),
            ))
        }
    }

    /// Where the batch with message `key` is about to go, as the note of an attempt not
    /// yet sent ([`BEFORE_SENDING`]): the idempotency store keeps it while the batch is
    /// produced (with [`Kafka::produce`] to its partition), so that a retry after this
    /// process died before remembering the answer looks for the batch on the topic.
    pub fn attempt(&self, key: &str) -> Unsettled {
        let partitions = self.shared.health.load().partitions.unwrap_or(1);
        let partition = partition_for(key, partitions);
        Unsettled {
            partition,
            from: self.bounds.get(partition),
            generation: BEFORE_SENDING,
            since_ms: now_ms(),
            producer: self.identity.clone(),
        }
    }

    /// Produces one batch to `partition` (its [`Kafka::attempt`]'s) and waits for the
    /// broker's acknowledgement: it goes in the next transaction, with the batches that
    /// come meanwhile. A failure that leaves the producer unusable marks the service down
    /// at once, before the answer, and the next probe replaces the producer.
    pub async fn produce(
        &self,
        value: &Bytes,
        meta: MessageMeta<'_>,
        partition: i32,
    ) -> Result<Ack, ProduceError> {
        self.available()?;
        let headers = OwnedHeaders::new_with_capacity(4)
            .insert(Header {
                key: "request-id",
                value: Some(meta.request_id),
            })
            .insert(Header {
                key: "client-id",
                value: Some(meta.client_id),
            })
            .insert(Header {
                key: "received-at",
                value: Some(meta.received_at),
            })
            .insert(Header {
                key: "content-type",
                value: Some(CONTENT_TYPE),
            });
        let (reply, mut answer) = oneshot::channel();
        let taken = Arc::new(Taken::default());
        let job = Job {
            value: value.clone(),
            key: meta.key.to_owned(),
            headers,
            partition,
            from: self.bounds.get(partition),
            reply,
            taken: taken.clone(),
        };
        if let Err(error) = self.jobs.try_send(job) {
            return Err(match error {
                mpsc::error::TrySendError::Full(_) => ProduceError::QueueFull,
                mpsc::error::TrySendError::Closed(_) => {
                    ProduceError::Unavailable("the producer has stopped".to_owned())
                }
            });
        }
        let stopped = || {
            Err(ProduceError::Unavailable(
                "the producer stopped before sending the batch".to_owned(),
            ))
        };
        // Waiting behind a transaction that does not end is bounded too: a batch not
        // taken into one within the delivery timeout is given up, unsent.
        match tokio::time::timeout(self.delivery_timeout, &mut answer).await {
            Ok(answered) => answered.unwrap_or_else(|_| stopped()),
            Err(_) if taken.give_up() => Err(ProduceError::Unavailable(format!(
                "the batch waited {:?} for a transaction without being sent",
                self.delivery_timeout
            ))),
            Err(_) => answer.await.unwrap_or_else(|_| stopped()),
        }
    }

    /// Where the batch `unsettled` describes, with message `key`, is on the topic, or
    /// `None` when it is not there, once it can no longer reach it; within the delivery
    /// timeout, else an error saying why it cannot be told yet.
    pub async fn look_for(&self, unsettled: &Unsettled, key: &str) -> Result<Option<Ack>, String> {
        let deadline = Instant::now() + self.delivery_timeout;
        self.settle(unsettled, deadline).await?;
        self.find(unsettled, key, deadline).await
    }

    /// Waits until the batch `unsettled` describes can no longer reach the topic: at once
    /// when its producer is fenced already; for one of this process, until the producer
    /// that replaced it is initialised, until `deadline`; for another process's (another
    /// replica, or before a restart), and for an attempt noted before it was sent
    /// ([`BEFORE_SENDING`]), until the broker has aborted its transaction,
    /// [`ProducerSettings::transaction_timeout`] after it was given up (or made).
    async fn settle(&self, unsettled: &Unsettled, deadline: Instant) -> Result<(), String> {
        if unsettled.producer != self.identity || unsettled.generation == BEFORE_SENDING {
            let waited = Duration::from_millis(now_ms().saturating_sub(unsettled.since_ms));
            return if waited >= self.transaction_timeout {
                Ok(())
            } else {
                let whose = if unsettled.producer == self.identity {
                    "this process".to_owned()
                } else {
                    format!("another process ({})", unsettled.producer)
                };
                Err(format!(
                    "it was sent by {whose}, whose transaction the broker aborts within {:?} of the attempt",
                    self.transaction_timeout - waited
                ))
            };
        }
        while !self.shared.is_fenced(unsettled.generation) {
            if Instant::now() >= deadline {
                return Err(
                    "the producer that sent it is not fenced yet: no new producer has initialised its transactions with the broker"
                        .to_owned(),
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Reads the partition of `unsettled` back from its `from` offset to its end, for a
    /// message with `key`, until `deadline`: where it is, or `None`.
    async fn find(
        &self,
        unsettled: &Unsettled,
        key: &str,
        deadline: Instant,
    ) -> Result<Option<Ack>, String> {
        let Ok(_permit) = self.readbacks.try_acquire() else {
            return Err(format!(
                "{READBACKS} other retries are reading the topic back"
            ));
        };
        let (config, topic, key) = (self.readback.clone(), self.topic.clone(), key.to_owned());
        let (partition, from) = (unsettled.partition, unsettled.from);
        let timeout = deadline.saturating_duration_since(Instant::now());
        tokio::task::spawn_blocking(move || {
            readback::find(&config, &topic, partition, from, key.as_bytes(), timeout)
        })
        .await
        .map_err(|e| format!("the read-back failed: {e}"))?
    }

    /// Waits up to `timeout` for every queued message to be acknowledged.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producers.current().producer.flush(timeout)
    }
}

/// The partition of the batch with message `key`, among `partitions`: FNV-1a of the key.
/// The service chooses it itself so that an unacknowledged batch's partition is known.
fn partition_for(key: &str, partitions: usize) -> i32 {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    i32::try_from(hash % partitions.max(1) as u64).unwrap_or(0)
}

/// Milliseconds since the epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis(duration: Duration) -> String {
    duration.as_millis().max(1).to_string()
}

/// The error for a message librdkafka would not even queue.
fn refused(error: &KafkaError) -> ProduceError {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::QueueFull) => ProduceError::QueueFull,
        Some(RDKafkaErrorCode::MessageSizeTooLarge) => ProduceError::TooLarge(error.to_string()),
        _ => ProduceError::Unavailable(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsettled_batch_survives_its_note() {
        let unsettled = Unsettled {
            partition: 2,
            from: 1_234,
            generation: 3,
            since_ms: 1_795_683_000_000,
            producer: "operations-intake-host 3000#ab12".to_owned(),
        };
        assert_eq!(Unsettled::from_note(&unsettled.note()), Some(unsettled));
        assert_eq!(Unsettled::from_note("2 x 3 4 p"), None);
        assert_eq!(Unsettled::from_note("2 1 3"), None);
    }

    #[test]
    fn a_key_always_goes_to_the_same_partition_in_range() {
        for partitions in [1, 3, 12] {
            for key in ["acme batch-1", "acme batch-2", "globex batch-1", ""] {
                let partition = partition_for(key, partitions);
                assert!((0..partitions as i32).contains(&partition));
                assert_eq!(partition, partition_for(key, partitions));
            }
        }
        let spread: std::collections::HashSet<i32> = (0..100)
            .map(|n| partition_for(&format!("acme batch-{n}"), 3))
            .collect();
        assert_eq!(spread.len(), 3, "keys spread over every partition");
    }
}
