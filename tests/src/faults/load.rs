//! A bounded load of `ShouldRateLimit` calls on many keys, a few of them hot, each with a
//! deadline, and the history of every call: when it started and ended, its key and its
//! answer. The calls go to the sidecar's gRPC port (plaintext or TLS), or through a real
//! Envoy whose rate limit filter asks the sidecar ([`Target`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

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
    /// Through Envoy: an HTTP status other than 200 and 429 (0: no answer in time).
    Http(u16),
}

impl Answer {
    /// Neither admitted nor refused over the limit: the call failed.
    pub fn failed(self) -> bool {
        matches!(self, Answer::Error(_) | Answer::Http(_))
    }
}

/// Where the load's calls go.
#[derive(Clone, Debug)]
pub enum Target {
    /// The sidecar's plaintext gRPC port, on one connection per caller.
    Grpc(u16),
    /// The sidecar's gRPC port over TLS, trusting each of `trust` (PEM files), with a new
    /// connection (a new handshake) every `reconnect` calls.
    Tls {
        /// The port.
        port: u16,
        /// The CA certificates trusted.
        trust: Vec<std::path::PathBuf>,
        /// Calls per connection.
        reconnect: usize,
    },
    /// A real Envoy's listener, the key in the `x-user` header ([`envoy_rules`]).
    Envoy(u16),
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

/// The rules an Envoy on `envoy/sidecar.yaml` asks about: `domain: edge`, key `user` (the
/// `x-user` header), `limit` a second.
pub fn envoy_rules(limit: u32) -> String {
    rules(limit)
        .replace("domain: faults", "domain: edge")
        .replace("key: k\n", "key: user\n")
}

impl Load {
    /// Starts `profile.callers` callers on `target` (a sidecar on [`rules`], or an Envoy
    /// in front of one on [`envoy_rules`]).
    pub async fn start(target: Target, profile: Profile) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut callers = Vec::with_capacity(profile.callers);
        for seed in 0..profile.callers {
            let stop = Arc::clone(&stop);
            let mut caller = Caller::connect(&target, profile.deadline).await;
            callers.push(tokio::spawn(async move {
                let mut random = Random(0x9E37_79B9_7F4A_7C15 ^ (seed as u64 + 1));
                let mut history = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let key = random.key(&profile);
                    let start = now_us();
                    let answer = caller.call(key, history.len()).await;
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

/// One caller's connection.
enum Caller {
    Grpc(RateLimitServiceClient<Channel>, Duration),
    Tls {
        client: RateLimitServiceClient<Channel>,
        endpoint: Box<Endpoint>,
        reconnect: usize,
        deadline: Duration,
    },
    Envoy(reqwest::Client, u16),
}

impl Caller {
    async fn connect(target: &Target, deadline: Duration) -> Caller {
        match target {
            Target::Grpc(port) => Caller::Grpc(client_on(*port).await, deadline),
            Target::Tls {
                port,
                trust,
                reconnect,
            } => {
                let endpoint = tls_endpoint(*port, trust);
                let client = RateLimitServiceClient::new(endpoint.connect().await.unwrap());
                Caller::Tls {
                    client,
                    endpoint: Box::new(endpoint),
                    reconnect: *reconnect,
                    deadline,
                }
            }
            Target::Envoy(port) => {
                let client = reqwest::Client::builder()
                    .timeout(deadline)
                    .build()
                    .unwrap();
                Caller::Envoy(client, *port)
            }
        }
    }

    /// Asks for `key`; `made` calls were made before.
    async fn call(&mut self, key: u32, made: usize) -> Answer {
        match self {
            Caller::Grpc(client, deadline) => grpc_call(client, key, *deadline).await,
            Caller::Tls {
                client,
                endpoint,
                reconnect,
                deadline,
            } => {
                if made > 0 && made.is_multiple_of(*reconnect) {
                    match endpoint.connect().await {
                        Ok(channel) => *client = RateLimitServiceClient::new(channel),
                        Err(_) => return Answer::Error(tonic::Code::Unavailable),
                    }
                }
                grpc_call(client, key, *deadline).await
            }
            Caller::Envoy(client, port) => {
                let answer = client
                    .get(format!("http://127.0.0.1:{port}/"))
                    .header("x-user", key.to_string())
                    .send()
                    .await;
                match answer.map(|r| r.status().as_u16()) {
                    Ok(200) => Answer::Ok,
                    Ok(429) => Answer::Over,
                    Ok(status) => Answer::Http(status),
                    Err(_) => Answer::Http(0),
                }
            }
        }
    }
}

async fn grpc_call(
    client: &mut RateLimitServiceClient<Channel>,
    key: u32,
    deadline: Duration,
) -> Answer {
    let mut call = tonic::Request::new(request("faults", &[&[("k", &key.to_string())]]));
    call.set_timeout(deadline);
    match client.should_rate_limit(call).await {
        Ok(response) if response.get_ref().overall_code == 1 => Answer::Ok,
        Ok(_) => Answer::Over,
        Err(status) => Answer::Error(status.code()),
    }
}

/// A TLS endpoint on `port` for the name `localhost`, trusting each CA of `trust`.
pub fn tls_endpoint(port: u16, trust: &[std::path::PathBuf]) -> Endpoint {
    let cas = trust
        .iter()
        .map(|path| Certificate::from_pem(std::fs::read(path).unwrap()));
    let tls = ClientTlsConfig::new()
        .ca_certificates(cas)
        .domain_name("localhost");
    Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
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
