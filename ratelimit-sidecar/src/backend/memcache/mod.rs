//! The memcached backend: counters under envoyproxy/ratelimit's keys, each on the node
//! its client would pick (CRC-32 of the key modulo the node count, in
//! `MEMCACHE_HOST_PORT` order), so a mixed fleet shares them.
//!
//! Upstream reads the counters, answers, then increments in the background, so
//! simultaneous requests can all pass on the same reading. Here the increment comes
//! first and its result is the total the decision uses, as with Redis: `incr` is atomic
//! and returns the new value; a missing counter is created with `add` (the hits, with
//! the window's expiry), and when another client created it first, `incr` again. The
//! keys and values are upstream's, so both kinds of server can share a memcached.

mod connection;
mod leases;
mod ops;
mod protocol;
mod srv;
mod tls;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::future::{join_all, try_join_all};
use ratelimit_core::Increment;
use tokio::runtime::Handle;

use self::connection::{Link, Target};
use self::protocol::key_problem;
use super::breaker::{Breaker, Breakers};
use super::waiting::Failure;
use super::{BackendError, Batch, Mode, RemoteCounters, Totals};
use crate::runtime::Pool;
use crate::settings::MemcacheSettings;

/// memcached takes an expiry above 30 days as a unix time, not a duration.
const LONGEST_RELATIVE_EXPIRY: u64 = 30 * 24 * 3600;
/// How often `add` may lose to another client's before the counter is given up.
const RACE_ATTEMPTS: usize = 3;

/// A node of the list: how it is named (which orders the list) and where to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddress {
    /// `host:port` as listed, or the SRV record's `target:port`.
    pub label: String,
    /// What to connect to.
    pub connect: String,
}

/// The node list every worker reads: fixed, or replaced by SRV refreshes.
type NodeList = Arc<ArcSwap<Vec<NodeAddress>>>;

/// Counters spread over memcached nodes (one per worker, sharing the node list), each
/// node through one pipelined connection of this worker's.
#[derive(Debug)]
pub struct MemcacheCounters {
    list: NodeList,
    /// The list last seen, and its nodes with their connections.
    seen: Mutex<Seen>,
    jitter_max: u64,
    tls: Option<tls::Tls>,
    timeout: Duration,
    /// The worker's runtime, which runs its connections' tasks.
    runtime: Handle,
    breakers: Arc<Breakers>,
}

/// A worker's view of the node list: the list, and a node (with its connection) for
/// each entry.
#[derive(Debug)]
struct Seen {
    list: Arc<Vec<NodeAddress>>,
    nodes: Arc<[Arc<Node>]>,
}

/// One node, its connection and its circuit breaker.
#[derive(Debug)]
struct Node {
    address: NodeAddress,
    breaker: Arc<Breaker>,
    link: Link,
}

/// One [`MemcacheCounters`] per worker of `pool` on the nodes the settings name:
/// MEMCACHE_HOST_PORT, or MEMCACHE_SRV (looked up now, and every MEMCACHE_SRV_REFRESH
/// after).
pub async fn per_worker(
    settings: &MemcacheSettings,
    jitter_max: u64,
    pool: &Pool,
    breakers: &Arc<Breakers>,
) -> Result<Vec<MemcacheCounters>, BackendError> {
    let list = node_list(settings).await?;
    let tls = tls::Tls::new(settings)?;
    let runtimes = pool
        .on_each(vec![(); pool.workers()], |()| async { Handle::current() })
        .await;
    let counters = runtimes.into_iter().map(|runtime| MemcacheCounters {
        list: Arc::clone(&list),
        seen: Mutex::new(Seen {
            list: Arc::new(Vec::new()),
            nodes: Arc::new([]),
        }),
        jitter_max,
        tls: tls.clone(),
        timeout: settings.memcache_timeout,
        runtime,
        breakers: Arc::clone(breakers),
    });
    Ok(counters.collect())
}

/// The node list the settings name, kept up to date from MEMCACHE_SRV when set.
async fn node_list(settings: &MemcacheSettings) -> Result<NodeList, BackendError> {
    let fixed: Vec<NodeAddress> = settings
        .memcache_host_port
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| NodeAddress {
            label: a.to_owned(),
            connect: a.to_owned(),
        })
        .collect();
    match (fixed.is_empty(), settings.memcache_srv.as_str()) {
        (false, "") => Ok(Arc::new(ArcSwap::from_pointee(fixed))),
        (true, "") => Err(BackendError::Settings(
            "BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT (host:port,host:port) or MEMCACHE_SRV"
                .into(),
        )),
        (false, _) => Err(BackendError::Settings(
            "MEMCACHE_HOST_PORT and MEMCACHE_SRV are both set; set one".into(),
        )),
        (true, name) => {
            let discovery = srv::Discovery::new(name, &settings.memcache_srv_dns_server)?;
            let nodes = discovery.nodes().await.map_err(BackendError::Settings)?;
            let list = Arc::new(ArcSwap::from_pointee(nodes));
            if !settings.memcache_srv_refresh.is_zero() {
                let every = settings.memcache_srv_refresh;
                tokio::spawn(discovery.refresh(every, Arc::clone(&list)));
            }
            Ok(list)
        }
    }
}

impl MemcacheCounters {
    /// The current nodes; when the list changed, nodes still listed keep their
    /// connections and breakers, and the others' connections close. The breakers of
    /// nodes no longer listed are forgotten at once (other workers' views may still hold
    /// them): nothing calls those nodes, so nothing would close them.
    fn nodes(&self) -> Arc<[Arc<Node>]> {
        let list = self.list.load();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&seen.list, &list) {
            self.breakers
                .keep_only(|name| list.iter().any(|address| address.label == name));
            let nodes = list
                .iter()
                .map(|address| {
                    let breaker = self.breakers.node(&address.label);
                    let kept = seen.nodes.iter().find(|node| {
                        node.address == *address && Arc::ptr_eq(&node.breaker, &breaker)
                    });
                    kept.cloned()
                        .unwrap_or_else(|| Arc::new(self.node(address, breaker)))
                })
                .collect();
            *seen = Seen {
                list: Arc::clone(&list),
                nodes,
            };
        }
        Arc::clone(&seen.nodes)
    }

    fn node(&self, address: &NodeAddress, breaker: Arc<Breaker>) -> Node {
        let target = Target {
            label: address.label.clone(),
            connect: address.connect.clone(),
            tls: self.tls.clone(),
            timeout: self.timeout,
        };
        Node {
            address: address.clone(),
            breaker,
            link: Link::new(target, &self.runtime),
        }
    }

    /// Runs the batch on each node with its share of the counters, all at once, each
    /// through its node's breaker, and returns the results in item order. Every node's
    /// call runs to its end, so that a failed node does not count against the others.
    async fn counters(&self, batch: Batch<'_>) -> Result<Totals, BackendError> {
        let items = batch.increments;
        let nodes = self.nodes();
        if nodes.is_empty() {
            return Err(BackendError::Unavailable(
                "no memcached node is known".into(),
            ));
        }
        for (index, item) in items.iter().enumerate() {
            if let Some(problem) = key_problem(&item.key) {
                let error = format!(
                    "descriptor {index}: its counter key cannot be stored in memcached: {problem}"
                );
                tracing::warn!(%error, "request refused");
                return Err(BackendError::Key(error));
            }
        }
        if let [node] = &nodes[..] {
            return self.on_node(node, batch).await;
        }
        let mut groups = vec![Vec::new(); nodes.len()];
        for (index, item) in items.iter().enumerate() {
            groups[node_of(&item.key, nodes.len())].push(index);
        }
        let shares: Vec<Vec<&Increment>> = groups
            .iter()
            .map(|group| group.iter().map(|&i| items[i]).collect())
            .collect();
        let calls = shares
            .iter()
            .zip(nodes.iter())
            .filter(|(share, _)| !share.is_empty())
            .map(|(share, node)| self.on_node(node, batch.on(share)));
        let results = join_all(calls)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        Ok(reassemble(items.len(), &groups, results))
    }

    /// A batch of one node's share, through its breaker.
    async fn on_node(&self, node: &Node, batch: Batch<'_>) -> Result<Totals, BackendError> {
        let share = batch.increments;
        let attempt = node.breaker.attempt(Some(batch.deadlines.judge))?;
        let result = match batch.mode {
            Mode::Increment => {
                ops::increment(&node.link, share, self.jitter_max, batch.deadlines.wait).await
            }
            Mode::Current => ops::current(&node.link, share, batch.deadlines.wait).await,
        };
        let result = result.map_err(|failure| match failure {
            Failure::Late => BackendError::Late,
            Failure::Failed(error) => node.failed(&error),
        });
        attempt.settle(&result);
        result
    }
}

/// The node of `key` among `count`, by upstream's client's rule: CRC-32 of the key
/// modulo the node count, the only node when there is one.
fn node_of(key: &str, count: usize) -> usize {
    match count {
        1 => 0,
        n => crc32fast::hash(key.as_bytes()) as usize % n,
    }
}

/// Puts per-node results back in item order.
fn reassemble(len: usize, groups: &[Vec<usize>], results: Vec<Totals>) -> Totals {
    let mut out: Totals = smallvec::smallvec![0; len];
    let filled = groups.iter().filter(|g| !g.is_empty());
    for (group, values) in filled.zip(results) {
        for (&index, value) in group.iter().zip(values) {
            out[index] = value;
        }
    }
    out
}

impl Node {
    fn failed(&self, error: &str) -> BackendError {
        BackendError::Unavailable(format!("memcached {}: {error}", self.address.label))
    }
}

impl RemoteCounters for MemcacheCounters {
    fn call(&self, batch: Batch<'_>) -> impl Future<Output = Result<Totals, BackendError>> + Send {
        self.counters(batch)
    }

    /// Every node answers `version`.
    async fn ping(&self) -> bool {
        let nodes = self.nodes();
        let checks = nodes.iter().map(|node| ops::version(&node.link));
        try_join_all(checks).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::ops::expiry;
    use super::*;

    #[test]
    fn long_expiries_become_unix_times() {
        assert_eq!(expiry(60, 1_700_000_000), 60);
        assert_eq!(
            expiry(LONGEST_RELATIVE_EXPIRY, 1_700_000_000),
            LONGEST_RELATIVE_EXPIRY
        );
        assert_eq!(expiry(31_536_000, 1_700_000_000), 1_731_536_000);
    }

    #[test]
    fn keys_go_to_upstreams_node() {
        // crc32("foo") = 0x8c736521 = 2356372769; mod 3 = 2.
        assert_eq!(crc32fast::hash(b"foo"), 0x8c73_6521);
        assert_eq!(node_of("foo", 3), 2);
        assert_eq!(node_of("foo", 1), 0);
    }
}
