//! A request's counters as one pipeline: `INCRBY` and `EXPIRE` for a window's counter,
//! `GET` for a sliding window's previous one, and one script call (`EVALSHA`) per token
//! bucket; or `GET` for every counter's current value.

use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use ratelimit_core::{CounterOp, Increment};
use redis::{Pipeline, Script};

use super::nodes::Nodes;
use super::{Store, query, redis_error};
use crate::backend::{BackendError, RemoteCounters};

/// One step of a token bucket, as `ratelimit_core::Bucket::step` computes it: the
/// stored TAT (unix ms) moves to `max(stored, now) + cost × interval` when that is at
/// most `capacity` ahead of now, and the script returns that value either way. A bucket
/// expires when it would be full again. Values are capped at 2^53 ms, where Lua's
/// numbers stop being exact.
/// KEYS[1]: the bucket; ARGV: now, interval, capacity, cost (milliseconds, tokens).
const GCRA_LUA: &str = r"
local now = tonumber(ARGV[1])
local stored = tonumber(redis.call('GET', KEYS[1]) or '0')
local cost = tonumber(ARGV[4])
local next = math.min(math.max(stored, now) + cost * tonumber(ARGV[2]), 9007199254740991)
if cost > 0 and next - now <= tonumber(ARGV[3]) then
  redis.call('SET', KEYS[1], string.format('%d', next), 'PX', math.max(next - now, 1))
end
return next
";

static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(GCRA_LUA));

/// One Redis deployment's counters.
#[derive(Clone)]
pub struct RedisCounters {
    pub(super) store: Store,
    pub(super) nodes: Nodes,
    pub(super) jitter_max: u64,
}

impl std::fmt::Debug for RedisCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCounters").finish_non_exhaustive()
    }
}

impl RedisCounters {
    async fn run(&self, items: &[&Increment]) -> Result<Vec<u64>, BackendError> {
        let totals: Vec<redis::RedisResult<Option<i64>>> =
            run_batched(self, items, |pipe, increment| {
                self.add(pipe, increment, false)
            })
            .await?;
        let mut out = Vec::with_capacity(totals.len());
        let mut unloaded = Vec::new();
        for (i, total) in totals.into_iter().enumerate() {
            match total {
                Err(error)
                    if error.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    // The script did not run: it runs again below with its source.
                    unloaded.push(i);
                    out.push(0);
                }
                total => out.push(saturated_total(total)?),
            }
        }
        if !unloaded.is_empty() {
            let again: Vec<&Increment> = unloaded.iter().map(|&i| items[i]).collect();
            let totals: Vec<redis::RedisResult<Option<i64>>> =
                run_batched(self, &again, |pipe, increment| {
                    self.add(pipe, increment, true)
                })
                .await?;
            for (i, total) in unloaded.into_iter().zip(totals) {
                out[i] = saturated_total(total)?;
            }
        }
        Ok(out)
    }

    /// The commands of one counter; `with_source` sends a bucket's script as `EVAL`
    /// (after a `NOSCRIPT`, which also loads it for the next calls).
    fn add(&self, pipe: &mut Pipeline, increment: &Increment, with_source: bool) {
        match increment.op {
            CounterOp::Add => {
                let jitter = if self.jitter_max > 0 {
                    fastrand::u64(0..self.jitter_max)
                } else {
                    0
                };
                pipe.cmd("INCRBY").arg(&increment.key).arg(increment.hits);
                pipe.cmd("EXPIRE")
                    .arg(&increment.key)
                    .arg(increment.expiry_seconds(jitter))
                    .ignore();
            }
            CounterOp::Read => {
                pipe.cmd("GET").arg(&increment.key);
            }
            CounterOp::Gcra(bucket) => {
                if with_source {
                    pipe.cmd("EVAL").arg(GCRA_LUA);
                } else {
                    pipe.cmd("EVALSHA").arg(GCRA.get_hash());
                }
                pipe.arg(1)
                    .arg(&increment.key)
                    .arg(increment.now_ms)
                    .arg(bucket.interval_ms)
                    .arg(bucket.capacity_ms())
                    .arg(increment.hits);
            }
        }
    }

    async fn get(&self, items: &[&Increment]) -> Result<Vec<u64>, BackendError> {
        let values: Vec<redis::RedisResult<Option<u64>>> =
            run_batched(self, items, |pipe, increment| {
                pipe.cmd("GET").arg(&increment.key);
            })
            .await?;
        values
            .into_iter()
            .map(|value| value.map(Option::unwrap_or_default).map_err(redis_error))
            .collect()
    }
}

impl RemoteCounters for RedisCounters {
    fn increment<'a>(
        &'a self,
        increments: &'a [&'a Increment],
    ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
        Box::pin(self.run(increments))
    }

    fn current<'a>(
        &'a self,
        increments: &'a [&'a Increment],
    ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
        Box::pin(self.get(increments))
    }

    fn ping(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            pipe.cmd("PING");
            query::<Vec<String>>(&self.store, &pipe).await.is_ok()
        })
    }
}

/// A counter's total (or a bucket's TAT). Redis refuses to go past `i64::MAX`; a counter
/// that far over any limit is decided as saturated, never as a backend failure (which
/// Envoy's default `failure_mode_deny: false` would let through). A missing counter (a
/// `GET` of a previous window nobody counted in) is 0.
fn saturated_total(total: redis::RedisResult<Option<i64>>) -> Result<u64, BackendError> {
    match total {
        Ok(total) => Ok(u64::try_from(total.unwrap_or(0)).unwrap_or(0)),
        Err(error) if error.to_string().contains("would overflow") => Ok(u64::MAX),
        Err(error) => Err(redis_error(error)),
    }
}

/// Runs the commands `add` writes for each counter: in one pipeline on a single Redis; in
/// one pipeline per counter, all at once, on a cluster, where a pipeline must stay within
/// one hash slot. Each pipeline goes through the breaker of the node it is for, and runs
/// to its end even when another fails, so that one node's failure does not count
/// against the others. Results come back in `items` order.
async fn run_batched<T: redis::FromRedisValue>(
    counters: &RedisCounters,
    items: &[&Increment],
    mut add: impl FnMut(&mut Pipeline, &Increment),
) -> Result<Vec<T>, BackendError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let store = &counters.store;
    let mut pipes: Vec<Pipeline> = match store {
        Store::Single(..) | Store::Sentinel(_) => {
            let mut pipe = redis::pipe();
            items.iter().for_each(|increment| add(&mut pipe, increment));
            vec![pipe]
        }
        Store::Cluster(_) => items
            .iter()
            .map(|increment| {
                let mut pipe = redis::pipe();
                add(&mut pipe, increment);
                pipe
            })
            .collect(),
    };
    // Each command's error comes back in its place, so that one counter's error is told
    // apart from a failed round trip.
    pipes.iter_mut().for_each(|pipe| {
        pipe.ignore_errors();
    });
    // A pipeline's node is its first key's (every key of a cluster's pipeline is in one
    // slot; a single Redis is one node).
    let through_breaker = |pipe, key: &str| {
        let breaker = counters.nodes.breaker(key);
        async move { breaker.call(query::<Vec<T>>(store, pipe)).await }
    };
    if let [pipe] = pipes.as_slice() {
        return through_breaker(pipe, &items[0].key).await;
    }
    let calls = pipes.iter().zip(items);
    let results =
        futures_util::future::join_all(calls.map(|(pipe, item)| through_breaker(pipe, &item.key)))
            .await;
    let mut out = Vec::with_capacity(items.len());
    for result in results {
        out.extend(result?);
    }
    Ok(out)
}
