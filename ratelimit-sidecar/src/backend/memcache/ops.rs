//! A node's share of a request's counters, in rounds on the node's connection: each
//! round sends the next command of every counter not yet settled, in one batch.
//!
//! A window's counter is `incr`ed; one that does not exist yet is created with `add`,
//! and when another client created it first, `incr`ed again. A sliding window's
//! previous counter is read with `get`, a refund is a `decr`. A token bucket is read
//! with `gets` and written with `cas` (or `add` when there is none), and read again when
//! another client changed it in between; a concurrency limit's lease set likewise
//! ([`leases`](super::leases)). Most requests settle in one round.

use std::time::Instant;

use ratelimit_core::{Bucket, CounterOp, Increment};
use ratelimit_service_kit::clock::unix_now;
use smallvec::{SmallVec, smallvec};

use super::connection::Link;
use super::leases::{self, Next};
use super::protocol::{Commands, Reply};
use super::{LONGEST_RELATIVE_EXPIRY, RACE_ATTEMPTS};
use crate::backend::Totals;
use crate::backend::waiting::Failure;

/// What a counter does next, with the rounds its races have taken so far.
#[derive(Clone, Debug)]
enum Step {
    /// `incr` by the hits.
    Incr(usize),
    /// `add` the hits: the counter did not exist.
    Add(usize),
    /// `incr` by this much: the counter wrapped at 2^64, and goes back to the top.
    Unwrap(u64),
    /// `decr` by the hits: a refund.
    Decr,
    /// `get`: a sliding window's previous counter, or a current count.
    Get,
    /// `gets` a token bucket (or a refund's), or a lease set.
    Gets(usize),
    /// Store a bucket's new time or a lease set with `cas` (`add` when there was none),
    /// then answer.
    Swap(Swap),
    Done(u64),
}

#[derive(Clone, Debug)]
struct Swap {
    tries: usize,
    value: Value,
    expiry: u64,
    /// `None`: no value yet, so `add`.
    token: Option<u64>,
    answer: u64,
}

/// What a swap stores: a bucket's time, or a lease set's text.
#[derive(Clone, Debug)]
enum Value {
    Number(u64),
    Text(Box<[u8]>),
}

/// Why a counter's operation failed.
type Error = String;

/// Adds each item's hits (or runs its operation) and returns what the store reports,
/// in item order.
pub(super) async fn increment(
    link: &Link,
    items: &[&Increment],
    jitter_max: u64,
    deadline: Instant,
) -> Result<Totals, Failure> {
    let steps = items.iter().map(|item| match item.op {
        CounterOp::Add => Step::Incr(0),
        CounterOp::Read => Step::Get,
        CounterOp::Refund => Step::Decr,
        CounterOp::Gcra(_) | CounterOp::GcraRefund(_) => Step::Gets(0),
        CounterOp::Acquire(_) | CounterOp::Release(_) => Step::Gets(0),
    });
    rounds(link, items, steps.collect(), jitter_max, deadline).await
}

/// The items' current totals (0 for a missing counter), in order.
pub(super) async fn current(
    link: &Link,
    items: &[&Increment],
    deadline: Instant,
) -> Result<Totals, Failure> {
    let steps = items.iter().map(|_| Step::Get).collect();
    rounds(link, items, steps, 0, deadline).await
}

/// Whether the node answers `version`.
pub(super) async fn version(link: &Link) -> Result<(), Failure> {
    match link
        .query(None, |commands| commands.version())
        .await?
        .as_slice()
    {
        [Reply::Version] => Ok(()),
        other => Err(Failure::Failed(format!(
            "unexpected answer to version: {other:?}"
        ))),
    }
}

/// Runs the steps, one round trip per round, until every one is done or `deadline`
/// passes.
async fn rounds(
    link: &Link,
    items: &[&Increment],
    mut steps: SmallVec<[Step; 4]>,
    jitter_max: u64,
    deadline: Instant,
) -> Result<Totals, Failure> {
    loop {
        // The clock only for a counter that is created (its expiry may be a unix time).
        let now = match steps.iter().any(|step| matches!(step, Step::Add(_))) {
            true => unix_now(),
            false => 0,
        };
        let held = held(items, &steps);
        let replies = link
            .query(Some(deadline), |commands| {
                for ((item, step), held) in items.iter().zip(&steps).zip(&held) {
                    if !held {
                        send(commands, item, step, jitter_max, now);
                    }
                }
            })
            .await?;
        let mut replies = replies.into_iter();
        let mut pending = false;
        for ((item, step), held) in items.iter().zip(steps.iter_mut()).zip(held) {
            if !held && !matches!(step, Step::Done(_)) {
                let fewer = || Failure::Failed("fewer replies than commands".into());
                let reply = replies.next().ok_or_else(fewer)?;
                *step = next(item, step.clone(), reply).map_err(Failure::Failed)?;
            }
            pending |= !matches!(step, Step::Done(_));
        }
        if !pending {
            return Ok(steps
                .iter()
                .map(|step| match step {
                    Step::Done(value) => *value,
                    _ => unreachable!("every step is done"),
                })
                .collect());
        }
    }
}

/// The steps held back this round: a request may name the same token bucket more than
/// once, and its steps on it go one after the other (in request order), as separate
/// requests' would, instead of racing each other's `cas`.
fn held(items: &[&Increment], steps: &[Step]) -> SmallVec<[bool; 4]> {
    let mut held = smallvec![false; steps.len()];
    // Most requests name one counter, which nothing can hold back.
    if steps.len() < 2 {
        return held;
    }
    let mut buckets: SmallVec<[usize; 4]> = (0..steps.len())
        .filter(|&i| matches!(steps[i], Step::Gets(_) | Step::Swap(_)))
        .collect();
    if buckets.len() < 2 {
        return held;
    }
    // A stable sort: of the steps on one bucket, the first in request order goes.
    buckets.sort_by(|&a, &b| items[a].key.cmp(&items[b].key));
    for pair in buckets.windows(2) {
        if items[pair[0]].key == items[pair[1]].key {
            held[pair[1]] = true;
        }
    }
    held
}

/// Writes a step's command (none once it is done).
fn send(commands: &mut Commands<'_>, item: &Increment, step: &Step, jitter_max: u64, now: u64) {
    let key = item.key.as_str();
    match step {
        Step::Incr(_) => commands.incr(key, item.store_hits()),
        Step::Add(_) => {
            let jitter = if jitter_max > 0 {
                fastrand::u64(0..jitter_max)
            } else {
                0
            };
            // memcached expires by whole seconds of its own clock, so a counter can go
            // up to a second early: one more keeps it for its window (its key names the
            // window, so living longer changes nothing else).
            let lifetime = item.expiry_seconds(jitter) + 1;
            commands.add(key, item.store_hits(), expiry(lifetime, now));
        }
        Step::Unwrap(by) => commands.incr(key, *by),
        Step::Decr => commands.decr(key, item.store_hits()),
        Step::Get => commands.get(key),
        Step::Gets(_) => commands.gets(key),
        Step::Swap(swap) => match (&swap.value, swap.token) {
            (Value::Number(n), Some(token)) => commands.cas(key, *n, swap.expiry, token),
            (Value::Number(n), None) => commands.add(key, *n, swap.expiry),
            (Value::Text(text), Some(token)) => commands.cas_text(key, text, swap.expiry, token),
            (Value::Text(text), None) => commands.add_text(key, text, swap.expiry),
        },
        Step::Done(_) => {}
    }
}

/// The step after `step`'s `reply`.
fn next(item: &Increment, step: Step, reply: Reply) -> Result<Step, Error> {
    let hits = item.store_hits();
    Ok(match (step, reply) {
        (_, Reply::Error(error)) => return Err(format!("memcached answered {error}")),
        // memcached wraps at 2^64: a total below what was just added went round.
        (Step::Incr(_), Reply::Number(total)) if total < hits => Step::Unwrap(u64::MAX - total),
        (Step::Incr(_), Reply::Number(total)) => Step::Done(total),
        (Step::Incr(tries), Reply::NotFound) => Step::Add(tries),
        (Step::Add(_), Reply::Stored) => Step::Done(hits),
        (Step::Add(tries), Reply::NotStored) if tries + 1 < RACE_ATTEMPTS => Step::Incr(tries + 1),
        (Step::Add(_), Reply::NotStored) => {
            return Err("a counter kept appearing and disappearing between incr and add".into());
        }
        // The counter stays at the top, over every limit.
        (Step::Unwrap(_), Reply::Number(_) | Reply::NotFound) => Step::Done(u64::MAX),
        // A counter nobody has stays so, at 0.
        (Step::Decr, Reply::Number(left)) => Step::Done(left),
        (Step::Decr | Step::Get, Reply::NotFound) => Step::Done(0),
        (Step::Get, Reply::Found { value, .. }) => Step::Done(value),
        (Step::Get, Reply::Text { data, .. }) => match item.op {
            CounterOp::Acquire(_) | CounterOp::Release(_) => {
                Step::Done(leases::in_use(item, &data)?)
            }
            // Not a number: 0, as before lease sets were text.
            _ => Step::Done(0),
        },
        (Step::Gets(tries), reply @ (Reply::NotFound | Reply::Text { .. }))
            if matches!(item.op, CounterOp::Acquire(_) | CounterOp::Release(_)) =>
        {
            match leases::after_gets(item, reply)? {
                Next::Done(answer) => Step::Done(answer),
                Next::Put(put) => Step::Swap(Swap {
                    tries,
                    value: Value::Text(put.text),
                    expiry: expiry(put.lifetime, item.now_ms / 1_000),
                    token: put.token,
                    answer: put.answer,
                }),
            }
        }
        (Step::Gets(tries), found @ (Reply::Found { .. } | Reply::NotFound)) => {
            let current = match found {
                Reply::Found { value, token } => Some((value, token)),
                _ => None,
            };
            match item.op {
                CounterOp::GcraRefund(bucket) => refund(item, bucket, current, tries),
                CounterOp::Gcra(bucket) => take(item, bucket, current, tries),
                _ => unreachable!("only buckets are read with gets"),
            }
        }
        (Step::Swap(swap), Reply::Stored) => Step::Done(swap.answer),
        (Step::Swap(swap), Reply::Exists | Reply::NotFound | Reply::NotStored)
            if swap.tries + 1 < RACE_ATTEMPTS =>
        {
            Step::Gets(swap.tries + 1)
        }
        (Step::Swap(swap), Reply::Exists | Reply::NotFound | Reply::NotStored) => {
            let what = match swap.value {
                Value::Number(_) => "a token bucket",
                Value::Text(_) => "a lease set",
            };
            return Err(format!("{what} kept changing between gets and cas"));
        }
        (step, reply) => return Err(format!("unexpected reply to {step:?}: {reply:?}")),
    })
}

/// One step of a token bucket whose stored time and token are `current`.
fn take(item: &Increment, bucket: Bucket, current: Option<(u64, u64)>, tries: usize) -> Step {
    let (keep, answer) = bucket.step(current.map_or(0, |(tat, _)| tat), item.now_ms, item.hits);
    match current {
        Some((tat, _)) if tat == keep => Step::Done(answer),
        _ => swap(item, keep, current, tries, answer),
    }
}

/// A refund's tokens given back to a bucket whose stored time and token are `current`;
/// its new time is the answer (0 when there is no bucket: it is full).
fn refund(item: &Increment, bucket: Bucket, current: Option<(u64, u64)>, tries: usize) -> Step {
    let Some((tat, _)) = current else {
        return Step::Done(0);
    };
    let back = bucket.refund(tat, item.now_ms, item.hits);
    match back == tat {
        true => Step::Done(back),
        false => swap(item, back, current, tries, back),
    }
}

fn swap(
    item: &Increment,
    value: u64,
    current: Option<(u64, u64)>,
    tries: usize,
    answer: u64,
) -> Step {
    // memcached takes whole seconds: the bucket stays until it is full again.
    let lifetime = Bucket::expiry_ms(value, item.now_ms).div_ceil(1_000) + 1;
    Step::Swap(Swap {
        tries,
        value: Value::Number(value),
        expiry: expiry(lifetime, item.now_ms / 1_000),
        token: current.map(|(_, token)| token),
        answer,
    })
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
