//! Which node of a Redis deployment holds a key, so that each node has its own circuit
//! breaker: the one server (or the sentinels' master), or, on a cluster, the master
//! that serves the key's hash slot, as `CLUSTER SLOTS` last said (asked at start and
//! every [`REFRESH`] after).

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::Value;
use redis::cluster_async::ClusterConnection;

use crate::backend::breaker::{Breaker, Breakers};

/// How often a cluster's slot owners are asked again.
const REFRESH: Duration = Duration::from_secs(1);
/// Hash slots in a cluster.
const SLOTS: u16 = 16384;

/// The breakers of a deployment's nodes.
#[derive(Debug, Clone)]
pub enum Nodes {
    /// One node (a server, or whichever master the sentinels name).
    One(Arc<Breaker>),
    /// A cluster's masters, by slot.
    Cluster(Arc<SlotOwners>),
}

impl Nodes {
    /// The breaker of the node that holds `key`.
    pub fn breaker(&self, key: &str) -> Arc<Breaker> {
        match self {
            Nodes::One(breaker) => Arc::clone(breaker),
            Nodes::Cluster(owners) => owners.breaker(slot(key.as_bytes())),
        }
    }
}

/// A cluster's masters by slot range.
#[derive(Debug)]
pub struct SlotOwners {
    ranges: ArcSwap<Vec<Owner>>,
    /// For slots no answer has placed yet (before the first `CLUSTER SLOTS`, or slots
    /// nobody serves).
    unplaced: Arc<Breaker>,
}

#[derive(Debug)]
struct Owner {
    first: u16,
    last: u16,
    breaker: Arc<Breaker>,
}

impl SlotOwners {
    /// The owners of `connection`'s cluster, asked now and then every [`REFRESH`] for as
    /// long as the result is held; `seeds` names the cluster until the first answer.
    pub async fn watch(
        mut connection: ClusterConnection,
        seeds: &str,
        breakers: Arc<Breakers>,
    ) -> Arc<SlotOwners> {
        let owners = Arc::new(SlotOwners {
            ranges: ArcSwap::from_pointee(Vec::new()),
            unplaced: breakers.node(&format!("cluster {seeds} (unplaced slots)")),
        });
        owners.refresh(&mut connection, &breakers).await;
        let weak: Weak<SlotOwners> = Arc::downgrade(&owners);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                let Some(owners) = weak.upgrade() else { return };
                owners.refresh(&mut connection, &breakers).await;
            }
        });
        owners
    }

    fn breaker(&self, slot: u16) -> Arc<Breaker> {
        let ranges = self.ranges.load();
        let at = ranges.partition_point(|owner| owner.last < slot);
        match ranges.get(at) {
            Some(owner) if owner.first <= slot => Arc::clone(&owner.breaker),
            _ => Arc::clone(&self.unplaced),
        }
    }

    /// Asks the cluster who serves which slots; an unanswered question keeps the last map.
    async fn refresh(&self, connection: &mut ClusterConnection, breakers: &Breakers) {
        let answer: redis::RedisResult<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(connection)
            .await;
        match answer {
            Ok(answer) => {
                let mut ranges: Vec<Owner> = masters(&answer)
                    .into_iter()
                    .map(|(first, last, node)| Owner {
                        first,
                        last,
                        breaker: breakers.node(&node),
                    })
                    .collect();
                ranges.sort_by_key(|owner| owner.first);
                self.ranges.store(Arc::new(ranges));
            }
            Err(error) => tracing::debug!(%error, "CLUSTER SLOTS went unanswered"),
        }
    }
}

/// The master (`host:port`) of each slot range in a `CLUSTER SLOTS` answer: entries are
/// `[first, last, [host, port, id, ...], replicas...]`.
fn masters(answer: &Value) -> Vec<(u16, u16, String)> {
    let Value::Array(entries) = answer else {
        return Vec::new();
    };
    let int = |value: &Value| match value {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(fields) = entry else {
                return None;
            };
            let (first, last) = (int(fields.first()?)?, int(fields.get(1)?)?);
            let Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let (host, port) = (text(master.first()?)?, int(master.get(1)?)?);
            (first <= last && last < SLOTS).then(|| (first, last, format!("{host}:{port}")))
        })
        .collect()
}

/// A key's hash slot, by the cluster specification: CRC16 (XMODEM) of the key, or of
/// its first non-empty `{hash tag}`, modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::stats::StatsRegistry;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // The specification's check value, and slots redis-cli's CLUSTER KEYSLOT gives.
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31C3
        );
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"), "an empty tag is no tag");
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn cluster_slots_answers_name_each_ranges_master() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let answer = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("10.0.0.2", 7001),
            ]),
            Value::Array(vec![Value::Int(9), Value::Int(99999), node("bad", 1)]),
        ]);
        assert_eq!(
            masters(&answer),
            [
                (0, 5460, "127.0.0.1:7000".to_owned()),
                (5461, 16383, "10.0.0.2:7001".to_owned())
            ]
        );
        let stats = StatsRegistry::new(10);
        let breakers = Breakers::new("redis", 1, Duration::from_secs(1), &stats);
        let owners = SlotOwners {
            ranges: ArcSwap::from_pointee(vec![Owner {
                first: 100,
                last: 200,
                breaker: breakers.node("a:1"),
            }]),
            unplaced: breakers.node("unplaced"),
        };
        assert!(Arc::ptr_eq(&owners.breaker(150), &breakers.node("a:1")));
        assert!(Arc::ptr_eq(&owners.breaker(200), &breakers.node("a:1")));
        assert!(Arc::ptr_eq(
            &owners.breaker(201),
            &breakers.node("unplaced")
        ));
        assert!(Arc::ptr_eq(&owners.breaker(99), &breakers.node("unplaced")));
    }
}
