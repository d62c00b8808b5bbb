//! The Redis backend: a plan's increments as one pipeline per Redis (`INCRBY` and
//! `EXPIRE` for every counter), with per-second limits on their own Redis when
//! `REDIS_PERSECOND` is on. Connections are multiplexed: concurrent requests share them
//! and their commands are pipelined together.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ratelimit_core::Plan;
use ratelimit_core::stats::Counter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, ConnectionAddr, ConnectionInfo,
    IntoConnectionInfo, Pipeline, RedisConnectionInfo, TlsCertificates,
};

use crate::settings::{RedisSettings, RedisType};

/// Why Redis gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// A setting does not describe a usable Redis.
    #[error("{0}")]
    Settings(String),
    /// Redis failed or did not answer in time.
    #[error("redis error: {0}")]
    Redis(String),
}

/// One Redis deployment.
#[derive(Clone)]
enum Store {
    /// One server, through a few multiplexed connections used in turn.
    Single(Arc<Vec<ConnectionManager>>, Arc<AtomicUsize>),
    /// A cluster; the client routes each key to its slot's node.
    Cluster(ClusterConnection),
    /// The master a set of sentinels names, found again after a failure.
    Sentinel(Arc<SentinelStore>),
}

/// A connection to the current master of a sentinel-monitored Redis.
struct SentinelStore {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: std::sync::Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
}

impl SentinelStore {
    /// The connection to the master, asking the sentinels when there is none.
    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(connection) = self.lock().clone() {
            return Ok(connection);
        }
        let mut sentinels = self.sentinels.lock().await;
        if let Some(connection) = self.lock().clone() {
            return Ok(connection);
        }
        let master = sentinels.async_get_client().await?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let connection = master
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        *self.lock() = Some(connection.clone());
        Ok(connection)
    }

    /// Forgets the connection after a failure: the master may have changed.
    fn reset(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The main Redis, and the per-second one when configured.
#[derive(Clone)]
pub struct RedisBackend {
    main: Store,
    per_second: Option<Store>,
    jitter_max: u64,
    timeout: Duration,
    errors: Arc<Counter>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("per_second", &self.per_second.is_some())
            .finish()
    }
}

/// What describes one Redis deployment (the main one or the per-second one).
struct Target<'a> {
    socket_type: &'a str,
    kind: RedisType,
    url: &'a str,
    pool_size: usize,
    auth: &'a str,
    sentinel_auth: &'a str,
    timeout: Duration,
    tls: Option<&'a TlsFiles>,
}

/// Certificates for Redis over TLS (`REDIS_TLS_*`).
struct TlsFiles {
    client_cert: String,
    client_key: String,
    ca_cert: String,
    skip_hostname_verification: bool,
}

impl RedisBackend {
    /// Connects to the Redis deployments the settings describe, retrying with back-off
    /// per `REDIS_STARTUP_*` while none answers.
    pub async fn connect(
        settings: &RedisSettings,
        jitter_max: u64,
        errors: Arc<Counter>,
    ) -> Result<RedisBackend, RedisError> {
        let url = settings
            .redis_url
            .as_deref()
            .unwrap_or("/var/run/nutcracker/ratelimit.sock");
        // rustls needs one process-wide crypto provider; a second install is a no-op error.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = TlsFiles {
            client_cert: settings.redis_tls_client_cert.clone(),
            client_key: settings.redis_tls_client_key.clone(),
            ca_cert: settings.redis_tls_cacert.clone(),
            skip_hostname_verification: settings.redis_tls_skip_hostname_verification,
        };
        let main = Target {
            socket_type: &settings.redis_socket_type,
            kind: settings.redis_type,
            url,
            pool_size: settings.redis_pool_size,
            auth: &settings.redis_auth,
            sentinel_auth: &settings.redis_sentinel_auth,
            timeout: settings.redis_timeout,
            tls: settings.redis_tls.then_some(&tls),
        };
        let main = with_startup_backoff(settings, || open(&main)).await?;
        let per_second = if settings.redis_persecond {
            let target = Target {
                socket_type: &settings.redis_persecond_socket_type,
                kind: settings.redis_persecond_type,
                url: &settings.redis_persecond_url,
                pool_size: settings.redis_persecond_pool_size,
                auth: &settings.redis_persecond_auth,
                sentinel_auth: &settings.redis_persecond_sentinel_auth,
                timeout: settings.redis_persecond_timeout,
                tls: settings.redis_persecond_tls.then_some(&tls),
            };
            Some(with_startup_backoff(settings, || open(&target)).await?)
        } else {
            None
        };
        Ok(RedisBackend {
            main,
            per_second,
            jitter_max,
            timeout: settings.redis_timeout,
            errors,
        })
    }

    /// Runs the plan's counters and returns their totals, in plan order.
    pub async fn run(&self, plan: &mut Plan) -> Result<Vec<u64>, RedisError> {
        let result = tokio::time::timeout(self.timeout, self.run_unbounded(plan))
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::Redis(format!(
                    "no answer within REDIS_TIMEOUT ({:?})",
                    self.timeout
                )))
            });
        if result.is_err() {
            self.errors.add(1);
        }
        result
    }

    async fn run_unbounded(&self, plan: &mut Plan) -> Result<Vec<u64>, RedisError> {
        if self.per_second.is_none() {
            let all: Vec<usize> = (0..plan.increments().len()).collect();
            if plan.needs_current_counts() {
                let current = self.get(&self.main, plan, &all).await?;
                plan.apply_current(&current);
            }
            return self.incr(&self.main, plan, &all).await;
        }
        let (main, per_second) = self.split(plan);
        if plan.needs_current_counts() {
            let mut current = vec![0u64; plan.increments().len()];
            let (a, b) = tokio::join!(
                self.get(&self.main, plan, &main),
                self.get_per_second(plan, &per_second)
            );
            for (i, v) in main.iter().zip(a?).chain(per_second.iter().zip(b?)) {
                current[*i] = v;
            }
            plan.apply_current(&current);
        }
        let mut counts = vec![0u64; plan.increments().len()];
        let (a, b) = tokio::join!(
            self.incr(&self.main, plan, &main),
            self.incr_per_second(plan, &per_second)
        );
        for (i, v) in main.iter().zip(a?).chain(per_second.iter().zip(b?)) {
            counts[*i] = v;
        }
        Ok(counts)
    }

    /// Indexes of the plan's counters for the main and the per-second Redis.
    fn split(&self, plan: &Plan) -> (Vec<usize>, Vec<usize>) {
        (0..plan.increments().len())
            .partition(|&i| self.per_second.is_none() || !plan.increments()[i].per_second())
    }

    async fn incr_per_second(
        &self,
        plan: &Plan,
        indexes: &[usize],
    ) -> Result<Vec<u64>, RedisError> {
        match &self.per_second {
            Some(store) => self.incr(store, plan, indexes).await,
            None => Ok(Vec::new()),
        }
    }

    async fn get_per_second(&self, plan: &Plan, indexes: &[usize]) -> Result<Vec<u64>, RedisError> {
        match &self.per_second {
            Some(store) => self.get(store, plan, indexes).await,
            None => Ok(Vec::new()),
        }
    }

    async fn incr(
        &self,
        store: &Store,
        plan: &Plan,
        indexes: &[usize],
    ) -> Result<Vec<u64>, RedisError> {
        let totals: Vec<redis::RedisResult<i64>> = run_batched(store, indexes, |pipe, i| {
            let increment = &plan.increments()[i];
            let jitter = if self.jitter_max > 0 {
                fastrand::u64(0..self.jitter_max)
            } else {
                0
            };
            pipe.cmd("INCRBY").arg(&increment.key).arg(increment.hits);
            pipe.cmd("EXPIRE")
                .arg(&increment.key)
                .arg(increment.expiry_seconds(jitter))
                .ignore();
        })
        .await?;
        totals.into_iter().map(saturated_total).collect()
    }

    async fn get(
        &self,
        store: &Store,
        plan: &Plan,
        indexes: &[usize],
    ) -> Result<Vec<u64>, RedisError> {
        let values: Vec<redis::RedisResult<Option<u64>>> =
            run_batched(store, indexes, |pipe, i| {
                pipe.cmd("GET").arg(&plan.increments()[i].key);
            })
            .await?;
        values
            .into_iter()
            .map(|value| value.map(Option::unwrap_or_default).map_err(redis_error))
            .collect()
    }

    /// Whether the main Redis answers a PING.
    pub async fn ping(&self) -> bool {
        let mut pipe = redis::pipe();
        pipe.cmd("PING");
        let answer = tokio::time::timeout(self.timeout, query::<Vec<String>>(&self.main, &pipe));
        matches!(answer.await, Ok(Ok(_)))
    }
}

/// A counter's total after `INCRBY`. Redis refuses to go past `i64::MAX`; a counter
/// that far over any limit is decided as saturated, never as a backend failure (which
/// Envoy's default `failure_mode_deny: false` would let through).
fn saturated_total(total: redis::RedisResult<i64>) -> Result<u64, RedisError> {
    match total {
        Ok(total) => Ok(u64::try_from(total).unwrap_or(0)),
        Err(error) if error.to_string().contains("would overflow") => Ok(u64::MAX),
        Err(error) => Err(redis_error(error)),
    }
}

/// Runs the commands `add` writes for each counter: in one pipeline on a single Redis; in
/// one pipeline per counter, all at once, on a cluster, where a pipeline must stay within
/// one hash slot. Results come back in `indexes` order.
async fn run_batched<T: redis::FromRedisValue>(
    store: &Store,
    indexes: &[usize],
    mut add: impl FnMut(&mut Pipeline, usize),
) -> Result<Vec<T>, RedisError> {
    if indexes.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipes: Vec<Pipeline> = match store {
        Store::Single(..) | Store::Sentinel(_) => {
            let mut pipe = redis::pipe();
            indexes.iter().for_each(|&i| add(&mut pipe, i));
            vec![pipe]
        }
        Store::Cluster(_) => indexes
            .iter()
            .map(|&i| {
                let mut pipe = redis::pipe();
                add(&mut pipe, i);
                pipe
            })
            .collect(),
    };
    // Each command's error comes back in its place, so that one counter's error is told
    // apart from a failed round trip.
    pipes.iter_mut().for_each(|pipe| {
        pipe.ignore_errors();
    });
    if let [pipe] = pipes.as_slice() {
        return query::<Vec<T>>(store, pipe).await;
    }
    let results =
        futures_util::future::join_all(pipes.iter().map(|pipe| query::<Vec<T>>(store, pipe))).await;
    let mut out = Vec::with_capacity(indexes.len());
    for result in results {
        out.extend(result?);
    }
    Ok(out)
}

async fn query<T: redis::FromRedisValue>(store: &Store, pipe: &Pipeline) -> Result<T, RedisError> {
    let result = match store {
        Store::Single(connections, next) => {
            let i = next.fetch_add(1, Ordering::Relaxed) % connections.len();
            let mut connection = connections[i].clone();
            pipe.query_async(&mut connection).await
        }
        Store::Cluster(connection) => pipe.query_async(&mut connection.clone()).await,
        Store::Sentinel(sentinel) => {
            let result = match sentinel.connection().await {
                Ok(mut connection) => pipe.query_async(&mut connection).await,
                Err(error) => Err(error),
            };
            if result.is_err() {
                sentinel.reset();
            }
            result
        }
    };
    result.map_err(redis_error)
}

fn redis_error(error: redis::RedisError) -> RedisError {
    RedisError::Redis(error.to_string())
}

async fn with_startup_backoff<F, Fut>(
    settings: &RedisSettings,
    mut connect: F,
) -> Result<Store, RedisError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Store, RedisError>>,
{
    let started = std::time::Instant::now();
    let mut wait = settings.redis_startup_initial_interval;
    loop {
        match connect().await {
            Ok(store) => return Ok(store),
            Err(RedisError::Settings(message)) => return Err(RedisError::Settings(message)),
            Err(error) => {
                let limit = settings.redis_startup_max_elapsed_time;
                if !limit.is_zero() && started.elapsed() + wait > limit {
                    return Err(error);
                }
                tracing::warn!(%error, retry_in = ?wait, "cannot reach Redis yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(settings.redis_startup_max_interval);
            }
        }
    }
}

async fn open(target: &Target<'_>) -> Result<Store, RedisError> {
    let credentials = credentials(target.auth);
    // A client that cannot even be built is a settings problem: retrying will not help.
    let redis_error = |e: redis::RedisError| match e.kind() {
        redis::ErrorKind::InvalidClientConfig => RedisError::Settings(e.to_string()),
        _ => RedisError::Redis(e.to_string()),
    };
    let mut info = RedisConnectionInfo::default();
    if let Some(user) = &credentials.0 {
        info = info.set_username(user);
    }
    if let Some(password) = &credentials.1 {
        info = info.set_password(password);
    }
    if target.tls.is_some() && target.kind != RedisType::Single {
        return Err(RedisError::Settings(format!(
            "REDIS_TLS with REDIS_TYPE={}: TLS is only available with REDIS_TYPE=single in this version",
            target.kind
        )));
    }
    match target.kind {
        RedisType::Cluster => {
            let nodes = target
                .url
                .split(',')
                .map(|node| address(target.socket_type, node))
                .collect::<Result<Vec<_>, _>>()?;
            let mut builder = ClusterClientBuilder::new(nodes)
                .connection_timeout(target.timeout)
                .response_timeout(target.timeout);
            if let Some(user) = &credentials.0 {
                builder = builder.username(user);
            }
            if let Some(password) = &credentials.1 {
                builder = builder.password(password);
            }
            let client = builder.build().map_err(redis_error)?;
            Ok(Store::Cluster(
                client.get_async_connection().await.map_err(redis_error)?,
            ))
        }
        RedisType::Single => {
            let client = match target.tls {
                None => {
                    Client::open(address(target.socket_type, target.url)?.set_redis_settings(info))
                }
                Some(files) => tls_client(target.url, info, files)?,
            }
            .map_err(redis_error)?;
            // Answers are awaited within REDIS_TIMEOUT by the caller: one timer per
            // request, not two.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(target.timeout))
                .set_response_timeout(None)
                .set_number_of_retries(1);
            let mut connections = Vec::with_capacity(target.pool_size.max(1));
            for _ in 0..target.pool_size.max(1) {
                let connection = ConnectionManager::new_with_config(client.clone(), config.clone())
                    .await
                    .map_err(redis_error)?;
                connections.push(connection);
            }
            Ok(Store::Single(
                Arc::new(connections),
                Arc::new(AtomicUsize::new(0)),
            ))
        }
        RedisType::Sentinel => {
            let mut items = target.url.split(',');
            let master = items.next().unwrap_or_default().to_owned();
            let sentinels = items
                .map(|node| sentinel_address(target.socket_type, node, target.sentinel_auth))
                .collect::<Result<Vec<_>, _>>()?;
            if master.is_empty() || sentinels.is_empty() {
                return Err(RedisError::Settings(format!(
                    "REDIS_URL '{}': a sentinel URL is the master name then at least one host:port",
                    target.url
                )));
            }
            let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
            let client =
                SentinelClient::build(sentinels, master, Some(node), SentinelServerType::Master)
                    .map_err(redis_error)?;
            let store = SentinelStore {
                sentinels: tokio::sync::Mutex::new(client),
                current: std::sync::Mutex::new(None),
                timeout: target.timeout,
            };
            store.connection().await.map_err(redis_error)?;
            Ok(Store::Sentinel(Arc::new(store)))
        }
    }
}

/// `password` or `user:password`.
fn credentials(auth: &str) -> (Option<String>, Option<String>) {
    match auth.split_once(':') {
        _ if auth.is_empty() => (None, None),
        Some((user, password)) => (Some(user.to_owned()), Some(password.to_owned())),
        None => (None, Some(auth.to_owned())),
    }
}

/// A client for `rediss://host:port` with the configured CA and client certificate.
fn tls_client(
    url: &str,
    info: RedisConnectionInfo,
    files: &TlsFiles,
) -> Result<redis::RedisResult<Client>, RedisError> {
    let read = |what: &str, path: &str| {
        std::fs::read(path).map_err(|e| RedisError::Settings(format!("{what} {path}: {e}")))
    };
    let client_tls = match (files.client_cert.is_empty(), files.client_key.is_empty()) {
        (true, true) => None,
        (false, false) => Some(ClientTlsConfig {
            client_cert: read("REDIS_TLS_CLIENT_CERT", &files.client_cert)?,
            client_key: read("REDIS_TLS_CLIENT_KEY", &files.client_key)?,
        }),
        _ => {
            return Err(RedisError::Settings(
                "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together".into(),
            ));
        }
    };
    let root_cert = (!files.ca_cert.is_empty())
        .then(|| read("REDIS_TLS_CACERT", &files.ca_cert))
        .transpose()?;
    let info = format!("rediss://{url}")
        .into_connection_info()
        .map_err(|e| RedisError::Settings(format!("REDIS_URL '{url}': {e}")))?
        .set_redis_settings(info);
    let client = match Client::build_with_tls(
        info,
        TlsCertificates {
            client_tls,
            root_cert,
        },
    ) {
        Ok(client) => client,
        Err(error) => return Ok(Err(error)),
    };
    if !files.skip_hostname_verification {
        return Ok(Ok(client));
    }
    // The chain is still verified against the CA; only the name check is dropped.
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    addr.set_danger_accept_invalid_hostnames(true);
    Ok(Client::open(info.set_addr(addr)))
}

/// A sentinel's address, with `REDIS_SENTINEL_AUTH` credentials when given.
fn sentinel_address(
    socket_type: &str,
    url: &str,
    auth: &str,
) -> Result<ConnectionInfo, RedisError> {
    let (user, password) = credentials(auth);
    let mut info = RedisConnectionInfo::default();
    if let Some(user) = user {
        info = info.set_username(user);
    }
    if let Some(password) = password {
        info = info.set_password(password);
    }
    Ok(address(socket_type, url)?.set_redis_settings(info))
}

fn address(socket_type: &str, url: &str) -> Result<ConnectionInfo, RedisError> {
    let addr = match socket_type {
        "unix" => ConnectionAddr::Unix(url.into()),
        "tcp" => {
            let (host, port) = url
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                .ok_or_else(|| {
                    RedisError::Settings(format!("REDIS_URL '{url}' is not host:port"))
                })?;
            ConnectionAddr::Tcp(host, port)
        }
        other => {
            return Err(RedisError::Settings(format!(
                "REDIS_SOCKET_TYPE={other}: expected tcp or unix"
            )));
        }
    };
    addr.into_connection_info()
        .map_err(|e| RedisError::Settings(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_password_or_user_and_password() {
        assert_eq!(credentials(""), (None, None));
        assert_eq!(credentials("secret"), (None, Some("secret".into())));
        assert_eq!(
            credentials("alice:s:3"),
            (Some("alice".into()), Some("s:3".into()))
        );
    }

    #[test]
    fn addresses_by_socket_type() {
        assert!(
            matches!(address("tcp", "127.0.0.1:6379").unwrap().addr(), ConnectionAddr::Tcp(h, 6379) if h == "127.0.0.1")
        );
        assert!(matches!(
            address("unix", "/tmp/r.sock").unwrap().addr(),
            ConnectionAddr::Unix(_)
        ));
        assert!(address("tcp", "nohost").is_err());
        assert!(address("udp", "x:1").is_err());
    }
}
