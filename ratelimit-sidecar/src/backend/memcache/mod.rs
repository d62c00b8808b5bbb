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

mod ops;
mod protocol;
mod srv;
mod tls;

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use futures_util::future::{BoxFuture, join_all, try_join_all};
use ratelimit_core::Increment;

use self::protocol::{Connection, key_problem};
use super::breaker::{Breaker, Breakers};
use super::{BackendError, RemoteCounters};
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

/// Counters spread over memcached nodes (one per worker, sharing the node list).
#[derive(Debug)]
pub struct MemcacheCounters {
    list: NodeList,
    /// The list last seen, and its nodes with their connections.
    nodes: Mutex<Seen>,
    max_idle: usize,
    jitter_max: u64,
    tls: Option<tls::Tls>,
    breakers: Arc<Breakers>,
}

/// A worker's view of the node list: the list, and a node (with its connections) for
/// each entry.
#[derive(Debug)]
struct Seen {
    list: Arc<Vec<NodeAddress>>,
    nodes: Vec<Arc<Node>>,
}

/// One node, its idle connections and its circuit breaker.
#[derive(Debug)]
struct Node {
    address: NodeAddress,
    breaker: Arc<Breaker>,
    idle: Mutex<Vec<Connection>>,
    max_idle: usize,
    tls: Option<tls::Tls>,
}

/// One [`MemcacheCounters`] per worker on the nodes the settings name: MEMCACHE_HOST_PORT,
/// or MEMCACHE_SRV (looked up now, and every MEMCACHE_SRV_REFRESH after).
pub async fn per_worker(
    settings: &MemcacheSettings,
    jitter_max: u64,
    workers: usize,
    breakers: &Arc<Breakers>,
) -> Result<Vec<MemcacheCounters>, BackendError> {
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
    let list = match (fixed.is_empty(), settings.memcache_srv.as_str()) {
        (false, "") => Arc::new(ArcSwap::from_pointee(fixed)),
        (true, "") => {
            return Err(BackendError::Settings(
                "BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT (host:port,host:port) or MEMCACHE_SRV".into(),
            ));
        }
        (false, _) => {
            return Err(BackendError::Settings(
                "MEMCACHE_HOST_PORT and MEMCACHE_SRV are both set; set one".into(),
            ));
        }
        (true, name) => {
            let discovery = srv::Discovery::new(name, &settings.memcache_srv_dns_server)?;
            let nodes = discovery.nodes().await.map_err(BackendError::Settings)?;
            let list = Arc::new(ArcSwap::from_pointee(nodes));
            if !settings.memcache_srv_refresh.is_zero() {
                let every = settings.memcache_srv_refresh;
                tokio::spawn(discovery.refresh(every, Arc::clone(&list)));
            }
            list
        }
    };
    let tls = tls::Tls::new(settings)?;
    let counters = (0..workers).map(|_| MemcacheCounters {
        list: Arc::clone(&list),
        nodes: Mutex::new(Seen {
            list: Arc::new(Vec::new()),
            nodes: Vec::new(),
        }),
        max_idle: settings.memcache_max_idle_conns.max(1),
        jitter_max,
        tls: tls.clone(),
        breakers: Arc::clone(breakers),
    });
    Ok(counters.collect())
}

impl MemcacheCounters {
    /// The current nodes; when the list changed, nodes still listed keep their
    /// connections.
    fn nodes(&self) -> Vec<Arc<Node>> {
        let list = self.list.load_full();
        let mut seen = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&seen.list, &list) {
            let nodes = list
                .iter()
                .map(|address| {
                    let kept = seen.nodes.iter().find(|node| node.address == *address);
                    kept.cloned().unwrap_or_else(|| {
                        Arc::new(Node {
                            address: address.clone(),
                            breaker: self.breakers.node(&address.label),
                            idle: Mutex::new(Vec::new()),
                            max_idle: self.max_idle,
                            tls: self.tls.clone(),
                        })
                    })
                })
                .collect();
            *seen = Seen { list, nodes };
        }
        seen.nodes.clone()
    }

    /// The items' indexes grouped by node.
    fn by_node(
        &self,
        nodes: &[Arc<Node>],
        items: &[&Increment],
    ) -> Result<Vec<Vec<usize>>, BackendError> {
        if nodes.is_empty() {
            return Err(BackendError::Unavailable(
                "no memcached node is known".into(),
            ));
        }
        let mut groups = vec![Vec::new(); nodes.len()];
        for (index, item) in items.iter().enumerate() {
            if let Some(problem) = key_problem(&item.key) {
                let error = format!(
                    "descriptor {index}: its counter key cannot be stored in memcached: {problem}"
                );
                tracing::warn!(%error, "request refused");
                return Err(BackendError::Key(error));
            }
            groups[node_of(&item.key, nodes.len())].push(index);
        }
        Ok(groups)
    }

    async fn incr(&self, items: &[&Increment]) -> Result<Vec<u64>, BackendError> {
        self.on_each_node(items, |node, group| async move {
            let mut connection = node.connection().await?;
            let totals = ops::run(&mut connection, &group, self.jitter_max).await;
            node.release(connection, totals)
        })
        .await
    }

    async fn get(&self, items: &[&Increment]) -> Result<Vec<u64>, BackendError> {
        self.on_each_node(items, |node, group| async move {
            let keys: Vec<&str> = group.iter().map(|item| item.key.as_str()).collect();
            let mut connection = node.connection().await?;
            let values = connection.get(&keys).await;
            node.release(connection, values)
        })
        .await
    }

    /// Runs `work` on each node with its share of `items`, all at once, each through its
    /// node's breaker, and returns the results in item order. Every node's call runs to
    /// its end, so that a failed node does not count against the others.
    async fn on_each_node<'a, F, Fut>(
        &self,
        items: &'a [&'a Increment],
        work: F,
    ) -> Result<Vec<u64>, BackendError>
    where
        F: Fn(Arc<Node>, Vec<&'a Increment>) -> Fut,
        Fut: Future<Output = Result<Vec<u64>, BackendError>>,
    {
        let nodes = self.nodes();
        let groups = self.by_node(&nodes, items)?;
        let calls = groups
            .iter()
            .enumerate()
            .filter(|(_, group)| !group.is_empty())
            .map(|(node, group)| {
                let share = group.iter().map(|&i| items[i]).collect();
                let node = Arc::clone(&nodes[node]);
                let breaker = Arc::clone(&node.breaker);
                let call = work(node, share);
                async move { breaker.call(call).await }
            });
        let results = join_all(calls)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        Ok(reassemble(items.len(), &groups, results))
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
fn reassemble(len: usize, groups: &[Vec<usize>], results: Vec<Vec<u64>>) -> Vec<u64> {
    let mut out = vec![0; len];
    let filled = groups.iter().filter(|g| !g.is_empty());
    for (group, values) in filled.zip(results) {
        for (&index, value) in group.iter().zip(values) {
            out[index] = value;
        }
    }
    out
}

impl Node {
    /// An idle connection, or a new one.
    async fn connection(&self) -> Result<Connection, BackendError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(connection) => Ok(connection),
            None => Connection::open(
                &self.address.connect,
                self.tls.as_ref(),
                &self.address.label,
            )
            .await
            .map_err(|e| self.failed(&e)),
        }
    }

    /// `result` of work on `connection`, which is kept for the next call when the work
    /// succeeded and fewer than `max_idle` are idle. After a failure it is dropped (its
    /// replies may be out of step): the next call opens another.
    fn release<T>(
        &self,
        connection: Connection,
        result: std::io::Result<T>,
    ) -> Result<T, BackendError> {
        let result = result.map_err(|e| self.failed(&e))?;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle {
            idle.push(connection);
        }
        Ok(result)
    }

    fn failed(&self, error: &std::io::Error) -> BackendError {
        BackendError::Unavailable(format!("memcached {}: {error}", self.address.label))
    }
}

impl RemoteCounters for MemcacheCounters {
    fn increment<'a>(
        &'a self,
        increments: &'a [&'a Increment],
    ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
        Box::pin(self.incr(increments))
    }

    fn current<'a>(
        &'a self,
        increments: &'a [&'a Increment],
    ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
        Box::pin(self.get(increments))
    }

    /// Every node answers `version`.
    fn ping(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let nodes = self.nodes();
            let checks = nodes.iter().map(|node| async move {
                let mut connection = node.connection().await?;
                let answered = connection.version().await;
                node.release(connection, answered)
            });
            try_join_all(checks).await.is_ok()
        })
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
