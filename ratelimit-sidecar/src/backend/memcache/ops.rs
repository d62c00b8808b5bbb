//! A node's share of a request's counters on one connection: `incr` (then `add` for a
//! counter that does not exist yet) for a window's counter, `get` for a sliding window's
//! previous one, and `gets` then `cas` (or `add`) for a token bucket, retried when
//! another client changed it in between.

use std::io;

use ratelimit_core::{Bucket, CounterOp, Increment};
use ratelimit_service_kit::clock::unix_now;

use super::protocol::{Added, Connection, Incremented};
use super::{LONGEST_RELATIVE_EXPIRY, RACE_ATTEMPTS};

/// Runs each item's operation and returns what the store reports, in item order.
pub(super) async fn run(
    connection: &mut Connection,
    items: &[&Increment],
    jitter_max: u64,
) -> io::Result<Vec<u64>> {
    let mut out = vec![0; items.len()];
    let (mut adds, mut reads, mut refunds) = (Vec::new(), Vec::new(), Vec::new());
    for (i, item) in items.iter().enumerate() {
        match item.op {
            CounterOp::Add => adds.push(i),
            CounterOp::Read => reads.push(i),
            CounterOp::Refund => refunds.push((item.key.as_str(), item.store_hits())),
            CounterOp::Gcra(bucket) => out[i] = gcra(connection, item, bucket).await?,
            CounterOp::GcraRefund(bucket) => {
                out[i] = gcra_refund(connection, item, bucket).await?;
            }
        }
    }
    if !refunds.is_empty() {
        // A counter nobody has stays so, at 0.
        let left = connection.decr(&refunds).await?;
        let indexes = items
            .iter()
            .enumerate()
            .filter(|(_, i)| i.op == CounterOp::Refund);
        for ((i, _), reply) in indexes.zip(left) {
            out[i] = match reply {
                Incremented::To(left) => left,
                Incremented::Missing => 0,
            };
        }
    }
    if !adds.is_empty() {
        let share: Vec<&Increment> = adds.iter().map(|&i| items[i]).collect();
        let totals = count(connection, &share, jitter_max).await?;
        adds.iter()
            .zip(totals)
            .for_each(|(&i, total)| out[i] = total);
    }
    if !reads.is_empty() {
        let keys: Vec<&str> = reads.iter().map(|&i| items[i].key.as_str()).collect();
        let values = connection.get(&keys).await?;
        reads
            .iter()
            .zip(values)
            .for_each(|(&i, value)| out[i] = value);
    }
    Ok(out)
}

/// One step of a token bucket with compare-and-swap; returns the TAT asked for.
async fn gcra(connection: &mut Connection, item: &Increment, bucket: Bucket) -> io::Result<u64> {
    let key = item.key.as_str();
    let now = item.now_ms / 1_000;
    for _ in 0..RACE_ATTEMPTS {
        let current = connection.gets(key).await?;
        let (keep, next) = bucket.step(current.map_or(0, |(tat, _)| tat), item.now_ms, item.hits);
        // memcached takes whole seconds: the bucket stays until it is full again.
        let lifetime = Bucket::expiry_ms(keep, item.now_ms).div_ceil(1_000) + 1;
        let stored = match current {
            Some((tat, _)) if tat == keep => true,
            Some((_, token)) => {
                connection
                    .cas(key, keep, expiry(lifetime, now), token)
                    .await?
            }
            None => matches!(
                connection
                    .add(&[(key, keep, expiry(lifetime, now))])
                    .await?[..],
                [Added::Stored]
            ),
        };
        if stored {
            return Ok(next);
        }
    }
    Err(io::Error::other(
        "a token bucket kept changing between gets and cas",
    ))
}

/// Gives a refund's tokens back to a bucket with compare-and-swap; returns its new TAT (0
/// when there is no bucket: it is full).
async fn gcra_refund(
    connection: &mut Connection,
    item: &Increment,
    bucket: Bucket,
) -> io::Result<u64> {
    let key = item.key.as_str();
    for _ in 0..RACE_ATTEMPTS {
        let Some((tat, token)) = connection.gets(key).await? else {
            return Ok(0);
        };
        let back = bucket.refund(tat, item.now_ms, item.hits);
        if back == tat {
            return Ok(back);
        }
        let lifetime = Bucket::expiry_ms(back, item.now_ms).div_ceil(1_000) + 1;
        let now = item.now_ms / 1_000;
        if connection
            .cas(key, back, expiry(lifetime, now), token)
            .await?
        {
            return Ok(back);
        }
    }
    Err(io::Error::other(
        "a token bucket kept changing between gets and cas",
    ))
}

/// Adds each item's hits on one connection and returns the totals.
async fn count(
    connection: &mut Connection,
    items: &[&Increment],
    jitter_max: u64,
) -> std::io::Result<Vec<u64>> {
    let mut totals = vec![0; items.len()];
    let mut pending: Vec<usize> = (0..items.len()).collect();
    for _ in 0..RACE_ATTEMPTS {
        let asks: Vec<(&str, u64)> = pending
            .iter()
            .map(|&i| (items[i].key.as_str(), items[i].store_hits()))
            .collect();
        let replies = connection.incr(&asks).await?;
        let mut missing = Vec::new();
        let mut wrapped = Vec::new();
        for (&i, reply) in pending.iter().zip(replies) {
            match reply {
                // memcached wraps at 2^64: a total below what was just added went round.
                Incremented::To(total) if total < items[i].store_hits() => {
                    totals[i] = u64::MAX;
                    wrapped.push((items[i].key.as_str(), u64::MAX - total));
                }
                Incremented::To(total) => totals[i] = total,
                Incremented::Missing => missing.push(i),
            }
        }
        if !wrapped.is_empty() {
            // Back to the top, so that the counter stays over every limit.
            connection.incr(&wrapped).await?;
        }
        if missing.is_empty() {
            return Ok(totals);
        }
        let now = unix_now();
        let adds: Vec<(&str, u64, u64)> = missing
            .iter()
            .map(|&i| {
                let jitter = if jitter_max > 0 {
                    fastrand::u64(0..jitter_max)
                } else {
                    0
                };
                (
                    items[i].key.as_str(),
                    items[i].store_hits(),
                    // memcached expires by whole seconds of its own clock, so a counter
                    // can go up to a second early: one more keeps it for its window (its
                    // key names the window, so living longer changes nothing else).
                    expiry(items[i].expiry_seconds(jitter) + 1, now),
                )
            })
            .collect();
        let added = connection.add(&adds).await?;
        pending = Vec::new();
        for (&i, reply) in missing.iter().zip(added) {
            match reply {
                Added::Stored => totals[i] = items[i].store_hits(),
                Added::Exists => pending.push(i),
            }
        }
        if pending.is_empty() {
            return Ok(totals);
        }
    }
    Err(std::io::Error::other(
        "a counter kept appearing and disappearing between incr and add",
    ))
}

/// The expiry field for a counter living `seconds`: relative up to 30 days, an
/// absolute unix time beyond (memcached's rule; upstream sends the duration, so its
/// month and year counters expire at once).
pub(super) fn expiry(seconds: u64, now: u64) -> u64 {
    if seconds > LONGEST_RELATIVE_EXPIRY {
        now + seconds
    } else {
        seconds
    }
}
