//! A request's counters as one pipeline: `INCRBY` and `EXPIRE` for a window's counter,
//! `GET` for a sliding window's previous one, and one script call (`EVALSHA`) per token
//! bucket or concurrency limit; or `GET` for every counter's current value.

use std::sync::LazyLock;

use futures_util::future::Either;
use ratelimit_core::{CounterOp, Increment, Lease};
use smallvec::SmallVec;

use super::nodes::Nodes;
use super::resp::{self, Arg, Replies, Reply};
use super::{Store, query, redis_error};
use crate::backend::{BackendError, Batch, Deadlines, Mode, RemoteCounters, Totals};

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

/// A refund, as `ratelimit_core::CounterOp::Refund` means it: the counter goes down by
/// the hits, never below 0, and one that does not exist is not created; its expiry is
/// set again, as `INCRBY`'s is. Integers throughout (`DECRBY`), so no count is rounded.
/// KEYS[1]: the counter; ARGV: hits, expiry in seconds.
const REFUND_LUA: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local left = redis.call('DECRBY', KEYS[1], ARGV[1])
if left < 0 then
  redis.call('SET', KEYS[1], '0', 'KEEPTTL')
  left = 0
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return left
";

/// Tokens given back to a bucket, as `ratelimit_core::Bucket::refund` computes it: the
/// TAT moves back by their time, not before now; a full bucket (or none) is unchanged.
/// KEYS[1]: the bucket; ARGV: now, interval, cost (milliseconds, tokens).
const GCRA_REFUND_LUA: &str = r"
local now = tonumber(ARGV[1])
local stored = tonumber(redis.call('GET', KEYS[1]) or '0')
if stored <= now then return stored end
local back = math.max(stored - tonumber(ARGV[3]) * tonumber(ARGV[2]), now)
redis.call('SET', KEYS[1], string.format('%d', back), 'PX', math.max(back - now, 1))
return back
";

/// A concurrency limit's request, as `ratelimit_core::LeaseSet::acquire` computes it, on
/// a sorted set of lease ids scored by when they lapse (unix ms): lapsed leases go, a
/// held lease is renewed, a new one is added while there is a place. Returns the places
/// in use with the request (one more than the places when it found none). The set lives
/// as long as its newest lease.
/// KEYS[1]: the set; ARGV: now, lease, places (milliseconds, count), id, take (0 or 1).
const LEASE_LUA: &str = r"
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if ARGV[5] == '0' then return held end
if not redis.call('ZSCORE', KEYS[1], ARGV[4]) then
  if held >= tonumber(ARGV[3]) then return held + 1 end
  held = held + 1
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return held
";

/// A lease given back (`ratelimit_core::LeaseSet::release`): its id leaves the set, and
/// the places still in use are returned. KEYS[1]: the set; ARGV: now, id.
const RELEASE_LUA: &str = r"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]))
redis.call('ZREM', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
";

/// A script and its SHA1, which `EVALSHA` names it by.
struct Script {
    source: &'static str,
    sha1: LazyLock<String>,
}

fn sha1(source: &str) -> String {
    redis::Script::new(source).get_hash().to_owned()
}

static GCRA: Script = Script {
    source: GCRA_LUA,
    sha1: LazyLock::new(|| sha1(GCRA_LUA)),
};
static REFUND: Script = Script {
    source: REFUND_LUA,
    sha1: LazyLock::new(|| sha1(REFUND_LUA)),
};
static LEASE: Script = Script {
    source: LEASE_LUA,
    sha1: LazyLock::new(|| sha1(LEASE_LUA)),
};
static RELEASE: Script = Script {
    source: RELEASE_LUA,
    sha1: LazyLock::new(|| sha1(RELEASE_LUA)),
};
static GCRA_REFUND: Script = Script {
    source: GCRA_REFUND_LUA,
    sha1: LazyLock::new(|| sha1(GCRA_REFUND_LUA)),
};

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

/// Writes one command.
type Command<'c> = &'c mut dyn FnMut(&[Arg<'_>]);

impl RedisCounters {
    async fn run(
        &self,
        items: &[&Increment],
        deadlines: Deadlines,
    ) -> Result<Totals, BackendError> {
        let (mut out, mut unloaded) = (Totals::new(), Vec::new());
        {
            let totals = run_batched(self, items, deadlines, |command, increment| {
                self.add(command, increment, false);
            })
            .await?;
            for (i, total) in totals.iter().enumerate() {
                if total.is_noscript() {
                    // The script did not run: it runs again below with its source.
                    unloaded.push(i);
                    out.push(0);
                } else {
                    out.push(saturated_total(total)?);
                }
            }
        }
        if !unloaded.is_empty() {
            let again: Vec<&Increment> = unloaded.iter().map(|&i| items[i]).collect();
            // Boxed: rare (a script flushed from Redis), and inline it would make every
            // call's future larger by its own, and by what this one keeps meanwhile.
            let retry = run_batched(self, &again, deadlines, |command, increment| {
                self.add(command, increment, true);
            });
            let totals = Box::pin(retry).await?;
            for (i, total) in unloaded.into_iter().zip(&totals) {
                out[i] = saturated_total(total)?;
            }
        }
        Ok(out)
    }

    /// The commands of one counter, the one whose reply is its total first; `with_source`
    /// sends a script as `EVAL` (after a `NOSCRIPT`, which also loads it for the next
    /// calls).
    fn add(&self, command: Command<'_>, increment: &Increment, with_source: bool) {
        let key = Arg::Text(&increment.key);
        let hits = Arg::Int(increment.store_hits());
        let script = |command: Command<'_>, script: &Script, args: &[Arg<'_>]| {
            let mut all: SmallVec<[Arg<'_>; 8]> = SmallVec::new();
            all.extend(match with_source {
                true => [Arg::Text("EVAL"), Arg::Text(script.source)],
                false => [Arg::Verb(resp::EVALSHA), Arg::Text(&script.sha1)],
            });
            all.extend([Arg::Int(1), key]);
            all.extend_from_slice(args);
            command(&all);
        };
        let now = Arg::Int(increment.now_ms);
        match increment.op {
            CounterOp::Add => {
                command(&[Arg::Verb(resp::INCRBY), key, hits]);
                command(&[
                    Arg::Verb(resp::EXPIRE),
                    key,
                    Arg::Int(self.expiry(increment)),
                ]);
            }
            CounterOp::Read => command(&[Arg::Verb(resp::GET), key]),
            CounterOp::Gcra(bucket) => {
                let (interval, capacity) = (bucket.interval_ms, bucket.capacity_ms());
                let args = [now, Arg::Int(interval), Arg::Int(capacity), hits];
                script(command, &GCRA, &args);
            }
            CounterOp::Refund => {
                script(command, &REFUND, &[hits, Arg::Int(self.expiry(increment))]);
            }
            CounterOp::GcraRefund(bucket) => {
                script(
                    command,
                    &GCRA_REFUND,
                    &[now, Arg::Int(bucket.interval_ms), hits],
                );
            }
            CounterOp::Acquire(lease) => {
                let take = Arg::Int(u64::from(increment.hits > 0));
                script(command, &LEASE, &lease_args(now, lease, take));
            }
            CounterOp::Release(lease) => {
                script(command, &RELEASE, &[now, Arg::Int(lease.id)]);
            }
        }
    }

    /// A window counter's expiry in seconds, with this deployment's jitter.
    fn expiry(&self, increment: &Increment) -> u64 {
        let jitter = if self.jitter_max > 0 {
            fastrand::u64(0..self.jitter_max)
        } else {
            0
        };
        increment.expiry_seconds(jitter)
    }

    async fn get(
        &self,
        items: &[&Increment],
        deadlines: Deadlines,
    ) -> Result<Totals, BackendError> {
        let values = run_batched(self, items, deadlines, |command, increment| {
            let key = Arg::Text(&increment.key);
            match increment.op {
                // A lease set's places in use: the script, taking none (with its source:
                // this path is rare, and must not fail on a script not loaded).
                CounterOp::Acquire(lease) | CounterOp::Release(lease) => {
                    let now = Arg::Int(increment.now_ms);
                    let head = [Arg::Text("EVAL"), Arg::Text(LEASE.source), Arg::Int(1), key];
                    let args = lease_args(now, lease, Arg::Int(0));
                    let all: SmallVec<[Arg<'_>; 9]> = head.into_iter().chain(args).collect();
                    command(&all);
                }
                _ => command(&[Arg::Verb(resp::GET), key]),
            }
        })
        .await?;
        values
            .iter()
            .map(|value| match value.number() {
                Ok(number) => u64::try_from(number.unwrap_or(0))
                    .map_err(|_| redis_error(format!("a negative counter: {number:?}"))),
                Err(error) => Err(redis_error(error)),
            })
            .collect()
    }
}

impl RemoteCounters for RedisCounters {
    /// The mode's call as it is, not inside a future of its own (which would copy it in).
    fn call(&self, batch: Batch<'_>) -> impl Future<Output = Result<Totals, BackendError>> + Send {
        match batch.mode {
            Mode::Increment => Either::Left(self.run(batch.increments, batch.deadlines)),
            Mode::Current => Either::Right(self.get(batch.increments, batch.deadlines)),
        }
    }

    async fn ping(&self) -> bool {
        let replies = query(&self.store, None, |command| command(&[Arg::Text("PING")])).await;
        matches!(replies.as_deref(), Ok([reply]) if !matches!(reply, Reply::Error(_)))
    }
}

/// The arguments of [`LEASE_LUA`].
fn lease_args<'a>(now: Arg<'a>, lease: Lease, take: Arg<'a>) -> [Arg<'a>; 5] {
    let places = Arg::Int(u64::from(lease.places));
    [
        now,
        Arg::Int(lease.lease_ms),
        places,
        Arg::Int(lease.id),
        take,
    ]
}

/// A counter's total (or a bucket's TAT). Redis refuses to go past `i64::MAX`; a counter
/// that far over any limit is decided as saturated, never as a backend failure (which
/// Envoy's default `failure_mode_deny: false` would let through). A missing counter (a
/// `GET` of a previous window nobody counted in) is 0.
fn saturated_total(total: &Reply) -> Result<u64, BackendError> {
    match total.number() {
        Ok(total) => Ok(u64::try_from(total.unwrap_or(0)).unwrap_or(0)),
        Err(error) if error.contains("would overflow") => Ok(u64::MAX),
        Err(error) => Err(redis_error(error)),
    }
}

/// Runs the commands `add` writes for each counter: in one pipeline on a single Redis; in
/// one pipeline per counter, all at once, on a cluster, where a pipeline must stay within
/// one hash slot. Each pipeline goes through the breaker of the node it is for, and runs
/// to its end even when another fails, so that one node's failure does not count
/// against the others. Each counter's first reply comes back, in `items` order.
async fn run_batched(
    counters: &RedisCounters,
    items: &[&Increment],
    deadlines: Deadlines,
    add: impl Fn(Command<'_>, &Increment),
) -> Result<Replies, BackendError> {
    let Some(first) = items.first() else {
        return Ok(Replies::new());
    };
    let store = &counters.store;
    if !matches!(store, Store::Cluster(_)) {
        // A single node: its one breaker, one round trip.
        let mut starts: SmallVec<[usize; 4]> = SmallVec::with_capacity(items.len());
        let write = |command: Command<'_>| {
            let mut written = 0;
            for item in items {
                starts.push(written);
                add(
                    &mut |args: &[Arg<'_>]| {
                        written += 1;
                        command(args);
                    },
                    item,
                );
            }
        };
        let breaker = counters.nodes.breaker(&first.key);
        let attempt = breaker.attempt(Some(deadlines.judge))?;
        let replies = query(store, Some(deadlines.wait), write).await;
        attempt.settle(&replies);
        let mut replies = replies?;
        // Each counter's first reply moves down in place: the starts grow, each counter
        // writing one command or more, so a swap never moves a reply still to be read.
        for (i, &at) in starts.iter().enumerate() {
            if at >= replies.len() {
                return Err(redis_error("fewer replies than commands"));
            }
            replies.swap(i, at);
        }
        replies.truncate(starts.len());
        return Ok(replies);
    }
    let calls = items.iter().map(|item| {
        let breaker = counters.nodes.breaker(&item.key);
        let add = &add;
        async move {
            let replies = breaker
                .call(
                    Some(deadlines.judge),
                    query(store, Some(deadlines.wait), |command| add(command, item)),
                )
                .await?;
            replies
                .into_iter()
                .next()
                .ok_or_else(|| redis_error("no reply"))
        }
    });
    futures_util::future::join_all(calls)
        .await
        .into_iter()
        .collect()
}
