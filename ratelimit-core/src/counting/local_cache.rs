//! The local cache of counters known to be over their limit in the current window
//! (`LOCAL_CACHE_SIZE_IN_BYTES`): a remote store is not asked again about them until the
//! window ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use foldhash::fast::RandomState;

use crate::stats::{Counter, StatsRegistry, names};

/// Bytes an entry costs beyond its key.
const ENTRY_OVERHEAD: usize = 40;

/// Cache keys over their limit, each until its window ends, within a byte budget.
#[derive(Debug)]
pub struct OverLimitCache {
    inner: Mutex<Inner>,
    capacity_bytes: usize,
    hits: Arc<Counter>,
    misses: Arc<Counter>,
    evictions: Arc<Counter>,
}

#[derive(Debug, Default)]
struct Inner {
    keys: HashMap<Box<str>, u64, RandomState>,
    bytes: usize,
}

impl OverLimitCache {
    /// A cache of at most `capacity_bytes`, counting `ratelimit.localcache.hitCount`,
    /// `missCount` and `evacuateCount` in `stats`, and reporting its size there as the
    /// `entryCount` and `bytes` gauges.
    pub fn new(capacity_bytes: usize, stats: &StatsRegistry) -> Arc<OverLimitCache> {
        let cache = Arc::new(OverLimitCache {
            inner: Mutex::default(),
            capacity_bytes,
            hits: stats.counter(names::LOCAL_CACHE_HITS),
            misses: stats.counter(names::LOCAL_CACHE_MISSES),
            evictions: stats.counter(names::LOCAL_CACHE_EVICTIONS),
        });
        let weak = Arc::downgrade(&cache);
        let level = move |pick: fn((usize, usize)) -> usize| {
            let weak = weak.clone();
            Arc::new(move || weak.upgrade().map_or(0, |c| pick(c.usage()) as u64))
        };
        stats.gauge(names::LOCAL_CACHE_ENTRIES, level(|(entries, _)| entries));
        stats.gauge(names::LOCAL_CACHE_BYTES, level(|(_, bytes)| bytes));
        cache
    }

    /// Whether `key` is known to be over its limit at `now`.
    pub fn contains(&self, key: &str, now: u64) -> bool {
        let mut inner = self.lock();
        let found = match inner.keys.get(key) {
            Some(&end) if end > now => true,
            Some(_) => {
                inner.remove(key);
                false
            }
            None => false,
        };
        if found { &self.hits } else { &self.misses }.add(1);
        found
    }

    /// Forgets `key`: a refund lowered its counter, so the store is asked again.
    pub fn remove(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Remembers that `key` is over its limit until `window_end`.
    pub fn insert(&self, key: &str, window_end: u64, now: u64) {
        let cost = key.len() + ENTRY_OVERHEAD;
        if cost > self.capacity_bytes {
            return;
        }
        let mut inner = self.lock();
        if inner.keys.contains_key(key) {
            return;
        }
        if inner.bytes + cost > self.capacity_bytes {
            inner.keys.retain(|_, end| *end > now);
            inner.bytes = inner.keys.keys().map(|k| k.len() + ENTRY_OVERHEAD).sum();
        }
        while inner.bytes + cost > self.capacity_bytes {
            let Some(victim) = inner.keys.keys().next().cloned() else {
                break;
            };
            inner.remove(&victim);
            self.evictions.add(1);
        }
        inner.bytes += cost;
        inner.keys.insert(key.into(), window_end);
    }

    /// Entries and bytes held.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.keys.len(), inner.bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn remove(&mut self, key: &str) {
        if self.keys.remove(key).is_some() {
            self.bytes -= key.len() + ENTRY_OVERHEAD;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_expire_with_their_window_and_the_budget_holds() {
        let stats = StatsRegistry::default();
        let cache = OverLimitCache::new(10 * (ENTRY_OVERHEAD + 4), &stats);
        cache.insert("k_60", 120, 61);
        assert!(cache.contains("k_60", 119));
        assert!(!cache.contains("k_60", 120), "the window ended");
        assert!(!cache.contains("other", 61));
        for i in 0..50 {
            cache.insert(&format!("k{i:03}"), 1_000, 100);
        }
        let (entries, bytes) = cache.usage();
        assert!(
            entries <= 10 && bytes <= 10 * (ENTRY_OVERHEAD + 4),
            "{entries} {bytes}"
        );
        let snapshot = stats.snapshot();
        let get = |n: &str| snapshot.counter(n);
        assert_eq!(get("ratelimit.localcache.hitCount"), Some(1));
        assert_eq!(get("ratelimit.localcache.missCount"), Some(2));
        assert_eq!(get("ratelimit.localcache.evacuateCount"), Some(40));
        let gauge = |n: &str| {
            let sample = snapshot.samples.iter().find(|s| s.name.to_string() == n);
            sample.map(|s| s.value.clone())
        };
        assert_eq!(
            gauge("ratelimit.localcache.entryCount"),
            Some(crate::stats::Value::Gauge(entries as u64))
        );
        assert_eq!(
            gauge("ratelimit.localcache.bytes"),
            Some(crate::stats::Value::Gauge(bytes as u64))
        );
    }
}
