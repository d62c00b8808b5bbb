//! `Idempotency-Key`: the first successful answer for a key is remembered for a while,
//! and a retry with the same key and body gets it again without producing a second
//! message.
//!
//! Keys belong to their client: two clients may use the same key. A key is stored, and
//! becomes the Kafka message key, as `<client id> <key>` (neither may contain a space,
//! so the pair is unambiguous and the message key is unique across clients).
//!
//! Acknowledged batches are remembered with their answer. A refused batch recorded
//! nothing and is forgotten. A batch sent but not acknowledged is remembered as unsure,
//! with where it may be on the topic: its retry finds out (reading the topic back) before
//! producing it again.

pub mod memory;
pub mod redis;

use std::time::Instant;

use bytes::Bytes;

use self::memory::Found;
use sha2::{Digest, Sha256};

use crate::auth::keys::hex;

/// The longest accepted key.
pub const MAX_KEY_LEN: usize = 255;

/// Whether `key` is usable: 1 to [`MAX_KEY_LEN`] visible ASCII characters.
pub fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

/// A key as stored and as the message key: `<client id> <key>`.
pub fn scoped(client_id: &str, key: &str) -> String {
    format!("{client_id} {key}")
}

/// Where answers are remembered.
pub enum Store {
    /// In this process (`IDEMPOTENCY_STORE=memory`).
    Memory(memory::Store),
    /// In Redis, shared by every replica (`IDEMPOTENCY_STORE=redis`).
    Redis(redis::Store),
}

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
    /// An earlier attempt with this key was not acknowledged; the note says where it may
    /// be. The key is now held by the caller, as with [`Claim::New`].
    Unsure(Pending<'a>, String),
}

/// A claimed key. [`Pending::finish`] remembers the answer and [`Pending::unsure`] an
/// unacknowledged attempt; dropping it otherwise (a refused batch, or a panic) gives the
/// key up so it can be used again (unsure again, if it was).
pub struct Pending<'a> {
    store: &'a Store,
    key: Option<String>,
    /// With Redis: the body's SHA-256 in hexadecimal, the value held, and the value
    /// held when it was claimed (before an attempt was noted in it).
    digest: String,
    held: String,
    taken: String,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("key", &self.key).finish()
    }
}

impl Store {
    /// Looks up `scoped_key` (from [`scoped`]) for a request with `body`. An error means
    /// the shared store could not be asked.
    pub async fn claim(&self, scoped_key: &str, body: &[u8]) -> Result<Claim<'_>, String> {
        let hash: [u8; 32] = Sha256::digest(body).into();
        let (found, digest, held) = match self {
            Store::Memory(store) => (
                store.claim(scoped_key, hash, Instant::now()),
                String::new(),
                String::new(),
            ),
            Store::Redis(store) => {
                let digest = hex(&hash);
                let token = uuid::Uuid::new_v4().simple().to_string();
                let (found, held) = store.claim(scoped_key, &digest, &token).await?;
                (found, digest, held)
            }
        };
        let pending = |store| Pending {
            store,
            key: Some(scoped_key.to_owned()),
            digest,
            taken: held.clone(),
            held,
        };
        Ok(match found {
            Found::New => Claim::New(pending(self)),
            Found::Unsure(note) => Claim::Unsure(pending(self), note),
            Found::Replay(answer) => Claim::Replay(answer),
            Found::InProgress => Claim::InProgress,
            Found::Mismatch => Claim::Mismatch,
        })
    }
}

impl Store {
    /// Whether the shared store answers: `None` for the in-process store, which always does.
    pub async fn check(&self) -> Option<Result<(), String>> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(store) => Some(store.ping().await),
        }
    }
}

impl Pending<'_> {
    /// Remembers `answer` for the key. A failure is logged: the batch was recorded, so
    /// the answer stands, but a retry may produce it again (with the same message key).
    pub async fn finish(mut self, answer: Bytes) {
        let Some(key) = self.key.take() else { return };
        match self.store {
            Store::Memory(store) => store.finish(key, answer, Instant::now()),
            Store::Redis(store) => {
                let stored = store.finish(&key, &self.digest, &self.held, &answer).await;
                lost_claim(&key, stored, "a retry may record the batch again");
            }
        }
    }

    /// Notes, before the batch is produced, where it is about to go (`note`), so that
    /// if this process dies before the answer is remembered, the retry that takes the
    /// key over when its lease ends looks for the batch on the topic before producing
    /// it again (with Redis; the memory store dies with the process). An error means the
    /// batch must not be produced.
    pub async fn attempt(&mut self, note: &str) -> Result<(), String> {
        let (Some(key), Store::Redis(store)) = (&self.key, self.store) else {
            return Ok(());
        };
        match store.attempt(key, &self.digest, &self.held, note).await? {
            Some(held) => {
                self.held = held;
                Ok(())
            }
            None => Err(
                "the idempotency claim expired before the batch was produced (IDEMPOTENCY_CLAIM_TTL is too short)"
                    .to_owned(),
            ),
        }
    }

    /// Remembers that the key's batch was sent but not acknowledged, with the `note`
    /// saying where it may be, so that its retry looks there before producing again.
    pub async fn unsure(mut self, note: String) {
        let Some(key) = self.key.take() else { return };
        match self.store {
            Store::Memory(store) => store.unsure(key, note, Instant::now()),
            Store::Redis(store) => {
                let stored = store.unsure(&key, &self.digest, &self.held, &note).await;
                lost_claim(
                    &key,
                    stored,
                    "a retry will not look for the unacknowledged batch and may record it twice",
                );
            }
        }
    }
}

/// Logs a Redis write of a held key that did not happen, and what it may cost.
fn lost_claim(key: &str, stored: Result<bool, String>, cost: &str) {
    match stored {
        Ok(true) => {}
        Ok(false) => tracing::error!(
            key,
            "the idempotency claim expired before the batch was answered (IDEMPOTENCY_CLAIM_TTL is too short): {cost}",
        ),
        Err(error) => {
            tracing::error!(key, %error, "cannot write the idempotency key to Redis: {cost}")
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        match self.store {
            Store::Memory(store) => store.release(&key),
            Store::Redis(store) => {
                let (store, digest) = (store.clone(), self.digest.clone());
                let (held, taken) = (self.held.clone(), self.taken.clone());
                // Off the request: a failure only leaves the claim to expire.
                tokio::spawn(async move {
                    if let Err(error) = store.release(&key, &digest, &held, &taken).await {
                        tracing::warn!(key, %error, "cannot release an idempotency claim; it expires after IDEMPOTENCY_CLAIM_TTL");
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn keys_are_scoped_per_client_and_released_when_dropped() {
        let store = Store::Memory(memory::Store::new(Duration::from_secs(60), 10));
        let mine = scoped("acme", "k1");
        let theirs = scoped("globex", "k1");
        let Claim::New(pending) = store.claim(&mine, b"body").await.unwrap() else {
            panic!("new")
        };
        assert!(matches!(
            store.claim(&mine, b"body").await,
            Ok(Claim::InProgress)
        ));
        assert!(matches!(
            store.claim(&theirs, b"other").await,
            Ok(Claim::New(_))
        ));
        pending.finish(Bytes::from_static(b"answer")).await;
        assert!(matches!(store.claim(&mine, b"body").await, Ok(Claim::Replay(a)) if a == "answer"));
        assert!(matches!(
            store.claim(&mine, b"changed").await,
            Ok(Claim::Mismatch)
        ));
        assert!(
            matches!(store.claim(&theirs, b"other").await, Ok(Claim::New(_))),
            "dropped, so released"
        );
    }

    #[test]
    fn keys_must_be_short_visible_ascii() {
        assert!(valid_key("order-42"));
        assert!(!valid_key(""));
        assert!(!valid_key("with space"));
        assert!(!valid_key(&"x".repeat(256)));
    }
}
