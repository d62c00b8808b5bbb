//! Write-behind counters (`WRITE_BEHIND=true`): a decision reads the last total the
//! store reported for each key plus the hits this replica counted since ([`table`]), and
//! sends nothing; every `WRITE_BEHIND_FLUSH_INTERVAL` the replica sends all its pending
//! hits at once, one command per key with upstream's keys and expiries, and takes the
//! totals the store answers as the new known totals.
//!
//! Between flushes a replica does not see the others' hits, so a key admits up to the
//! hits the fleet admits within `2F + D` (F the interval, D a flush's round trip) past
//! its limit; it never admits fewer than the exact mode. The model in `model.rs` checks
//! both. A flush goes through the store's breakers and deadline. One that fails is sent
//! again once the store answers a ping (so a flush whose answer was lost, and which the
//! store may still run, is the only one that can count twice: the store refuses sooner,
//! never later). A window that ends first takes its unsent hits with it
//! (`write_behind.dropped_hits`).

#[cfg(test)]
mod model;
pub mod table;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::stats::{Counter, StatsRegistry, Timer, names};
use ratelimit_core::{Algorithm, Config, Increment};
use ratelimit_service_kit::clock::unix_now;

use self::table::Table;
use super::{Remote, Totals};

/// Keys sent in one call of a flush.
const KEYS_PER_CALL: usize = 4_096;

/// The replica's counters and the store they are flushed to.
#[derive(Debug)]
pub struct WriteBehind {
    table: Table,
    remote: Remote,
    interval: Duration,
    pending: Arc<AtomicU64>,
    keys: Arc<AtomicU64>,
    flushes: Arc<Counter>,
    flush_errors: Arc<Counter>,
    dropped: Arc<Counter>,
    flush_time: Arc<Timer>,
}

impl WriteBehind {
    /// Counters in front of `remote`, flushed every `interval`, at most about `max_keys`.
    pub fn new(remote: Remote, interval: Duration, max_keys: usize, stats: &StatsRegistry) -> Self {
        let (pending, keys) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let level = |value: &Arc<AtomicU64>| {
            let value = Arc::downgrade(value);
            Arc::new(move || value.upgrade().map_or(0, |v| v.load(Ordering::Relaxed)))
        };
        stats.gauge(names::WRITE_BEHIND_PENDING_HITS, level(&pending));
        stats.gauge(names::WRITE_BEHIND_KEYS, level(&keys));
        WriteBehind {
            table: Table::new(max_keys),
            remote,
            interval,
            pending,
            keys,
            flushes: stats.counter(names::WRITE_BEHIND_FLUSHES),
            flush_errors: stats.counter(names::WRITE_BEHIND_FLUSH_ERRORS),
            dropped: stats.counter(names::WRITE_BEHIND_DROPPED_HITS),
            flush_time: stats.timer(names::WRITE_BEHIND_FLUSH_TIME),
        }
    }

    /// The store behind.
    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    /// Counts a plan's increments here, at once, and returns what the store would report.
    pub fn apply(&self, increments: &[Increment]) -> Totals {
        let mut evicted = 0;
        let totals = increments
            .iter()
            .map(|increment| {
                let (total, lost) = self.table.apply(increment);
                evicted += lost;
                total
            })
            .collect();
        if evicted > 0 {
            self.dropped.add(evicted);
        }
        totals
    }

    /// The increments' totals as a decision would see them, counting nothing.
    pub fn current(&self, increments: &[Increment]) -> Totals {
        increments.iter().map(|i| self.table.current(i)).collect()
    }

    /// Flushes every interval, one flush at a time, for as long as the process runs;
    /// after a failed flush, nothing more is sent until the store answers a ping.
    pub async fn run(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if !self.flush().await {
                while !self.remote.ping().await {
                    ticks.tick().await;
                }
            }
        }
    }

    /// Sends every pending hit (and reads every key read since the last flush), and
    /// takes the store's totals; `false` when a call failed.
    pub async fn flush(&self) -> bool {
        let started = Instant::now();
        let (batch, drained) = self.table.drain(unix_now());
        self.pending.store(drained.pending, Ordering::Relaxed);
        self.keys.store(drained.keys, Ordering::Relaxed);
        if drained.dropped > 0 {
            self.dropped.add(drained.dropped);
        }
        if batch.increments.is_empty() {
            return true;
        }
        let mut totals = Vec::with_capacity(batch.increments.len());
        for chunk in batch.increments.chunks(KEYS_PER_CALL) {
            match self.remote.send(chunk).await {
                Ok(sent) => totals.extend_from_slice(&sent),
                Err(error) => {
                    // The pending hits stay, for the next flush.
                    self.flush_errors.add(1);
                    tracing::warn!(%error, keys = chunk.len(), "write-behind flush failed; its hits are sent again with the next");
                    break;
                }
            }
        }
        // Settles the keys whose call answered, as far as they go.
        self.table.settle(&batch, &totals);
        self.flushes.add(1);
        self.flush_time.record(started.elapsed());
        totals.len() == batch.increments.len()
    }
}

/// Why `config` cannot be counted write-behind: the first rule whose algorithm needs the
/// store's compare-and-swap (a token bucket) or holds leases (a concurrency limit).
pub fn refusal(config: &Config) -> Option<String> {
    let needs_store = [Algorithm::TokenBucket { burst: 0 }, Algorithm::Concurrency];
    needs_store.iter().find_map(|algorithm| {
        let name = algorithm.as_str();
        config.rule_using(name).map(|rule| {
            format!(
                "{rule}: algorithm {name} cannot be counted write-behind (WRITE_BEHIND=true): it needs the store's answer for each request"
            )
        })
    })
}
