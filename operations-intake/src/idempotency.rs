//! `Idempotency-Key`: the first successful answer for a key is remembered for a while, and
//! a retry with the same key and body gets it again without producing a second message.
//! Keys are global, not per client: the key is also the Kafka message key, which
//! consumers deduplicate on, so two clients must not share one.
//!
//! Only acknowledged batches are remembered: a refused batch recorded nothing, and a
//! batch whose fate is unknown must be retried (with the same key, which is also the
//! Kafka message key, so consumers can drop the duplicate if both arrived).

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// The longest accepted key.
pub const MAX_KEY_LEN: usize = 255;

/// What a lookup found.
#[derive(Debug)]
pub enum Claim<'a> {
    /// The key is new and now held by the caller until the [`Pending`] is finished or
    /// dropped.
    New(Pending<'a>),
    /// The key already has an answer: send it again.
    Replay(Bytes),
    /// A request with this key is still being processed.
    InProgress,
    /// The key was used with a different body.
    Mismatch,
}

/// A claimed key. [`Pending::finish`] remembers the answer; dropping it unfinished (a
/// refused batch, or a panic) forgets the key so it can be used again.
pub struct Pending<'a> {
    store: &'a Store,
    key: Option<String>,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("key", &self.key).finish()
    }
}

impl Pending<'_> {
    /// Remembers `answer` for the key, from `now`.
    pub fn finish(mut self, answer: Bytes, now: Instant) {
        if let Some(key) = self.key.take() {
            self.store.finish(key, answer, now);
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.store.release(&key);
        }
    }
}

/// Remembered answers, by key.
pub struct Store {
    ttl: Duration,
    max_keys: usize,
    state: Mutex<State>,
    hasher: std::hash::RandomState,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Keys in the order they were finished, which is also their expiry order.
    order: VecDeque<(Instant, String)>,
}

struct Entry {
    body_hash: u64,
    answer: Option<Bytes>,
}

impl Store {
    /// A store that remembers answers for `ttl`, at most `max_keys` of them.
    pub fn new(ttl: Duration, max_keys: usize) -> Store {
        Store {
            ttl,
            max_keys,
            state: Mutex::new(State::default()),
            hasher: std::hash::RandomState::new(),
        }
    }

    /// Looks `key` up for a request with `body` at `now`.
    pub fn claim(&self, key: &str, body: &[u8], now: Instant) -> Claim<'_> {
        let body_hash = self.hasher.hash_one(body);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.expire(now, self.ttl);
        match state.entries.get(key) {
            Some(entry) if entry.body_hash != body_hash => Claim::Mismatch,
            Some(Entry {
                answer: Some(answer),
                ..
            }) => Claim::Replay(answer.clone()),
            Some(_) => Claim::InProgress,
            None => {
                state.entries.insert(
                    key.to_owned(),
                    Entry {
                        body_hash,
                        answer: None,
                    },
                );
                Claim::New(Pending {
                    store: self,
                    key: Some(key.to_owned()),
                })
            }
        }
    }

    fn finish(&self, key: String, answer: Bytes, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = state.entries.get_mut(&key) {
            entry.answer = Some(answer);
            state.order.push_back((now, key));
        }
        while state.order.len() > self.max_keys {
            if let Some((_, oldest)) = state.order.pop_front() {
                state.entries.remove(&oldest);
            }
        }
    }

    fn release(&self, key: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.entries.get(key).is_some_and(|e| e.answer.is_none()) {
            state.entries.remove(key);
        }
    }
}

impl State {
    fn expire(&mut self, now: Instant, ttl: Duration) {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < ttl {
                break;
            }
            if let Some((_, id)) = self.order.pop_front() {
                self.entries.remove(&id);
            }
        }
    }
}

/// Whether `key` is usable: 1 to [`MAX_KEY_LEN`] visible ASCII characters.
pub fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish(claim: Claim<'_>, answer: &'static [u8], now: Instant) {
        match claim {
            Claim::New(pending) => pending.finish(Bytes::from_static(answer), now),
            other => panic!("expected a new key, got {other:?}"),
        }
    }

    #[test]
    fn a_finished_key_replays_until_it_expires() {
        let store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        let pending = store.claim("k", b"body", t0);
        assert!(matches!(store.claim("k", b"body", t0), Claim::InProgress));
        finish(pending, b"answer", t0);
        assert!(matches!(
            store.claim("k", b"body", t0 + Duration::from_secs(9)),
            Claim::Replay(a) if a == "answer"
        ));
        assert!(matches!(store.claim("k", b"other", t0), Claim::Mismatch));
        assert!(matches!(
            store.claim("k", b"body", t0 + Duration::from_secs(10)),
            Claim::New(_)
        ));
    }

    #[test]
    fn an_unfinished_key_is_released_when_dropped() {
        let store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        drop(store.claim("k", b"body", t0));
        assert!(matches!(store.claim("k", b"body", t0), Claim::New(_)));
    }

    #[test]
    fn the_oldest_keys_go_first_when_full() {
        let store = Store::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        for key in ["a", "b", "c"] {
            finish(store.claim(key, b"x", t0), b"ok", t0);
        }
        assert!(matches!(store.claim("a", b"x", t0), Claim::New(_)));
        assert!(matches!(store.claim("c", b"x", t0), Claim::Replay(_)));
    }

    #[test]
    fn keys_must_be_short_visible_ascii() {
        assert!(valid_key("order-42"));
        assert!(!valid_key(""));
        assert!(!valid_key("with space"));
        assert!(!valid_key(&"x".repeat(256)));
    }
}
