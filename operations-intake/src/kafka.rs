//! The Kafka side: an idempotent `acks=all` producer, replaced by a new one when it
//! cannot go on, and the broker's health as last seen by a background probe, so neither
//! `/health` nor a POST waits on a dead broker.

mod producer;

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};
use serde::Serialize;

use producer::{Producers, Shared};

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
    /// Sent, but not acknowledged: the broker may or may not have it.
    #[error("{0}")]
    Unacknowledged(String),
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
    producers: Producers,
    shared: Arc<Shared>,
    topic: String,
    health_timeout: Duration,
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
pub const MANAGED_PROPERTIES: [&str; 8] = [
    "bootstrap.servers",
    "metadata.broker.list",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "allow.auto.create.topics",
];

/// Why the producer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A property the service manages was given.
    #[error(
        "the librdkafka property `{0}` is set by the service (use KAFKA_BOOTSTRAP_SERVERS or KAFKA_DELIVERY_TIMEOUT); remove it from KAFKA_PROPERTIES"
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
}

/// Room for the key, headers and batch framing around a value.
const MESSAGE_OVERHEAD: usize = 64 * 1024;

impl Kafka {
    /// A producer with the service's guarantees (idempotence, `acks=all`,
    /// `message.timeout.ms` from the delivery timeout, no topic auto-creation) and the
    /// extra properties, which may not touch [`MANAGED_PROPERTIES`].
    pub fn new(settings: &ProducerSettings<'_>) -> Result<Kafka, SetupError> {
        if let Some((name, _)) = settings
            .properties
            .iter()
            .find(|(name, _)| MANAGED_PROPERTIES.contains(&name.as_str()))
        {
            return Err(SetupError::Managed(name.clone()));
        }
        let mut config = ClientConfig::new();
        config.set("linger.ms", "2").set(
            "message.max.bytes",
            (settings.max_value_bytes + MESSAGE_OVERHEAD).to_string(),
        );
        // The producer's statistics show an epoch bumped again and again (see `producer`).
        config.set("statistics.interval.ms", producer::STATISTICS_INTERVAL_MS);
        for (name, value) in settings.properties {
            config.set(name, value);
        }
        config
            .set("bootstrap.servers", settings.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("allow.auto.create.topics", "false")
            .set(
                "message.timeout.ms",
                settings.delivery_timeout.as_millis().max(1).to_string(),
            );
        let shared = Arc::new(Shared::new(BrokerHealth {
            status: "DOWN",
            bootstrap_servers: settings.bootstrap_servers.to_owned(),
            topic: settings.topic.to_owned(),
            partitions: None,
            reason: Some("not probed yet".to_owned()),
        }));
        // A replaced producer has as long as a delivery may take to finish its own.
        let retire_timeout = settings.delivery_timeout + Duration::from_secs(1);
        Ok(Kafka {
            producers: Producers::new(config, shared.clone(), retire_timeout)?,
            shared,
            topic: settings.topic.to_owned(),
            health_timeout: settings.health_timeout,
        })
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
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => BrokerHealth {
                    status: "UP",
                    partitions: Some(t.partitions().len()),
                    reason: None,
                    ..(*current).clone()
                },
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

    /// Produces one batch and waits for the broker's acknowledgement. A failure that
    /// leaves the producer unusable marks the service down at once, before the answer,
    /// and the next probe replaces the producer.
    pub async fn produce(&self, value: &[u8], meta: MessageMeta<'_>) -> Result<Ack, ProduceError> {
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
        let record = FutureRecord::to(&self.topic)
            .key(meta.key)
            .payload(value)
            .headers(headers);
        // Held until the answer, so a replaced producer stays open for this delivery.
        let generation = self.producers.current();
        let delivery = match generation.producer.send_result(record) {
            Ok(delivery) => delivery,
            Err((error, _)) => {
                self.producers.check(&generation, Some(&error));
                return Err(refused(&error));
            }
        };
        match delivery.await {
            Ok(Ok(done)) => {
                generation.acknowledged();
                Ok(Ack {
                    partition: done.partition,
                    offset: done.offset,
                })
            }
            Ok(Err((error, _))) => {
                self.producers.check(&generation, Some(&error));
                Err(match error.rdkafka_error_code() {
                    Some(RDKafkaErrorCode::MessageSizeTooLarge) => {
                        ProduceError::TooLarge(error.to_string())
                    }
                    _ => ProduceError::Unacknowledged(error.to_string()),
                })
            }
            Err(_) => Err(ProduceError::Unacknowledged(
                "the producer was closed before the broker answered".to_owned(),
            )),
        }
    }

    /// Waits up to `timeout` for every queued message to be acknowledged.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producers.current().producer.flush(timeout)
    }
}

/// The error for a message librdkafka would not even queue.
fn refused(error: &KafkaError) -> ProduceError {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::QueueFull) => ProduceError::QueueFull,
        Some(RDKafkaErrorCode::MessageSizeTooLarge) => ProduceError::TooLarge(error.to_string()),
        _ => ProduceError::Unavailable(error.to_string()),
    }
}
