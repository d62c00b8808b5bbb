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
    /// An earlier attempt was not acknowledged: the note says where it may be. The key is
    /// now held, as with [`Found::New`]; released, it goes back to this state.
    Unsure(String),
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
    state: Held,
}

/// Where a key stands.
enum Held {
    /// A request holds it; `unsure` is the note to go back to when it gives it up.
    Claimed { unsure: Option<String> },
    /// Answered.
    Done(Bytes),
    /// Not acknowledged: the note says where the batch may be.
    Unsure(String),
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
        match state.entries.get_mut(key) {
            Some(entry) if entry.body_hash != body_hash => Found::Mismatch,
            Some(entry) => match &entry.state {
                Held::Done(answer) => Found::Replay(answer.clone()),
                Held::Claimed { .. } => Found::InProgress,
                Held::Unsure(note) => {
                    let note = note.clone();
                    entry.state = Held::Claimed {
                        unsure: Some(note.clone()),
                    };
                    Found::Unsure(note)
                }
            },
            None => {
                state.entries.insert(
                    key.to_owned(),
                    Entry {
                        body_hash,
                        state: Held::Claimed { unsure: None },
                    },
                );
                Found::New
            }
        }
    }

    /// Remembers `answer` for a claimed key, from `now`.
    pub fn finish(&self, key: String, answer: Bytes, now: Instant) {
        self.settle(key, Held::Done(answer), now);
    }

    /// Records that the batch of a claimed key was not acknowledged, with the `note`
    /// saying where it may be, from `now`.
    pub fn unsure(&self, key: String, note: String, now: Instant) {
        self.settle(key, Held::Unsure(note), now);
    }

    fn settle(&self, key: String, next: Held, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = state.entries.get_mut(&key) {
            entry.state = next;
            state.order.push_back((now, key));
        }
        while state.order.len() > self.max_keys {
            if let Some((_, oldest)) = state.order.pop_front() {
                state.entries.remove(&oldest);
            }
        }
    }

    /// Gives up a claimed key: forgotten, or back to unsure if it was.
    pub fn release(&self, key: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = state.entries.get_mut(key) else {
            return;
        };
        match &mut entry.state {
            Held::Claimed { unsure: Some(note) } => {
                entry.state = Held::Unsure(std::mem::take(note))
            }
            Held::Claimed { unsure: None } => {
                state.entries.remove(key);
            }
            Held::Done(_) | Held::Unsure(_) => {}
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
    fn an_unsure_key_is_held_by_one_retry_and_unsure_again_when_released() {
        let store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        assert_eq!(store.claim("k", BODY, t0), Found::New);
        store.unsure("k".into(), "0 5 1 2 p".into(), t0);
        assert_eq!(store.claim("k", OTHER, t0), Found::Mismatch);
        assert_eq!(
            store.claim("k", BODY, t0),
            Found::Unsure("0 5 1 2 p".into())
        );
        assert_eq!(store.claim("k", BODY, t0), Found::InProgress);
        store.release("k");
        assert_eq!(
            store.claim("k", BODY, t0),
            Found::Unsure("0 5 1 2 p".into())
        );
        store.finish("k".into(), Bytes::from_static(b"found"), t0);
        assert_eq!(
            store.claim("k", BODY, t0),
            Found::Replay(Bytes::from_static(b"found"))
        );
        assert_eq!(
            store.claim("k", BODY, t0 + Duration::from_secs(10)),
            Found::New,
            "expired"
        );
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
