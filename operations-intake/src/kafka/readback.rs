//! Reading a partition back for one message key: how a retry learns whether its first,
//! unacknowledged attempt is on the topic, once that attempt can no longer land.
//!
//! The reader uses `isolation.level=read_committed`, as the topic's consumers must: it
//! sees what they see. On a broker that reports aborted transactions (Kafka), a batch of
//! an aborted transaction is skipped by both; on one that does not (tansu 0.6), both see
//! it, and the retry answers from it instead of producing it again.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::Ack;

/// A read-back consumer's configuration: `common` (the bootstrap servers and the extra
/// properties) with no group membership, no commits, committed messages only.
pub(super) fn config(mut common: ClientConfig) -> ClientConfig {
    common
        .set("group.id", "operations-intake-readback")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest");
    common
}

/// Where the message with `key` is on `partition` of `topic`, reading from `from` to the
/// partition's end; `None` when it is not there. Blocks, for at most about `timeout`.
pub(super) fn find(
    config: &ClientConfig,
    topic: &str,
    partition: i32,
    from: i64,
    key: &[u8],
    timeout: Duration,
) -> Result<Option<Ack>, String> {
    let deadline = Instant::now() + timeout;
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| format!("cannot create a reader: {e}"))?;
    let (_, end) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .map_err(|e| format!("cannot ask where partition {partition} ends: {e}"))?;
    tracing::debug!(partition, from, end, "reading back");
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(from))
        .and_then(|()| consumer.assign(&assignment))
        .map_err(|e| format!("cannot read partition {partition}: {e}"))?;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(message)) if message.key() == Some(key) => {
                return Ok(Some(Ack {
                    partition,
                    offset: message.offset(),
                }));
            }
            Some(Ok(_)) => {}
            // The end of what a read_committed consumer sees: the first offset of a
            // transaction still open, if any. The attempt, whose producer is fenced,
            // is below the end seen at the start: past that, it is not there. (With
            // nothing read at all, no position is known: nothing was there to read.)
            Some(Err(KafkaError::PartitionEOF(_))) => match position(&consumer) {
                Some(next) if next < end => {}
                _ => return Ok(None),
            },
            Some(Err(error)) => return Err(format!("reading partition {partition}: {error}")),
        }
    }
    Err(format!(
        "partition {partition} was not read from offset {from} to its end ({end}) within {timeout:?}"
    ))
}

/// The offset after the last message (or control record) the consumer read on its one
/// partition, once it read one.
fn position(consumer: &BaseConsumer) -> Option<i64> {
    let positions = consumer.position().ok()?;
    let next = positions.elements().first()?.offset().to_raw()?;
    (next >= 0).then_some(next)
}
