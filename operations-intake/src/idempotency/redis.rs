//! The shared store (`IDEMPOTENCY_STORE=redis`): every replica claims and answers keys in
//! one Redis, so a retry is recognised whichever replica it reaches, and after a restart.
//!
//! A key's value is `P<body sha256><token>` while a request holds it,
//! `D<body sha256><answer>` once answered, and `U<body sha256><note>` when its batch was
//! not acknowledged (the note says where it may be on the topic). The claim is `SET NX PX
//! IDEMPOTENCY_CLAIM_TTL`: one request in the whole fleet wins it, and if its replica dies
//! the claim expires. A retry of an unsure key holds it as `Q<body sha256><token><lease
//! end, ms><note>`, kept for `IDEMPOTENCY_TTL` so the note outlives a replica that dies
//! holding it: once the lease (`IDEMPOTENCY_CLAIM_TTL`) ends, another retry takes it over.
//! A request about to produce its batch holds its key the same way, with its attempt's
//! note, so that a replica dying between the broker's acknowledgement and the answer's
//! write leaves a retry that looks for the batch instead of a claim that expires.
//! Every change of a held value is made only while the value is still the holder's (a
//! script compares), and an answer is kept for `IDEMPOTENCY_TTL`.

use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};

use super::memory::Found;

/// Prefix of every key the intake writes.
pub const KEY_PREFIX: &str = "operations-intake:idempotency:";

/// Replaces the holder's value: KEYS[1], ARGV = held value, next value, ttl ms.
const REPLACE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

/// Deletes the holder's claim: KEYS[1], ARGV = claim.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The connection and the times.
#[derive(Clone)]
pub struct Store {
    connection: ConnectionManager,
    claim_ttl: Duration,
    ttl: Duration,
    timeout: Duration,
    replace: Script,
    release: Script,
}

/// The length of a claim's token (a UUID's 32 hexadecimal digits).
const TOKEN_LEN: usize = 32;
/// The length of a lease's end, in milliseconds, zero-padded.
const LEASE_LEN: usize = 20;

impl Store {
    /// Connects to `url`; an unreachable Redis is an error, so start-up stops.
    pub async fn connect(
        url: &str,
        claim_ttl: Duration,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Store, String> {
        if !url.starts_with("redis://") {
            return Err(format!(
                "IDEMPOTENCY_REDIS_URL {url}: expected redis://host:port[/db] (TLS, rediss://, is not supported here yet)"
            ));
        }
        let client = Client::open(url).map_err(|e| format!("IDEMPOTENCY_REDIS_URL {url}: {e}"))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1);
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| format!("cannot reach Redis at IDEMPOTENCY_REDIS_URL {url}: {e}"))?;
        let store = Store {
            connection,
            claim_ttl,
            ttl,
            timeout,
            replace: Script::new(REPLACE_LUA),
            release: Script::new(RELEASE_LUA),
        };
        let _: String = store
            .run(redis::cmd("PING"))
            .await
            .map_err(|e| format!("Redis at IDEMPOTENCY_REDIS_URL {url}: {e}"))?;
        Ok(store)
    }

    async fn run<T: redis::FromRedisValue>(&self, command: redis::Cmd) -> Result<T, String> {
        let mut connection = self.connection.clone();
        self.within(command.query_async(&mut connection)).await
    }

    /// Runs a script with its keys and arguments.
    async fn invoke(&self, invocation: redis::ScriptInvocation<'_>) -> Result<i64, String> {
        let mut connection = self.connection.clone();
        self.within(invocation.invoke_async(&mut connection)).await
    }

    /// The answer of `call` within IDEMPOTENCY_REDIS_TIMEOUT.
    async fn within<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }

    /// Claims `key` (already scoped to its client) for a body hashing to `digest`,
    /// holding it with `token`: what was found, and the value now held (if any).
    pub async fn claim(
        &self,
        key: &str,
        digest: &str,
        token: &str,
    ) -> Result<(Found, String), String> {
        let redis_key = format!("{KEY_PREFIX}{key}");
        let claim = format!("P{digest}{token}");
        // A value that expires or changes between the calls is looked at again.
        for _ in 0..3 {
            let mut set = redis::cmd("SET");
            set.arg(&redis_key)
                .arg(&claim)
                .arg("NX")
                .arg("PX")
                .arg(millis(self.claim_ttl));
            let won: Option<String> = self.run(set).await?;
            if won.is_some() {
                return Ok((Found::New, claim));
            }
            let mut get = redis::cmd("GET");
            get.arg(&redis_key);
            let Some(value): Option<Vec<u8>> = self.run(get).await? else {
                continue;
            };
            let Some(note) = takeable(&value, digest, now_ms()) else {
                return Ok((found(&value, digest), String::new()));
            };
            let lease = now_ms().saturating_add(millis(self.claim_ttl));
            let held = format!("Q{digest}{token}{lease:0LEASE_LEN$}{note}");
            if self.replace(key, &value, held.as_bytes(), self.ttl).await? {
                return Ok((Found::Unsure(note), held));
            }
        }
        Err("the key changed hands three times in a row".into())
    }

    /// Replaces the value `held` of `key` with `next`, kept for `ttl`; `false` when the
    /// value was no longer `held` (a claim that expired, so another request may hold it).
    pub async fn replace(
        &self,
        key: &str,
        held: &[u8],
        next: &[u8],
        ttl: Duration,
    ) -> Result<bool, String> {
        let mut invocation = self.replace.key(format!("{KEY_PREFIX}{key}"));
        invocation.arg(held).arg(next).arg(millis(ttl));
        Ok(self.invoke(invocation).await? == 1)
    }

    /// Holds a key held as `held` with the `note` of the attempt about to be made: the
    /// value a retry of an unsure key holds, leased for IDEMPOTENCY_CLAIM_TTL and kept
    /// for IDEMPOTENCY_TTL, so that if this process dies before the answer is stored,
    /// the retry that takes the key over looks for the batch first. The value now held,
    /// or `None` when the claim was lost.
    pub async fn attempt(
        &self,
        key: &str,
        digest: &str,
        held: &str,
        note: &str,
    ) -> Result<Option<String>, String> {
        let start = 1 + digest.len();
        let token = held
            .get(start..start + TOKEN_LEN)
            .ok_or("the held value has no token")?;
        let lease = now_ms().saturating_add(millis(self.claim_ttl));
        let next = format!("Q{digest}{token}{lease:0LEASE_LEN$}{note}");
        let replaced = self
            .replace(key, held.as_bytes(), next.as_bytes(), self.ttl)
            .await?;
        Ok(replaced.then_some(next))
    }

    /// Stores `answer` for a key held as `held`; `false` when the claim was lost.
    pub async fn finish(
        &self,
        key: &str,
        digest: &str,
        held: &str,
        answer: &[u8],
    ) -> Result<bool, String> {
        let mut done = Vec::with_capacity(1 + digest.len() + answer.len());
        done.push(b'D');
        done.extend_from_slice(digest.as_bytes());
        done.extend_from_slice(answer);
        self.replace(key, held.as_bytes(), &done, self.ttl).await
    }

    /// Records that the batch of a key held as `held` was not acknowledged, with the
    /// `note` saying where it may be; `false` when the claim was lost.
    pub async fn unsure(
        &self,
        key: &str,
        digest: &str,
        held: &str,
        note: &str,
    ) -> Result<bool, String> {
        let unsure = format!("U{digest}{note}");
        self.replace(key, held.as_bytes(), unsure.as_bytes(), self.ttl)
            .await
    }

    /// Whether Redis answers a `PING` within IDEMPOTENCY_REDIS_TIMEOUT.
    pub async fn ping(&self) -> Result<(), String> {
        self.run::<String>(redis::cmd("PING")).await.map(drop)
    }

    /// Gives up a key held as `held` (`taken` before an attempt was noted in it: that
    /// attempt sent nothing), so the batch can be sent again at once: deleted, or, when
    /// the holder took it over from an unsure value, unsure again.
    pub async fn release(
        &self,
        key: &str,
        digest: &str,
        held: &str,
        taken: &str,
    ) -> Result<(), String> {
        if let Some(note) = held_note(taken.as_bytes(), digest) {
            let unsure = format!("U{digest}{note}");
            return self
                .replace(key, held.as_bytes(), unsure.as_bytes(), self.ttl)
                .await
                .map(drop);
        }
        let mut invocation = self.release.key(format!("{KEY_PREFIX}{key}"));
        invocation.arg(held);
        self.invoke(invocation).await.map(drop)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The note of an unsure value for a body hashing to `digest` that a retry may take at
/// `now`: an unsure one, or one held by a retry whose lease has ended.
fn takeable(value: &[u8], digest: &str, now: u64) -> Option<String> {
    let rest = value.get(1..)?.strip_prefix(digest.as_bytes())?;
    let note = match value.first()? {
        b'U' => rest,
        b'Q' => {
            let lease = rest.get(TOKEN_LEN..TOKEN_LEN + LEASE_LEN)?;
            let lease: u64 = std::str::from_utf8(lease).ok()?.parse().ok()?;
            if lease > now {
                return None;
            }
            rest.get(TOKEN_LEN + LEASE_LEN..)?
        }
        _ => return None,
    };
    String::from_utf8(note.to_vec()).ok()
}

/// The note of a value held by a retry of an unsure key.
fn held_note(held: &[u8], digest: &str) -> Option<String> {
    takeable(held, digest, u64::MAX)
}

/// What a value held by someone else means for a body hashing to `digest`.
fn found(value: &[u8], digest: &str) -> Found {
    let same_body = value.get(1..1 + digest.len()) == Some(digest.as_bytes());
    match value.first() {
        _ if !same_body => Found::Mismatch,
        Some(b'D') => Found::Replay(Bytes::copy_from_slice(&value[1 + digest.len()..])),
        _ => Found::InProgress,
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_held_elsewhere_reads_as_replay_progress_or_mismatch() {
        let digest = "ab".repeat(32);
        let done = format!("D{digest}{{\"ok\":1}}");
        assert_eq!(
            found(done.as_bytes(), &digest),
            Found::Replay(Bytes::from_static(b"{\"ok\":1}"))
        );
        let held = format!("P{digest}token");
        assert_eq!(found(held.as_bytes(), &digest), Found::InProgress);
        let other = "cd".repeat(32);
        assert_eq!(found(done.as_bytes(), &other), Found::Mismatch);
        assert_eq!(found(held.as_bytes(), &other), Found::Mismatch);
    }

    #[test]
    fn an_unsure_value_is_taken_by_a_retry_until_its_lease_holds_it() {
        let digest = "ab".repeat(32);
        let unsure = format!("U{digest}0 12 3 1700 p#1");
        assert_eq!(
            takeable(unsure.as_bytes(), &digest, 5).as_deref(),
            Some("0 12 3 1700 p#1")
        );
        assert_eq!(takeable(unsure.as_bytes(), &"cd".repeat(32), 5), None);
        assert_eq!(found(unsure.as_bytes(), &"cd".repeat(32)), Found::Mismatch);
        let token = "t".repeat(TOKEN_LEN);
        let held = format!("Q{digest}{token}{:020}0 12 3 1700 p#1", 1_000);
        assert_eq!(takeable(held.as_bytes(), &digest, 999), None, "leased");
        assert_eq!(found(held.as_bytes(), &digest), Found::InProgress);
        assert_eq!(
            takeable(held.as_bytes(), &digest, 1_000).as_deref(),
            Some("0 12 3 1700 p#1"),
            "the lease ended"
        );
        assert_eq!(
            held_note(held.as_bytes(), &digest).as_deref(),
            Some("0 12 3 1700 p#1")
        );
        assert_eq!(
            held_note(format!("P{digest}{token}").as_bytes(), &digest),
            None
        );
    }
}
