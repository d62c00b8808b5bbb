//! Counters in a fixed number of shared-data slots.
//!
//! proxy-wasm can set and read shared data but never delete it, so one entry per cache
//! key would grow without end as windows pass. Instead a counter lives in one of
//! `slots` entries, found by hashing its cache key and probing a few neighbours; a slot
//! whose window has ended is taken over by the next key that needs one. Shared memory
//! stays bounded by `slots` entries whatever the traffic.

use std::cell::RefCell;
use std::collections::HashMap;

use ratelimit_core::{Bucket, CounterKey, CounterStore, Lease};

/// The shared-data operations the counters need (Envoy's, or a test's).
pub trait SharedData {
    /// The value and its compare-and-swap token (`None`, `None` when there is no entry),
    /// or `Err` when the host could not read it.
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Unreadable>;
    /// Writes `value` if the entry still has token `cas`; `false` on a mismatch.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool;
}

/// A slot the host could not read. A counter that cannot be read is reported past every
/// limit, never as empty: taking it for empty would write over it without a
/// compare-and-swap token and restart its count (failing open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unreadable;

/// What a counter that cannot be read reports: past every limit.
const UNREADABLE: u64 = u64::MAX;

/// How many neighbouring slots a key may use before it takes over a live one.
const PROBES: u64 = 8;

/// Counters over [`SharedData`], in `slots` entries.
pub struct SlotCounters<S> {
    shared: S,
    slots: u64,
}

/// A slot's content: the second after which it is free, the count (a bucket's TAT),
/// then the cache key.
struct Slot<'a> {
    window_end: u64,
    count: u64,
    key: &'a [u8],
}

impl<S: SharedData> SlotCounters<S> {
    /// Counters in `slots` (at least `PROBES`) shared-data entries.
    pub fn new(shared: S, slots: u64) -> SlotCounters<S> {
        SlotCounters {
            shared,
            slots: slots.max(PROBES),
        }
    }

    fn slot_name(&self, key: &str, probe: u64) -> String {
        format!(
            "ratelimit_slot_{}",
            (fnv1a(key.as_bytes()).wrapping_add(probe)) % self.slots
        )
    }
}

impl<S: SharedData> SlotCounters<S> {
    /// Replaces the value of `key` (`None` when it has no live slot) by what `change`
    /// makes of it, `(value, expires, reported)`, with compare-and-swap; returns
    /// `reported`.
    fn update(&self, key: &str, now: u64, change: impl Fn(Option<u64>) -> (u64, u64, u64)) -> u64 {
        let mut fallback = None;
        for probe in 0..PROBES {
            let name = self.slot_name(key, probe);
            loop {
                let Ok((value, cas)) = self.shared.get(&name) else {
                    return UNREADABLE;
                };
                let slot = value.as_deref().and_then(decode);
                let (value, expires, reported) = match slot {
                    Some(s) if s.key == key.as_bytes() && s.window_end > now => {
                        change(Some(s.count))
                    }
                    Some(s) if s.window_end > now => {
                        fallback.get_or_insert(name.clone());
                        break;
                    }
                    _ => change(None),
                };
                if self.shared.set(&name, &encode(expires, value, key), cas) {
                    return reported;
                }
            }
        }
        // Every probed slot holds a live counter: take over the first one, as a full
        // cache evicts. That key's count restarts.
        let name = fallback.unwrap_or_else(|| self.slot_name(key, 0));
        loop {
            let Ok((_, cas)) = self.shared.get(&name) else {
                return UNREADABLE;
            };
            let (value, expires, reported) = change(None);
            if self.shared.set(&name, &encode(expires, value, key), cas) {
                return reported;
            }
        }
    }
}

impl<S: SharedData> CounterStore for SlotCounters<S> {
    fn increment(&self, key: &CounterKey<'_>, hits: u64, expires: u64, now: u64) -> u64 {
        key.with_text(|key| self.increment_text(key, hits, expires, now))
    }

    fn gcra(&self, key: &CounterKey<'_>, bucket: Bucket, cost: u64, now_ms: u64) -> u64 {
        key.with_text(|key| {
            self.update(key, now_ms / 1_000, |tat| {
                let (keep, next) = bucket.step(tat.unwrap_or(0), now_ms, cost);
                // Once its TAT has passed, a bucket is full: the slot is free again.
                (keep, keep.max(now_ms).div_ceil(1_000) + 1, next)
            })
        })
    }

    fn get(&self, key: &CounterKey<'_>, now: u64) -> u64 {
        key.with_text(|key| self.get_text(key, now))
    }

    fn decrement(&self, key: &CounterKey<'_>, hits: u64, expires: u64, now: u64) -> u64 {
        // A refund of a counter nobody has leaves it at 0 (a slot held until its window
        // ends, as any counter's).
        key.with_text(|key| {
            self.update(key, now, |count| {
                let left = count.unwrap_or(0).saturating_sub(hits);
                (left, expires, left)
            })
        })
    }

    fn gcra_refund(&self, key: &CounterKey<'_>, bucket: Bucket, cost: u64, now_ms: u64) -> u64 {
        key.with_text(|key| {
            self.update(key, now_ms / 1_000, |tat| {
                let back = bucket.refund(tat.unwrap_or(0), now_ms, cost);
                (back, back.max(now_ms).div_ceil(1_000) + 1, back)
            })
        })
    }

    /// The filter refuses rules with concurrency limits (`FilterConfig::parse`): it sees
    /// no stream's end to give a place back. Were one asked, it is over every limit.
    fn acquire(&self, _: &CounterKey<'_>, _: Lease, _: u64, _: u64) -> u64 {
        UNREADABLE
    }

    fn release(&self, _: &CounterKey<'_>, _: Lease, _: u64) -> u64 {
        0
    }
}

/// The counters by their text: shared data is keyed by upstream's cache keys.
impl<S: SharedData> SlotCounters<S> {
    fn increment_text(&self, key: &str, hits: u64, expires: u64, now: u64) -> u64 {
        self.update(key, now, |count| {
            let total = count.unwrap_or(0).saturating_add(hits);
            (total, expires, total)
        })
    }

    /// Sets the value of `key` to `value` until unix second `until`.
    pub fn set_value(&self, key: &str, value: u64, until: u64, now: u64) {
        self.update(key, now, |_| (value, until, value));
    }

    /// The value of `key` at unix second `now`; 0 when it has none.
    pub fn value(&self, key: &str, now: u64) -> u64 {
        self.get_text(key, now)
    }

    fn get_text(&self, key: &str, now: u64) -> u64 {
        (0..PROBES)
            .find_map(|probe| {
                let Ok((value, _)) = self.shared.get(&self.slot_name(key, probe)) else {
                    return Some(UNREADABLE);
                };
                let slot = decode(value.as_deref()?)?;
                (slot.key == key.as_bytes() && slot.window_end > now).then_some(slot.count)
            })
            .unwrap_or(0)
    }
}

fn encode(window_end: u64, count: u64, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + key.len());
    out.extend_from_slice(&window_end.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out
}

fn decode(value: &[u8]) -> Option<Slot<'_>> {
    if value.len() < 16 {
        return None;
    }
    Some(Slot {
        window_end: u64::from_le_bytes(value[..8].try_into().ok()?),
        count: u64::from_le_bytes(value[8..16].try_into().ok()?),
        key: &value[16..],
    })
}

/// A hash every worker computes alike (no per-process seed).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Shared data kept in this process as Envoy keeps it: a value and a token that changes
/// on every write, refused when the token given is not the current one. For running the
/// counters outside Envoy (tests, fuzzing); it is not shared between threads.
#[derive(Debug, Default)]
pub struct MemoryShared(RefCell<HashMap<String, (Vec<u8>, u32)>>);

impl SharedData for &MemoryShared {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Unreadable> {
        Ok(match self.0.borrow().get(key) {
            Some((value, cas)) => (Some(value.clone()), Some(*cas)),
            None => (None, None),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        let mut map = self.0.borrow_mut();
        let current = map.get(key).map(|(_, token)| *token);
        if cas.is_some() && cas != current {
            return false;
        }
        let next = current.unwrap_or(0).wrapping_add(1);
        map.insert(key.to_owned(), (value.to_vec(), next));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Fake = MemoryShared;

    #[test]
    fn counts_per_key_and_window() {
        let fake = Fake::default();
        let counters = SlotCounters::new(&fake, 64);
        assert_eq!(counters.increment_text("a_60", 1, 120, 61), 1);
        assert_eq!(counters.increment_text("a_60", 2, 120, 62), 3);
        assert_eq!(counters.increment_text("b_60", 1, 120, 62), 1);
        assert_eq!(counters.get_text("a_60", 63), 3);
        assert_eq!(counters.get_text("a_60", 120), 0, "the window ended");
        assert_eq!(counters.get_text("c_60", 63), 0);
    }

    #[test]
    fn shared_memory_stays_bounded_as_windows_pass() {
        let fake = Fake::default();
        let counters = SlotCounters::new(&fake, 32);
        for window in 0..50u64 {
            let (start, end) = (window * 60, window * 60 + 60);
            for client in 0..20 {
                let key = format!("d_client_{client}_{start}");
                assert_eq!(counters.increment_text(&key, 1, end, start + 1), 1, "{key}");
                assert_eq!(counters.increment_text(&key, 1, end, start + 2), 2, "{key}");
            }
        }
        assert!(
            fake.0.borrow().len() <= 32,
            "{} entries",
            fake.0.borrow().len()
        );
    }

    #[test]
    fn a_concurrent_write_is_retried_not_lost() {
        /// Writes another worker's increment between our read and our write, once.
        struct Racing<'a> {
            inner: &'a Fake,
            raced: RefCell<bool>,
        }
        impl SharedData for Racing<'_> {
            fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Unreadable> {
                self.inner.get(key)
            }
            fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
                if !self.raced.replace(true) {
                    let (current, token) = self.inner.get(key).unwrap();
                    let slot = current
                        .as_deref()
                        .and_then(decode)
                        .expect("a counter exists");
                    let other = encode(
                        slot.window_end,
                        slot.count + 5,
                        std::str::from_utf8(slot.key).unwrap(),
                    );
                    assert!(self.inner.set(key, &other, token));
                }
                self.inner.set(key, value, cas)
            }
        }
        let fake = Fake::default();
        SlotCounters::new(&fake, 16).increment_text("k_0", 1, 60, 1);
        let racing = Racing {
            inner: &fake,
            raced: RefCell::new(false),
        };
        let counters = SlotCounters::new(racing, 16);
        assert_eq!(
            counters.increment_text("k_0", 1, 60, 2),
            7,
            "1 + the other worker's 5 + 1"
        );
    }

    #[test]
    fn a_counter_the_host_cannot_read_is_past_its_limit_and_not_written_over() {
        /// Shared data whose reads fail after `fail_after` of them.
        struct Failing<'a> {
            inner: &'a Fake,
            reads: RefCell<u32>,
            fail_after: u32,
        }
        impl SharedData for Failing<'_> {
            fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Unreadable> {
                let mut reads = self.reads.borrow_mut();
                *reads += 1;
                if *reads > self.fail_after {
                    return Err(Unreadable);
                }
                self.inner.get(key)
            }
            fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
                self.inner.set(key, value, cas)
            }
        }
        let fake = Fake::default();
        let counters = SlotCounters::new(&fake, 16);
        assert_eq!(counters.increment_text("k_0", 3, 60, 1), 3);
        let failing = Failing {
            inner: &fake,
            reads: RefCell::new(0),
            fail_after: 0,
        };
        let counters = SlotCounters::new(failing, 16);
        assert_eq!(counters.increment_text("k_0", 1, 60, 2), u64::MAX);
        assert_eq!(counters.get_text("k_0", 2), u64::MAX);
        // The count was not restarted by a write without a token.
        assert_eq!(SlotCounters::new(&fake, 16).get_text("k_0", 2), 3);
    }
}
