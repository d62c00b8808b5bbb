//! The embedded store's concurrency limits: a [`LeaseSet`] per key, beside the counters.
//!
//! Keys come from requests, so the table is bounded: sets whose every lease has lapsed
//! are dropped as new ones arrive, and when it is still full the set among a small sample
//! whose last lease lapses first is evicted (its places are freed early, as when its
//! leases run out).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::counting::counter_key::CounterKey;
use crate::counting::lease::{Lease, LeaseSet};

/// How many sets an eviction looks at.
const EVICTION_SAMPLE: usize = 8;

/// A set's name: its limit's identity and the joined values of its key.
type SetName = (u64, Box<[u8]>);

/// Lease sets by name.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    sets: Mutex<HashMap<SetName, LeaseSet>>,
    max_sets: usize,
}

impl LeaseTable {
    /// A table of at most `max_sets` sets.
    pub fn new(max_sets: usize) -> LeaseTable {
        LeaseTable {
            sets: Mutex::new(HashMap::new()),
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
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let name = (key.identity, key.values.join());
        if let Some(set) = sets.get_mut(&name) {
            return (set.acquire(lease, hits > 0, now_ms), false);
        }
        if hits == 0 {
            return (0, false);
        }
        let mut evicted = false;
        if sets.len() >= self.max_sets {
            sets.retain(|_, set| set.in_use(now_ms) > 0);
            if sets.len() >= self.max_sets {
                evict_one(&mut sets);
                evicted = true;
            }
        }
        let mut set = LeaseSet::default();
        let in_use = set.acquire(lease, true, now_ms);
        sets.insert(name, set);
        (in_use, evicted)
    }

    /// [`LeaseSet::release`] of `lease` on the set of `key`: the places still in use.
    pub fn release(&self, key: &CounterKey<'_>, lease: Lease, now_ms: u64) -> u64 {
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let name = (key.identity, key.values.join());
        let Some(set) = sets.get_mut(&name) else {
            return 0;
        };
        let left = set.release(lease.id, now_ms);
        if set.is_empty() {
            sets.remove(&name);
        }
        left
    }

    /// Places in use on the set of `key`, changing nothing.
    pub fn in_use(&self, key: &CounterKey<'_>, now_ms: u64) -> u64 {
        let sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let name = (key.identity, key.values.join());
        sets.get(&name).map_or(0, |set| set.in_use(now_ms))
    }

    /// Sets held and their approximate bytes.
    pub fn usage(&self) -> (usize, usize) {
        let sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = sets
            .iter()
            .map(|((_, values), set)| 64 + values.len() + 16 * set.len())
            .sum();
        (sets.len(), bytes)
    }
}

/// Removes the set whose last lease lapses first among a few.
fn evict_one(sets: &mut HashMap<SetName, LeaseSet>) {
    let victim = sets
        .iter()
        .take(EVICTION_SAMPLE)
        .min_by_key(|(_, set)| set.expires_ms())
        .map(|(name, _)| name.clone());
    if let Some(name) = victim {
        sets.remove(&name);
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
