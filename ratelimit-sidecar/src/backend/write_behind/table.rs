//! The counters a write-behind replica decides from: for each key, the total the store
//! last reported and the hits counted here since, not yet sent. Pure: the flush loop
//! ([`super`]) takes a batch with [`Table::drain`] and gives the store's answers back
//! with [`Table::settle`].

use std::collections::HashMap;
use std::sync::Mutex;

use ratelimit_core::{CounterOp, Increment};

/// Shards of the table, each behind its own lock.
const SHARDS: usize = 16;
/// How many keys an eviction looks at to pick the one whose window ends first.
const EVICTION_SAMPLE: usize = 8;

/// One shard: entries by their store key (upstream's cache key).
type Shard = HashMap<Box<str>, Entry>;

/// Keys by their store key, in shards.
#[derive(Debug)]
pub struct Table {
    shards: Box<[Mutex<Shard>]>,
    max_per_shard: usize,
}

#[derive(Debug)]
struct Entry {
    /// The store's total at the last flush that reached it.
    known: u64,
    /// Hits counted here and not yet in `known`; refunds count down.
    pending: i64,
    /// Read by a decision since the last flush (a sliding window's previous window):
    /// the next flush reads its total.
    read: bool,
    /// The counter as the plan named it: its key, window and expiry.
    counter: Increment,
}

/// One batch of a flush: what to send, and how many pending hits each carries.
#[derive(Debug, Default)]
pub struct Batch {
    pub increments: Vec<Increment>,
    pub sent: Vec<i64>,
}

/// What [`Table::drain`] found besides the batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Hits never sent because their window ended (or their key was evicted) first.
    pub dropped: u64,
    /// Hits pending in all, sent in this batch or not.
    pub pending: u64,
    /// Keys held.
    pub keys: u64,
}

impl Table {
    /// A table of at most about `max_keys` keys.
    pub fn new(max_keys: usize) -> Table {
        Table {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            max_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    /// Counts `increment` here and returns what the store would report: the known total
    /// plus the hits not yet sent. The second value is the hits evicted to make room.
    pub fn apply(&self, increment: &Increment) -> (u64, u64) {
        let mut shard = self.lock(&increment.key);
        let now = increment.now_ms / 1_000;
        let mut evicted = 0;
        if !shard.contains_key(increment.key.as_str()) {
            evicted = make_room(&mut shard, self.max_per_shard, now);
            let entry = Entry {
                known: 0,
                pending: 0,
                read: false,
                counter: increment.clone(),
            };
            shard.insert(increment.key.as_str().into(), entry);
        }
        let entry = shard
            .get_mut(increment.key.as_str())
            .expect("inserted above");
        let hits = i64::try_from(increment.store_hits()).unwrap_or(i64::MAX);
        match increment.op {
            CounterOp::Add => entry.pending = entry.pending.saturating_add(hits),
            CounterOp::Refund => entry.pending = entry.pending.saturating_sub(hits),
            CounterOp::Read => entry.read = true,
            // Refused when the rules load (`super::refusal`): past every limit.
            _ => return (u64::MAX, evicted),
        }
        (entry.total(), evicted)
    }

    /// What the store would report for `increment` now, counting nothing.
    pub fn current(&self, increment: &Increment) -> u64 {
        let mut shard = self.lock(&increment.key);
        match shard.get_mut(increment.key.as_str()) {
            Some(entry) => {
                entry.read = true;
                entry.total()
            }
            None => 0,
        }
    }

    /// The next flush's batch at unix second `now`: every key with hits to send (a
    /// refund's as one), and every key read since the last flush. Keys whose window has
    /// ended are dropped, with their unsent hits.
    pub fn drain(&self, now: u64) -> (Batch, Drained) {
        let mut batch = Batch::default();
        let mut drained = Drained::default();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            shard.retain(|_, entry| {
                let live = entry.counter.expires > now;
                if !live {
                    drained.dropped += entry.pending.unsigned_abs();
                }
                live
            });
            drained.keys += shard.len() as u64;
            for entry in shard.values_mut() {
                drained.pending += entry.pending.unsigned_abs();
                if entry.pending == 0 && !entry.read {
                    continue;
                }
                let mut increment = entry.counter.clone();
                increment.hits = entry.pending.unsigned_abs();
                increment.op = match entry.pending {
                    0 => CounterOp::Read,
                    n if n > 0 => CounterOp::Add,
                    _ => CounterOp::Refund,
                };
                increment.now_ms = now * 1_000;
                entry.read = false;
                batch.sent.push(entry.pending);
                batch.increments.push(increment);
            }
        }
        (batch, drained)
    }

    /// The store's totals for `batch`, in order: each becomes its key's known total, and
    /// the hits sent leave its pending ones (hits counted during the flush stay).
    pub fn settle(&self, batch: &Batch, totals: &[u64]) {
        for ((increment, &sent), &total) in batch.increments.iter().zip(&batch.sent).zip(totals) {
            let mut shard = self.lock(&increment.key);
            if let Some(entry) = shard.get_mut(increment.key.as_str()) {
                entry.known = total;
                entry.pending = entry.pending.saturating_sub(sent);
            }
        }
    }

    fn lock(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let index = shard_of(key);
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Entry {
    fn total(&self) -> u64 {
        let total = i128::from(self.known) + i128::from(self.pending);
        u64::try_from(total.max(0)).unwrap_or(u64::MAX)
    }
}

/// A stable shard for `key` (FNV-1a).
fn shard_of(key: &str) -> usize {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash >> 32) as usize % SHARDS
}

/// Room for one more key in a full shard: keys whose window ended go first, then the one
/// whose window ends soonest among a few. Returns the unsent hits that went with them.
fn make_room(shard: &mut Shard, max: usize, now: u64) -> u64 {
    if shard.len() < max {
        return 0;
    }
    let mut dropped = 0;
    shard.retain(|_, entry| {
        let live = entry.counter.expires > now;
        if !live {
            dropped += entry.pending.unsigned_abs();
        }
        live
    });
    if shard.len() >= max {
        let victim = shard
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, entry)| entry.counter.expires)
            .map(|(key, _)| key.clone());
        if let Some(key) = victim
            && let Some(entry) = shard.remove(&key)
        {
            dropped += entry.pending.unsigned_abs();
        }
    }
    dropped
}
