//! The embedded store's concurrency limits: a [`LeaseSet`] per key, beside the counters.
//!
//! Keys come from requests, so the table is bounded: sets whose every lease has lapsed
//! are dropped as new ones arrive, and when it is still full the set among a small sample
//! whose last lease lapses first is evicted (its places are freed early, as when its
//! leases run out).

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use crate::counting::counter_key::CounterKey;
use crate::counting::lease::{Lease, LeaseSet};

/// How many sets an eviction looks at.
const EVICTION_SAMPLE: usize = 8;

/// One key's set: its limit's identity and the joined values of its key name it.
#[derive(Debug)]
struct Held {
    hash: u64,
    identity: u64,
    values: Box<[u8]>,
    set: LeaseSet,
}

/// Lease sets by key, found without writing the key out.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    sets: Mutex<HashTable<Held>>,
    hasher: RandomState,
    max_sets: usize,
}

impl LeaseTable {
    /// A table of at most `max_sets` sets.
    pub fn new(max_sets: usize) -> LeaseTable {
        LeaseTable {
            sets: Mutex::new(HashTable::new()),
            hasher: RandomState::default(),
            max_sets: max_sets.max(1),
        }
    }

    /// [`LeaseSet::acquire`] on the set of `key`, taking a place unless `hits` is 0;
    /// returns the places in use with the request and whether a set was evicted.
    pub fn acquire(
        &self,
        key: &CounterKey<'_>,
        lease: Lease,
        hits: u64,
        now_ms: u64,
    ) -> (u64, bool) {
        let hash = self.hash(key);
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = sets.find_mut(hash, is(key)) {
            return (held.set.acquire(lease, hits > 0, now_ms), false);
        }
        if hits == 0 {
            return (0, false);
        }
        let mut evicted = false;
        if sets.len() >= self.max_sets {
            sets.retain(|held| held.set.in_use(now_ms) > 0);
            if sets.len() >= self.max_sets {
                evict_one(&mut sets);
                evicted = true;
            }
        }
        let mut set = LeaseSet::default();
        let in_use = set.acquire(lease, true, now_ms);
        let held = Held {
            hash,
            identity: key.identity,
            values: key.values.join(),
            set,
        };
        sets.insert_unique(hash, held, |h| h.hash);
        (in_use, evicted)
    }

    /// [`LeaseSet::release`] of `lease` on the set of `key`: the places still in use.
    pub fn release(&self, key: &CounterKey<'_>, lease: Lease, now_ms: u64) -> u64 {
        let hash = self.hash(key);
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(mut entry) = sets.find_entry(hash, is(key)) else {
            return 0;
        };
        let left = entry.get_mut().set.release(lease.id, now_ms);
        if entry.get().set.is_empty() {
            entry.remove();
        }
        left
    }

    /// Places in use on the set of `key`, changing nothing.
    pub fn in_use(&self, key: &CounterKey<'_>, now_ms: u64) -> u64 {
        let hash = self.hash(key);
        let sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        sets.find(hash, is(key))
            .map_or(0, |held| held.set.in_use(now_ms))
    }

    /// Sets held and their approximate bytes.
    pub fn usage(&self) -> (usize, usize) {
        let sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = sets
            .iter()
            .map(|held| 64 + held.values.len() + 16 * held.set.len())
            .sum();
        (sets.len(), bytes)
    }

    fn hash(&self, key: &CounterKey<'_>) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        hasher.write_u64(key.identity);
        key.values.hash_into(&mut hasher);
        hasher.finish()
    }
}

/// Whether `held` is the set of `key`.
fn is<'k>(key: &'k CounterKey<'_>) -> impl Fn(&Held) -> bool + 'k {
    move |held| held.identity == key.identity && key.values.matches(&held.values)
}

/// Removes the set whose last lease lapses first among a few.
fn evict_one(sets: &mut HashTable<Held>) {
    let victim = sets
        .iter()
        .take(EVICTION_SAMPLE)
        .min_by_key(|held| held.set.expires_ms())
        .map(|held| (held.hash, held.identity, held.values.clone()));
    if let Some((hash, identity, values)) = victim
        && let Ok(entry) = sets.find_entry(hash, |h| h.identity == identity && h.values == values)
    {
        entry.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: u64) -> Lease {
        Lease {
            id,
            places: 2,
            lease_ms: 1_000,
        }
    }

    #[test]
    fn each_key_holds_its_own_places_and_a_full_table_evicts() {
        let table = LeaseTable::new(2);
        let (a, b, c) = (
            CounterKey::of_text("a"),
            CounterKey::of_text("b"),
            CounterKey::of_text("c"),
        );
        assert_eq!(table.acquire(&a, lease(1), 1, 0), (1, false));
        assert_eq!(table.acquire(&a, lease(2), 1, 0), (2, false));
        assert_eq!(table.acquire(&a, lease(3), 1, 0), (3, false));
        assert_eq!(table.acquire(&b, lease(1), 1, 500), (1, false));
        assert_eq!(table.in_use(&a, 0), 2);
        // Full: the set whose leases lapse first (a's) goes.
        assert_eq!(table.acquire(&c, lease(1), 1, 600), (1, true));
        assert_eq!(table.in_use(&a, 600), 0);
        assert_eq!(table.in_use(&b, 600), 1);
        assert_eq!(table.release(&b, lease(1), 700), 0);
        assert_eq!(table.usage().0, 1, "an emptied set is dropped");
        // Lapsed sets make room before anything is evicted.
        assert_eq!(table.acquire(&a, lease(1), 1, 5_000), (1, false));
    }
}
