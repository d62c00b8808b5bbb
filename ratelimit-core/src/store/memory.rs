//! The embedded counter store.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use foldhash::SharedSeed;
use foldhash::fast::{FoldHasher, RandomState};
use hashbrown::HashTable;

use crate::counting::CounterOp;
use crate::counting::counter_key::CounterKey;
use crate::counting::gcra::Bucket;
use crate::counting::lease::Lease;
use crate::engine::Increment;
use crate::store::CounterStore;
use crate::store::leases::LeaseTable;

const SHARDS: usize = 64;
/// Bytes a counter costs beyond values too long to keep in its slot: the slot (one cache
/// line) and the hash table's control byte.
const COUNTER_OVERHEAD: usize = 65;
/// Joined values up to this long are kept in the slot itself, so that finding a counter
/// reads one cache line.
const INLINE_VALUES: usize = 22;
/// How many counters an eviction looks at to pick the one whose window ends first.
const EVICTION_SAMPLE: usize = 8;
/// The byte cap of [`MemoryStore::new`]: 256 MiB.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

/// Sharded counters and token buckets in this process's memory, keyed by limit, window
/// and values ([`CounterKey`]): no key is ever written out as text.
///
/// Lookups of existing counters take a shard's read lock and an atomic add, so two cores
/// rarely wait on each other. Counters whose window has ended are removed as new ones are
/// created, and both the number of counters and the bytes they hold are capped: when a
/// shard is full, the counter whose window ends soonest among a small sample is evicted
/// (and counted in [`MemoryUsage::evictions`]). Counts saturate at `u64::MAX` instead of
/// wrapping.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Shard]>,
    /// The random seeds of counter hashes.
    seed: u64,
    shared_seed: &'static SharedSeed,
    max_per_shard: usize,
    max_bytes_per_shard: usize,
    evictions: AtomicU64,
    /// Concurrency limits' lease sets, as many as counters at most.
    leases: LeaseTable,
}

/// How much a [`MemoryStore`] holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Live and not yet reclaimed counters.
    pub counters: usize,
    /// Approximate bytes held by them.
    pub bytes: usize,
    /// Counters evicted because the store was full.
    pub evictions: u64,
}

#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard(RwLock<ShardMap>);

#[derive(Debug, Default)]
struct ShardMap {
    /// Counters by the hash of their key, computed once per call for shard and slot.
    counters: HashTable<Slot>,
    /// The earliest window end among the counters: nothing expires before it.
    next_expiry: u64,
    bytes: usize,
}

#[derive(Debug)]
#[repr(align(64))]
struct Slot {
    hash: u64,
    identity: u64,
    start: u64,
    values: Joined,
    /// A window's count, or a bucket's TAT (unix milliseconds).
    count: AtomicU64,
    /// Unix second after which the slot is not needed; a bucket's moves forward.
    expires: AtomicU64,
}

impl MemoryStore {
    /// A store holding at most about `max_counters` counters (at least one per shard) in
    /// at most about [`DEFAULT_MAX_BYTES`] (see [`MemoryStore::with_max_bytes`]).
    pub fn new(max_counters: usize) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            seed: RandomState::default().hash_one(SHARDS),
            shared_seed: SharedSeed::global_random(),
            max_per_shard: max_counters.div_ceil(SHARDS).max(1),
            max_bytes_per_shard: DEFAULT_MAX_BYTES / SHARDS,
            evictions: AtomicU64::new(0),
            leases: LeaseTable::new(max_counters),
        }
    }

    /// The same store holding at most about `max_bytes` of counters and keys; a single
    /// counter larger than a shard's share is still kept, alone in its shard.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> MemoryStore {
        self.max_bytes_per_shard = max_bytes.div_ceil(SHARDS).max(1);
        self
    }

    /// Counters, bytes and evictions right now.
    pub fn usage(&self) -> MemoryUsage {
        let mut usage = MemoryUsage {
            evictions: self.evictions.load(Ordering::Relaxed),
            ..MemoryUsage::default()
        };
        for shard in self.shards.iter() {
            let map = shard.read();
            usage.counters += map.counters.len();
            usage.bytes += map.bytes;
        }
        let (sets, bytes) = self.leases.usage();
        usage.counters += sets;
        usage.bytes += bytes;
        usage
    }

    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[shard_index(hash)]
    }
}

impl Default for MemoryStore {
    /// A store capped at one million counters (roughly 100 MB with typical keys).
    fn default() -> MemoryStore {
        MemoryStore::new(1 << 20)
    }
}

impl MemoryStore {
    /// Runs `existing` on the slot of `key`, or creates it with `create` (its value and
    /// the unix second it is needed until) and returns `created` of that value.
    fn with_slot(
        &self,
        key: &CounterKey<'_>,
        now: u64,
        existing: impl Fn(&Slot) -> u64,
        create: impl FnOnce() -> (u64, u64, u64),
    ) -> u64 {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        if let Some(slot) = shard.read().find(hash, key) {
            return existing(slot);
        }
        let mut map = shard.write();
        if let Some(slot) = map.find(hash, key) {
            return existing(slot);
        }
        if now >= map.next_expiry {
            map.remove_expired(now);
        }
        let values = Joined::of(key);
        let size = values.heap_bytes() + COUNTER_OVERHEAD;
        while !map.counters.is_empty()
            && (map.counters.len() >= self.max_per_shard
                || map.bytes + size > self.max_bytes_per_shard)
        {
            map.evict_one();
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let (value, expires, reported) = create();
        if map.counters.is_empty() || expires < map.next_expiry {
            map.next_expiry = expires;
        }
        map.bytes += size;
        let slot = Slot {
            hash,
            identity: key.identity,
            start: key.start,
            values,
            count: AtomicU64::new(value),
            expires: AtomicU64::new(expires),
        };
        map.counters.insert_unique(hash, slot, |s| s.hash);
        reported
    }

    /// Runs `existing` on the slot of `key` while it is needed; 0 when there is none (a
    /// refund never creates a counter).
    fn with_live_slot(
        &self,
        key: &CounterKey<'_>,
        now: u64,
        existing: impl Fn(&Slot) -> u64,
    ) -> u64 {
        let hash = self.hash(key);
        self.shard(hash)
            .read()
            .find(hash, key)
            .filter(|slot| slot.expires() > now)
            .map_or(0, existing)
    }

    #[inline(always)]
    fn hash(&self, key: &CounterKey<'_>) -> u64 {
        // The limit and its window seed the hash of the values: an identity is already a
        // hash, and the rotation keeps a window's start from cancelling it out.
        let seed = self.seed ^ key.identity ^ key.start.rotate_left(29);
        let mut hasher = FoldHasher::with_seed(seed, self.shared_seed);
        key.values.hash_into(&mut hasher);
        hasher.finish()
    }

    /// Runs `increment` (a remote store's counter, from a [`crate::Plan`], an
    /// explanation or a quota rule) on the counter the in-process decision uses.
    pub fn apply(&self, increment: &Increment) -> u64 {
        let key = increment.id.key(&increment.key);
        match increment.op {
            CounterOp::Add => self.increment(
                &key,
                increment.hits,
                increment.expires,
                increment.now_ms / 1_000,
            ),
            CounterOp::Read => self.get(&key, increment.now_ms / 1_000),
            CounterOp::Gcra(bucket) => self.gcra(&key, bucket, increment.hits, increment.now_ms),
            CounterOp::Refund => self.decrement(
                &key,
                increment.hits,
                increment.expires,
                increment.now_ms / 1_000,
            ),
            CounterOp::GcraRefund(bucket) => {
                self.gcra_refund(&key, bucket, increment.hits, increment.now_ms)
            }
            CounterOp::Acquire(lease) => {
                self.acquire(&key, lease, increment.hits, increment.now_ms)
            }
            CounterOp::Release(lease) => self.release(&key, lease, increment.now_ms),
        }
    }

    /// The current value of the counter of `increment`, without changing it.
    pub fn current(&self, increment: &Increment) -> u64 {
        let key = increment.id.key(&increment.key);
        match increment.op {
            CounterOp::Acquire(_) | CounterOp::Release(_) => {
                self.leases.in_use(&key, increment.now_ms)
            }
            _ => self.get(&key, increment.now_ms / 1_000),
        }
    }
}

impl CounterStore for MemoryStore {
    fn increment(&self, key: &CounterKey<'_>, hits: u64, expires: u64, now: u64) -> u64 {
        self.with_slot(key, now, |slot| slot.add(hits), || (hits, expires, hits))
    }

    fn get(&self, key: &CounterKey<'_>, now: u64) -> u64 {
        let hash = self.hash(key);
        self.shard(hash)
            .read()
            .find(hash, key)
            .filter(|slot| slot.expires() > now)
            .map_or(0, |slot| slot.count.load(Ordering::Relaxed))
    }

    fn decrement(&self, key: &CounterKey<'_>, hits: u64, _expires: u64, now: u64) -> u64 {
        self.with_live_slot(key, now, |slot| {
            slot.update(|count| count.saturating_sub(hits))
        })
    }

    fn gcra_refund(&self, key: &CounterKey<'_>, bucket: Bucket, cost: u64, now_ms: u64) -> u64 {
        self.with_live_slot(key, now_ms / 1_000, |slot| {
            slot.update(|tat| bucket.refund(tat, now_ms, cost))
        })
    }

    fn gcra(&self, key: &CounterKey<'_>, bucket: Bucket, cost: u64, now_ms: u64) -> u64 {
        self.with_slot(
            key,
            now_ms / 1_000,
            |slot| slot.step(bucket, cost, now_ms),
            || {
                let (keep, next) = bucket.step(0, now_ms, cost);
                (keep, bucket_expiry(keep, now_ms), next)
            },
        )
    }

    fn acquire(&self, key: &CounterKey<'_>, lease: Lease, hits: u64, now_ms: u64) -> u64 {
        let (in_use, evicted) = self.leases.acquire(key, lease, hits, now_ms);
        if evicted {
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        in_use
    }

    fn release(&self, key: &CounterKey<'_>, lease: Lease, now_ms: u64) -> u64 {
        self.leases.release(key, lease, now_ms)
    }
}

/// The shard of a counter whose key hashes to `hash`: the top six bits of the hash
/// multiplied by an odd constant, which every bit of the hash moves. The table inside a
/// shard finds a bucket with the low bits and tells its entries apart by a tag of the top
/// seven, so the shard must not be either: with the top bits, every counter of a shard
/// had nearly the same tag, and a lookup compared about half the slots of its group. Nor
/// is it a fixed run of the hash's bits: for some seeds, short keys that differ in a
/// character or two (`k1_60`, `k2_60`) left a sixth of the shards unused in bits 51 to 56.
fn shard_index(hash: u64) -> usize {
    (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % SHARDS
}

/// The unix second after which a bucket whose TAT is `tat` is full, so not needed.
fn bucket_expiry(tat: u64, now_ms: u64) -> u64 {
    tat.max(now_ms).div_ceil(1_000) + 1
}

impl Slot {
    /// Sets the value to `change` of it, atomically, and returns the new value.
    fn update(&self, change: impl Fn(u64) -> u64) -> u64 {
        let previous = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |value| {
                Some(change(value))
            })
            .unwrap_or_else(|value| value);
        change(previous)
    }

    /// Adds `hits`, saturating, and returns the new count.
    fn add(&self, hits: u64) -> u64 {
        let previous = self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |count| {
                Some(count.saturating_add(hits))
            })
            .unwrap_or_else(|count| count);
        previous.saturating_add(hits)
    }

    /// One bucket step on the TAT this slot holds, atomically.
    fn step(&self, bucket: Bucket, cost: u64, now_ms: u64) -> u64 {
        let (mut kept, mut reported) = (0, 0);
        let _ = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |stored| {
                (kept, reported) = bucket.step(stored, now_ms, cost);
                Some(kept)
            });
        // Most steps leave the bucket's expiry where it is: only a later one is written.
        let expiry = bucket_expiry(kept, now_ms);
        if self.expires.load(Ordering::Relaxed) < expiry {
            self.expires.fetch_max(expiry, Ordering::Relaxed);
        }
        reported
    }

    fn expires(&self) -> u64 {
        self.expires.load(Ordering::Relaxed)
    }
}

/// A counter's values, joined ([`crate::counting::counter_key::Values::join`]): in the slot when
/// they fit.
#[derive(Debug)]
enum Joined {
    Inline { len: u8, bytes: [u8; INLINE_VALUES] },
    Heap(Box<[u8]>),
}

impl Joined {
    fn of(key: &CounterKey<'_>) -> Joined {
        let mut bytes = [0; INLINE_VALUES];
        match key.values.join_into(&mut bytes) {
            Some(len) => Joined::Inline {
                len: len as u8,
                bytes,
            },
            None => Joined::Heap(key.values.join()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Joined::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Joined::Heap(bytes) => bytes,
        }
    }

    /// Bytes held outside the slot.
    fn heap_bytes(&self) -> usize {
        match self {
            Joined::Inline { .. } => 0,
            Joined::Heap(bytes) => bytes.len(),
        }
    }
}

impl Shard {
    fn read(&self) -> RwLockReadGuard<'_, ShardMap> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, ShardMap> {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ShardMap {
    fn find(&self, hash: u64, key: &CounterKey<'_>) -> Option<&Slot> {
        self.counters.find(hash, |slot| {
            slot.identity == key.identity
                && slot.start == key.start
                && key.values.matches(slot.values.as_bytes())
        })
    }

    fn remove_expired(&mut self, now: u64) {
        let mut freed = 0;
        let mut next = u64::MAX;
        self.counters.retain(|slot| {
            let live = slot.expires() > now;
            if live {
                next = next.min(slot.expires());
            } else {
                freed += slot.values.heap_bytes() + COUNTER_OVERHEAD;
            }
            live
        });
        self.bytes -= freed;
        self.next_expiry = next;
    }

    fn evict_one(&mut self) {
        let victim = self
            .counters
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|slot| slot.expires())
            .map(|slot| (slot.hash, slot as *const Slot));
        if let Some((hash, victim)) = victim
            && let Ok(entry) = self
                .counters
                .find_entry(hash, |slot| std::ptr::eq(slot, victim))
        {
            let (slot, _) = entry.remove();
            self.bytes -= slot.values.heap_bytes() + COUNTER_OVERHEAD;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn increment(store: &MemoryStore, key: &str, hits: u64, expires: u64, now: u64) -> u64 {
        store.increment(&CounterKey::of_text(key), hits, expires, now)
    }

    fn get(store: &MemoryStore, key: &str, now: u64) -> u64 {
        store.get(&CounterKey::of_text(key), now)
    }

    #[test]
    fn counts_per_key_and_reads_back() {
        let store = MemoryStore::new(100);
        assert_eq!(increment(&store, "a_60", 1, 120, 61), 1);
        assert_eq!(increment(&store, "a_60", 2, 120, 62), 3);
        assert_eq!(increment(&store, "b_60", 5, 120, 62), 5);
        assert_eq!(get(&store, "a_60", 63), 3);
        assert_eq!(get(&store, "missing", 63), 0);
        assert_eq!(get(&store, "a_60", 120), 0, "an ended window reads as zero");
    }

    #[test]
    fn ended_windows_are_reclaimed_when_new_counters_arrive() {
        let store = MemoryStore::new(10_000);
        for i in 0..1_000 {
            increment(&store, &format!("k{i}_0"), 1, 60, 10);
        }
        assert_eq!(store.usage().counters, 1_000);
        let full = store.usage().bytes;
        assert!(full >= 1_000 * COUNTER_OVERHEAD);
        // A later window: each shard sweeps on its first insert after the old windows end.
        for i in 0..1_000 {
            increment(&store, &format!("k{i}_60"), 1, 120, 70);
        }
        let usage = store.usage();
        assert_eq!(usage.counters, 1_000, "old windows were dropped");
        // Which relies on the new keys reaching every shard.
        let shards: std::collections::BTreeSet<usize> = (0..1_000)
            .map(|i| shard_index(store.hash(&CounterKey::of_text(&format!("k{i}_60")))))
            .collect();
        assert_eq!(shards.len(), SHARDS);
        assert_eq!(usage.evictions, 0);
    }

    #[test]
    fn values_in_the_slot_and_on_the_heap_count_apart() {
        let store = MemoryStore::new(100);
        // 21 bytes and the separator fit the slot; 22 do not.
        let (short, long) = ("v".repeat(INLINE_VALUES - 1), "v".repeat(INLINE_VALUES));
        assert_eq!(increment(&store, &short, 1, 60, 1), 1);
        assert_eq!(increment(&store, &long, 2, 60, 1), 2);
        assert_eq!(increment(&store, &short, 1, 60, 1), 2);
        assert_eq!((get(&store, &short, 1), get(&store, &long, 1)), (2, 2));
        let usage = store.usage();
        assert_eq!(usage.counters, 2);
        assert_eq!(usage.bytes, 2 * COUNTER_OVERHEAD + INLINE_VALUES + 1);
    }

    #[test]
    fn counters_of_one_shard_keep_distinct_tags() {
        let store = MemoryStore::new(100);
        let hashes = (0..20_000).map(|i| store.hash(&CounterKey::of_text(&format!("k{i}"))));
        let tags: std::collections::HashSet<u64> = hashes
            .filter(|&hash| shard_index(hash) == 0)
            .map(|hash| hash >> 57)
            .collect();
        // About 300 counters land in the shard: nearly all 128 tags should appear.
        assert!(tags.len() > 100, "{} tags", tags.len());
    }

    #[test]
    fn memory_is_capped_by_evicting() {
        let store = MemoryStore::new(SHARDS * 4);
        for i in 0..10_000 {
            increment(&store, &format!("key-{i}"), 1, 1_000 + i, 0);
        }
        let usage = store.usage();
        assert!(usage.counters <= SHARDS * 4, "{usage:?}");
        assert_eq!(usage.evictions, 10_000 - usage.counters as u64);
    }

    #[test]
    fn counts_saturate_instead_of_wrapping() {
        let store = MemoryStore::new(10);
        assert_eq!(increment(&store, "k_0", 151, 60, 1), 151);
        assert_eq!(increment(&store, "k_0", u64::MAX - 150, 60, 1), u64::MAX);
        assert_eq!(increment(&store, "k_0", 1 << 63, 60, 1), u64::MAX);
        assert_eq!(get(&store, "k_0", 1), u64::MAX);
    }

    #[test]
    fn bytes_are_capped_by_evicting() {
        let store = MemoryStore::new(1 << 20).with_max_bytes(SHARDS * 10_000);
        let value = "v".repeat(4_000);
        for i in 0..2_000 {
            increment(&store, &format!("{value}{i}"), 1, 1_000 + i, 0);
        }
        let usage = store.usage();
        assert!(usage.bytes <= SHARDS * 10_000, "{usage:?}");
        assert!(usage.counters < 2_000 && usage.evictions > 0, "{usage:?}");
        assert_eq!(usage.evictions, 2_000 - usage.counters as u64);
    }

    #[test]
    fn concurrent_increments_are_never_lost() {
        let store = MemoryStore::new(1_000);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        increment(&store, "hot_0", 1, 60, 1);
                    }
                });
            }
        });
        assert_eq!(get(&store, "hot_0", 1), 40_000);
    }
}
