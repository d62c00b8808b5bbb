//! The shared store (`IDEMPOTENCY_STORE=redis`): every replica claims and answers keys in
//! one Redis, so a retry is recognised whichever replica it reaches, and after a restart.
//!
//! A key's value is `P<body sha256><token>` while a request holds it and
//! `D<body sha256><answer>` once answered. The claim is `SET NX PX IDEMPOTENCY_CLAIM_TTL`:
//! one request in the whole fleet wins it, and if its replica dies the claim expires. The
//! answer replaces the claim only while the claim is still the holder's (a script
//! compares), and is kept for `IDEMPOTENCY_TTL`.

use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};

use super::memory::Found;

/// Prefix of every key the intake writes.
pub const KEY_PREFIX: &str = "operations-intake:idempotency:";

/// Replaces the holder's claim with the answer: KEYS[1], ARGV = claim, answer, ttl ms.
const FINISH_LUA: &str = r"
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
    finish: Script,
    release: Script,
}

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
            finish: Script::new(FINISH_LUA),
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
    /// holding it with `token`.
    pub async fn claim(&self, key: &str, digest: &str, token: &str) -> Result<Found, String> {
        let redis_key = format!("{KEY_PREFIX}{key}");
        let claim = format!("P{digest}{token}");
        // A value that expires between the SET and the GET is claimed again.
        for _ in 0..3 {
            let mut set = redis::cmd("SET");
            set.arg(&redis_key)
                .arg(&claim)
                .arg("NX")
                .arg("PX")
                .arg(millis(self.claim_ttl));
            let won: Option<String> = self.run(set).await?;
            if won.is_some() {
                return Ok(Found::New);
            }
            let mut get = redis::cmd("GET");
            get.arg(&redis_key);
            let Some(value): Option<Vec<u8>> = self.run(get).await? else {
                continue;
            };
            return Ok(found(&value, digest));
        }
        Err("the key changed hands three times in a row".into())
    }

    /// Stores `answer` for a key this `token` holds; `false` when the claim was lost
    /// (it expired, so another request may hold the key now).
    pub async fn finish(
        &self,
        key: &str,
        digest: &str,
        token: &str,
        answer: &[u8],
    ) -> Result<bool, String> {
        let mut done = Vec::with_capacity(1 + digest.len() + answer.len());
        done.push(b'D');
        done.extend_from_slice(digest.as_bytes());
        done.extend_from_slice(answer);
        let mut invocation = self.finish.key(format!("{KEY_PREFIX}{key}"));
        invocation
            .arg(format!("P{digest}{token}"))
            .arg(done)
            .arg(millis(self.ttl));
        Ok(self.invoke(invocation).await? == 1)
    }

    /// Whether Redis answers a `PING` within IDEMPOTENCY_REDIS_TIMEOUT.
    pub async fn ping(&self) -> Result<(), String> {
        self.run::<String>(redis::cmd("PING")).await.map(drop)
    }

    /// Gives up a key this `token` holds, so the batch can be sent again at once.
    pub async fn release(&self, key: &str, digest: &str, token: &str) -> Result<(), String> {
        let mut invocation = self.release.key(format!("{KEY_PREFIX}{key}"));
        invocation.arg(format!("P{digest}{token}"));
        self.invoke(invocation).await.map(drop)
    }
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
}
