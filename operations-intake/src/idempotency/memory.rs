//! The in-process store (`IDEMPOTENCY_STORE=memory`): answers are remembered by this
//! process only, so a retry that reaches another replica, or comes after a restart, is
//! not recognised. Bounded by `IDEMPOTENCY_MAX_KEYS`, oldest first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// The key is new and now held until [`Store::finish`] or [`Store::release`].
    New,
    /// The key already has an answer.
    Replay(Bytes),
    /// A request with this key is still being processed.
    InProgress,
    /// The key was used with a different body.
    Mismatch,
}

/// Remembered answers, by key.
pub struct Store {
    ttl: Duration,
    max_keys: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Keys in the order they were finished, which is also their expiry order.
    order: VecDeque<(Instant, String)>,
}

struct Entry {
    body_hash: [u8; 32],
    answer: Option<Bytes>,
}

impl Store {
    /// A store that remembers answers for `ttl`, at most `max_keys` of them.
    pub fn new(ttl: Duration, max_keys: usize) -> Store {
        Store {
            ttl,
            max_keys,
            state: Mutex::new(State::default()),
        }
    }

    /// Looks `key` up for a request whose body hashes to `body_hash`, at `now`.
    pub fn claim(&self, key: &str, body_hash: [u8; 32], now: Instant) -> Found {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.expire(now, self.ttl);
        match state.entries.get(key) {
            Some(entry) if entry.body_hash != body_hash => Found::Mismatch,
            Some(Entry {
                answer: Some(answer),
                ..
            }) => Found::Replay(answer.clone()),
            Some(_) => Found::InProgress,
            None => {
                state.entries.insert(
                    key.to_owned(),
                    Entry {
                        body_hash,
                        answer: None,
                    },
                );
                Found::New
            }
        }
    }

    /// Remembers `answer` for a claimed key, from `now`.
    pub fn finish(&self, key: String, answer: Bytes, now: Instant) {
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

    /// Forgets a claimed key that has no answer.
    pub fn release(&self, key: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: [u8; 32] = [1; 32];
    const OTHER: [u8; 32] = [2; 32];

    #[test]
    fn a_finished_key_replays_until_it_expires() {
        let store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        assert_eq!(store.claim("k", BODY, t0), Found::New);
        assert_eq!(store.claim("k", BODY, t0), Found::InProgress);
        store.finish("k".into(), Bytes::from_static(b"answer"), t0);
        assert_eq!(
            store.claim("k", BODY, t0 + Duration::from_secs(9)),
            Found::Replay(Bytes::from_static(b"answer"))
        );
        assert_eq!(store.claim("k", OTHER, t0), Found::Mismatch);
        assert_eq!(
            store.claim("k", BODY, t0 + Duration::from_secs(10)),
            Found::New
        );
    }

    #[test]
    fn an_unfinished_key_is_released() {
        let store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        assert_eq!(store.claim("k", BODY, t0), Found::New);
        store.release("k");
        assert_eq!(store.claim("k", BODY, t0), Found::New);
    }

    #[test]
    fn the_oldest_keys_go_first_when_full() {
        let store = Store::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        for key in ["a", "b", "c"] {
            assert_eq!(store.claim(key, BODY, t0), Found::New);
            store.finish(key.into(), Bytes::from_static(b"ok"), t0);
        }
        assert_eq!(store.claim("a", BODY, t0), Found::New);
        assert!(matches!(store.claim("c", BODY, t0), Found::Replay(_)));
    }
}
