//! A bounded load of `ShouldRateLimit` calls on many keys, a few of them hot, each with a
//! deadline, and the history of every call: when it started and ended, its key and its
//! answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;

use crate::sidecar::{client_on, request};

/// The load's shape.
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    /// Callers, each on its own connection, each with one call at a time.
    pub callers: usize,
    /// Each caller's pause between calls.
    pub pause: Duration,
    /// Keys that get half of the calls (well over their limit).
    pub hot_keys: u32,
    /// Keys that share the other half (under their limit).
    pub cold_keys: u32,
    /// The `grpc-timeout` of every call.
    pub deadline: Duration,
}

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Admitted.
    Ok,
    /// Refused: over the limit.
    Over,
    /// A gRPC error (the failure mode `error`, a deadline, a refused connection).
    Error(tonic::Code),
}

/// One call. Times are microseconds since the Unix epoch, the clock the server's windows
/// are counted on.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// Sent.
    pub start: u64,
    /// Answered.
    pub end: u64,
    /// Which key: below `hot_keys` a hot one.
    pub key: u32,
    /// The answer.
    pub answer: Answer,
}

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_micros()).unwrap()
}

/// The running load; [`Load::stop`] ends it and returns the history.
pub struct Load {
    stop: Arc<AtomicBool>,
    callers: Vec<JoinHandle<Vec<Call>>>,
}

/// The rules the load is decided against: `domain: faults`, key `k`, `limit` a second.
pub fn rules(limit: u32) -> String {
    format!(
        "domain: faults\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {limit}}}\n"
    )
}

impl Load {
    /// Starts `profile.callers` callers on the gRPC port `port` (a sidecar on [`rules`]).
    pub async fn start(port: u16, profile: Profile) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut callers = Vec::with_capacity(profile.callers);
        for seed in 0..profile.callers {
            let stop = Arc::clone(&stop);
            let mut client = client_on(port).await;
            callers.push(tokio::spawn(async move {
                let mut random = Random(0x9E37_79B9_7F4A_7C15 ^ (seed as u64 + 1));
                let mut history = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let key = random.key(&profile);
                    let mut call =
                        tonic::Request::new(request("faults", &[&[("k", &key.to_string())]]));
                    call.set_timeout(profile.deadline);
                    let start = now_us();
                    let answer = match client.should_rate_limit(call).await {
                        Ok(response) if response.get_ref().overall_code == 1 => Answer::Ok,
                        Ok(_) => Answer::Over,
                        Err(status) => Answer::Error(status.code()),
                    };
                    let end = now_us();
                    history.push(Call {
                        start,
                        end,
                        key,
                        answer,
                    });
                    tokio::time::sleep(profile.pause).await;
                }
                history
            }));
        }
        Load { stop, callers }
    }

    /// Stops the callers; every call made, by start time.
    pub async fn stop(self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        let mut history = Vec::new();
        for caller in self.callers {
            history.extend(caller.await.expect("a caller ran to the end"));
        }
        history.sort_by_key(|call| call.start);
        history
    }
}

/// xorshift64: the keys' order, the same on every run.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Half the calls go to a hot key, half to a cold one.
    fn key(&mut self, profile: &Profile) -> u32 {
        let n = self.next();
        let hot = n & 1 == 0 || profile.cold_keys == 0;
        let pick = u32::try_from((n >> 1) % 1_000_000).unwrap();
        if hot {
            pick % profile.hot_keys.max(1)
        } else {
            profile.hot_keys + pick % profile.cold_keys
        }
    }
}
