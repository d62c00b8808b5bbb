//! `Idempotency-Key`: the first successful answer for a key is remembered for a while, and
//! a retry with the same key and body gets it again without producing a second message.
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
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key is new: the caller now owns it and must [`Store::finish`] or
    /// [`Store::release`] it.
    New,
    /// The key already has an answer: send it again.
    Replay(Bytes),
    /// A request with this key is still being processed.
    InProgress,
    /// The key was used with a different body.
    Mismatch,
}

/// Remembered answers, keyed by client and key.
pub struct Store {
    ttl: Duration,
    max_keys: usize,
    state: Mutex<State>,
    hasher: std::hash::RandomState,
}

#[derive(Default)]
struct State {
    entries: HashMap<(String, String), Entry>,
    /// Keys in the order they were finished, which is also their expiry order.
    order: VecDeque<(Instant, (String, String))>,
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

    fn body_hash(&self, body: &[u8]) -> u64 {
        self.hasher.hash_one(body)
    }

    /// Looks `key` up for `client` sending `body` at `now`.
    pub fn claim(&self, client: &str, key: &str, body: &[u8], now: Instant) -> Claim {
        let body_hash = self.body_hash(body);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.expire(now, self.ttl);
        let id = (client.to_owned(), key.to_owned());
        match state.entries.get(&id) {
            Some(entry) if entry.body_hash != body_hash => Claim::Mismatch,
            Some(Entry {
                answer: Some(answer),
                ..
            }) => Claim::Replay(answer.clone()),
            Some(_) => Claim::InProgress,
            None => {
                state.entries.insert(
                    id,
                    Entry {
                        body_hash,
                        answer: None,
                    },
                );
                Claim::New
            }
        }
    }

    /// Remembers `answer` for a claimed key.
    pub fn finish(&self, client: &str, key: &str, answer: Bytes, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let id = (client.to_owned(), key.to_owned());
        if let Some(entry) = state.entries.get_mut(&id) {
            entry.answer = Some(answer);
            state.order.push_back((now, id));
        }
        while state.order.len() > self.max_keys {
            if let Some((_, oldest)) = state.order.pop_front() {
                state.entries.remove(&oldest);
            }
        }
    }

    /// Forgets a claimed key whose request recorded nothing, so it can be retried.
    pub fn release(&self, client: &str, key: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let id = (client.to_owned(), key.to_owned());
        if state.entries.get(&id).is_some_and(|e| e.answer.is_none()) {
            state.entries.remove(&id);
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

    #[test]
    fn a_finished_key_replays_until_it_expires() {
        let store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        assert_eq!(store.claim("c", "k", b"body", t0), Claim::New);
        assert_eq!(store.claim("c", "k", b"body", t0), Claim::InProgress);
        store.finish("c", "k", Bytes::from_static(b"answer"), t0);
        assert_eq!(
            store.claim("c", "k", b"body", t0 + Duration::from_secs(9)),
            Claim::Replay(Bytes::from_static(b"answer"))
        );
        assert_eq!(store.claim("c", "k", b"other", t0), Claim::Mismatch);
        assert_eq!(store.claim("other-client", "k", b"body", t0), Claim::New);
        assert_eq!(
            store.claim("c", "k", b"body", t0 + Duration::from_secs(10)),
            Claim::New
        );
    }

    #[test]
    fn a_released_key_can_be_claimed_again() {
        let store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        assert_eq!(store.claim("c", "k", b"body", t0), Claim::New);
        store.release("c", "k");
        assert_eq!(store.claim("c", "k", b"body", t0), Claim::New);
    }

    #[test]
    fn the_oldest_keys_go_first_when_full() {
        let store = Store::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        for key in ["a", "b", "c"] {
            assert_eq!(store.claim("c", key, b"x", t0), Claim::New);
            store.finish("c", key, Bytes::from_static(b"ok"), t0);
        }
        assert_eq!(store.claim("c", "a", b"x", t0), Claim::New);
        assert!(matches!(store.claim("c", "c", b"x", t0), Claim::Replay(_)));
    }

    #[test]
    fn keys_must_be_short_visible_ascii() {
        assert!(valid_key("order-42"));
        assert!(!valid_key(""));
        assert!(!valid_key("with space"));
        assert!(!valid_key(&"x".repeat(256)));
    }
}
