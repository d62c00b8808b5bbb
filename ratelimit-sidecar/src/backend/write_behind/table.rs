//! The counters a write-behind replica decides from: for each key, the total the store
//! last reported and the hits counted here since, not yet sent. Pure: the flush loop
//! ([`super`]) takes a batch with [`Table::drain`] and gives the store's answers back
//! with [`Table::settle`].

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use ratelimit_core::{CounterOp, Increment};

/// Shards of the table, each behind its own lock.
const SHARDS: usize = 16;
/// How many keys an eviction looks at to pick the one whose window ends first.
const EVICTION_SAMPLE: usize = 8;

/// One shard: entries by the hash of their store key (upstream's cache key).
type Shard = HashTable<Entry>;

/// Keys by their store key, in shards; one hash of the key picks both.
#[derive(Debug)]
pub struct Table {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_per_shard: usize,
}

#[derive(Debug)]
struct Entry {
    hash: u64,
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
            hasher: RandomState::default(),
            max_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    /// Counts `increment` here and returns what the store would report: the known total
    /// plus the hits not yet sent. The second value is the hits evicted to make room.
    pub fn apply(&self, increment: &Increment) -> (u64, u64) {
        let (hash, mut shard) = self.lock(&increment.key);
        let now = increment.now_ms / 1_000;
        let key = increment.key.as_str();
        // A full shard makes room before a new key goes in; otherwise one lookup.
        let mut evicted = 0;
        if shard.len() >= self.max_per_shard && find(&mut shard, hash, key).is_none() {
            evicted = make_room(&mut shard, self.max_per_shard, now);
        }
        let entry = shard
            .entry(
                hash,
                |e| e.hash == hash && *e.counter.key == *key,
                |e| e.hash,
            )
            .or_insert_with(|| Entry {
                hash,
                known: 0,
                pending: 0,
                read: false,
                counter: increment.clone(),
            })
            .into_mut();
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
        let (hash, mut shard) = self.lock(&increment.key);
        match find(&mut shard, hash, &increment.key) {
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
            shard.retain(|entry| {
                let live = entry.counter.expires > now;
                if !live {
                    drained.dropped += entry.pending.unsigned_abs();
                }
                live
            });
            drained.keys += shard.len() as u64;
            for entry in shard.iter_mut() {
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
            let (hash, mut shard) = self.lock(&increment.key);
            if let Some(entry) = find(&mut shard, hash, &increment.key) {
                entry.known = total;
                entry.pending = entry.pending.saturating_sub(sent);
            }
        }
    }

    /// The hash of `key` and its shard, locked.
    fn lock(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.hasher.hash_one(key);
        // The top bits: the table inside the shard uses the low ones.
        let index = (hash >> 60) as usize % SHARDS;
        let shard = self.shards[index].lock();
        (hash, shard.unwrap_or_else(|poisoned| poisoned.into_inner()))
    }
}

impl Entry {
    fn total(&self) -> u64 {
        let total = i128::from(self.known) + i128::from(self.pending);
        u64::try_from(total.max(0)).unwrap_or(u64::MAX)
    }
}

fn find<'a>(shard: &'a mut Shard, hash: u64, key: &str) -> Option<&'a mut Entry> {
    shard.find_mut(hash, |e| e.hash == hash && *e.counter.key == *key)
}

/// Room for one more key in a full shard: keys whose window ended go first, then the one
/// whose window ends soonest among a few. Returns the unsent hits that went with them.
fn make_room(shard: &mut Shard, max: usize, now: u64) -> u64 {
    let mut dropped = 0;
    shard.retain(|entry| {
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
            .min_by_key(|entry| entry.counter.expires)
            .map(|entry| (entry.hash, entry.counter.key.clone()));
        if let Some((hash, key)) = victim
            && let Ok(entry) = shard.find_entry(hash, |e| e.hash == hash && e.counter.key == key)
        {
            dropped += entry.remove().0.pending.unsigned_abs();
        }
    }
    dropped
}
