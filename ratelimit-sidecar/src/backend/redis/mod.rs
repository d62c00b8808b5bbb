//! The Redis backend: a request's counters as one pipeline (`INCRBY` and `EXPIRE` for
//! every counter, or `GET` for their current totals). Connections are multiplexed:
//! concurrent requests share them and their commands are pipelined together. A single
//! Redis over TCP or a unix socket is spoken to by this module's own connection
//! ([`pipelined`]); TLS, clusters and sentinels through the `redis` crate.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisConnectionInfo, Value};

mod connection_info;
mod counters;
mod nodes;
mod pipelined;
mod resp;

use connection_info::{address, credentials, sentinel_address, tls_client};
pub use counters::RedisCounters;
use nodes::{Nodes, SlotOwners};
use pipelined::Pipelined;
use resp::{Arg, Replies, Reply};

use super::breaker::Breakers;
use super::{BackendError, PerWorkerStore, RemoteStore};
use crate::runtime::{PerWorker, Pool};
use crate::settings::{RedisSettings, RedisType, Settings};

/// How many requests may wait on one of a single Redis's connections before the next
/// connection of the pool takes new ones.
const SPILL_AT: usize = 256;

/// One Redis deployment.
#[derive(Clone)]
enum Store {
    /// One server, through pipelined connections: the first with room takes each
    /// request, the rest take turns with the overflow.
    Single(Arc<Vec<Pipelined>>, Arc<AtomicUsize>),
    /// One server over TLS, through a few multiplexed connections used in turn.
    SingleTls(Arc<Vec<ConnectionManager>>, Arc<AtomicUsize>),
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

/// One set of connections per worker of `pool` (the main Redis, and the per-second one
/// when configured), each opened on its worker's runtime so that its replies wake no
/// other thread. Worker 0's connects first, retrying per `REDIS_STARTUP_*`; the others
/// follow once Redis answers.
pub async fn per_worker(
    pool: &Pool,
    settings: &Settings,
    breakers: &Arc<Breakers>,
) -> Result<(PerWorkerStore, Option<PerWorkerStore>), BackendError> {
    let jitter = settings.limiter.expiration_jitter_max_seconds;
    let first = RedisCounters::connect(&settings.redis, jitter, breakers).await?;
    let mut inputs = vec![None; pool.workers()];
    inputs[0] = Some(first);
    let redis = Arc::new(settings.redis.clone());
    let breakers = Arc::clone(breakers);
    let connected = pool
        .on_each(inputs, move |ready| {
            let redis = Arc::clone(&redis);
            let breakers = Arc::clone(&breakers);
            async move {
                match ready {
                    Some(counters) => Ok(counters),
                    None => RedisCounters::connect(&redis, jitter, &breakers).await,
                }
            }
        })
        .await;
    let mut main = Vec::with_capacity(connected.len());
    let mut per_second = Vec::new();
    for counters in connected {
        let (worker_main, worker_per_second) = counters?;
        main.push(RemoteStore::Redis(worker_main));
        per_second.extend(worker_per_second.map(RemoteStore::Redis));
    }
    let per_second = (!per_second.is_empty()).then(|| PerWorker::new(per_second));
    Ok((PerWorker::new(main), per_second))
}

impl RedisCounters {
    /// Connects to the Redis deployments the settings describe (the main one, and the
    /// per-second one with `REDIS_PERSECOND`), retrying with back-off per
    /// `REDIS_STARTUP_*` while none answers. Counters expire a random
    /// `0..jitter_max` seconds after their window. Each node is called through its
    /// breaker in `breakers`.
    pub async fn connect(
        settings: &RedisSettings,
        jitter_max: u64,
        breakers: &Arc<Breakers>,
    ) -> Result<(RedisCounters, Option<RedisCounters>), BackendError> {
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
        let main = counters(&main, settings, jitter_max, breakers).await?;
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
            Some(counters(&target, settings, jitter_max, breakers).await?)
        } else {
            None
        };
        Ok((main, per_second))
    }
}

/// The counters of `target`, once it answers, with the breakers of its nodes.
async fn counters(
    target: &Target<'_>,
    settings: &RedisSettings,
    jitter_max: u64,
    breakers: &Arc<Breakers>,
) -> Result<RedisCounters, BackendError> {
    let store = with_startup_backoff(settings, || open(target)).await?;
    let nodes = match &store {
        Store::Cluster(connection) => Nodes::Cluster(
            SlotOwners::watch(connection.clone(), target.url, Arc::clone(breakers)).await,
        ),
        Store::Single(..) | Store::SingleTls(..) | Store::Sentinel(_) => {
            Nodes::One(breakers.node(target.url))
        }
    };
    Ok(RedisCounters {
        store,
        nodes,
        jitter_max,
    })
}

/// Runs the commands `write` produces (each through the function it is given) as one
/// pipeline; one reply per command, in order, errors in their place; or
/// [`BackendError::Late`] once `deadline` passes.
async fn query(
    store: &Store,
    deadline: Option<Instant>,
    write: impl FnOnce(&mut dyn FnMut(&[Arg<'_>])),
) -> Result<Replies, BackendError> {
    if let Store::Single(connections, next) = store {
        // The first connection with room: concurrent requests share its writes, and the
        // others take the overflow.
        let connection = connections
            .iter()
            .find(|connection| connection.waiting() < SPILL_AT)
            .unwrap_or_else(|| {
                &connections[next.fetch_add(1, Ordering::Relaxed) % connections.len()]
            });
        return connection
            .query(deadline, write)
            .await
            .map_err(BackendError::from);
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let cluster = matches!(store, Store::Cluster(_));
    write(&mut |args| {
        if cluster {
            // While the key's slot migrates, the source answers `ASK` and the client sends
            // the pipeline again to the target, after one `ASKING`, which admits only the
            // next command: a second one (a counter's `EXPIRE`) would be sent back with
            // `MOVED` and the whole pipeline, its `INCRBY` too, sent round again. Each
            // command asks for itself (a node that imports nothing ignores `ASKING`), in
            // the pipeline, where no other request's command can come between.
            pipe.add_command(redis::cmd("ASKING")).ignore();
        }
        let mut command = redis::Cmd::new();
        for arg in args {
            match arg {
                Arg::Verb(verb) => command.arg(verb.name()),
                Arg::Text(text) => command.arg(*text),
                Arg::Int(number) => command.arg(*number),
            };
        }
        pipe.add_command(command);
    });
    // The redis crate's futures are large and deep: boxed as a trait object with the
    // pipeline and the deadline's timer, they weigh neither on every request's future
    // (a single server's too) nor on the compiler's proof that it is `Send`.
    let call: BoxFuture<'_, _> = Box::pin(async move {
        let call = query_crate(store, pipe);
        match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), call)
                .await
                .unwrap_or(Err(BackendError::Late)),
            None => call.await,
        }
    });
    call.await
}

/// Runs `pipe` on a store the `redis` crate connects to.
async fn query_crate(store: &Store, pipe: redis::Pipeline) -> Result<Replies, BackendError> {
    let in_turn = |next: &AtomicUsize, count: usize| next.fetch_add(1, Ordering::Relaxed) % count;
    let result: redis::RedisResult<Vec<Value>> = match store {
        Store::Single(..) => unreachable!("the pipelined connection answers a single Redis"),
        Store::SingleTls(connections, next) => {
            let mut connection = connections[in_turn(next, connections.len())].clone();
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
    result
        .map(|values| values.into_iter().map(Reply::from_value).collect())
        .map_err(redis_error)
}

fn redis_error(error: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable(format!("redis error: {error}"))
}

async fn with_startup_backoff<F, Fut>(
    settings: &RedisSettings,
    mut connect: F,
) -> Result<Store, BackendError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Store, BackendError>>,
{
    let started = std::time::Instant::now();
    let mut wait = settings.redis_startup_initial_interval;
    loop {
        match connect().await {
            Ok(store) => return Ok(store),
            Err(BackendError::Settings(message)) => return Err(BackendError::Settings(message)),
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

async fn open(target: &Target<'_>) -> Result<Store, BackendError> {
    let credentials = credentials(target.auth);
    // A client that cannot even be built is a settings problem: retrying will not help.
    let redis_error = |e: redis::RedisError| match e.kind() {
        redis::ErrorKind::InvalidClientConfig => BackendError::Settings(e.to_string()),
        _ => BackendError::Unavailable(format!("redis error: {e}")),
    };
    let mut info = RedisConnectionInfo::default();
    if let Some(user) = &credentials.0 {
        info = info.set_username(user);
    }
    if let Some(password) = &credentials.1 {
        info = info.set_password(password);
    }
    if target.tls.is_some() && target.kind != RedisType::Single {
        return Err(BackendError::Settings(format!(
            "REDIS_TLS with REDIS_TYPE={}: TLS is only available with REDIS_TYPE=single in this version",
            target.kind
        )));
    }
    let pool_size = target.pool_size.max(1);
    match (target.kind, target.tls) {
        (RedisType::Cluster, _) => {
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
        (RedisType::Single, None) => {
            let address = match address(target.socket_type, target.url)?.addr() {
                ConnectionAddr::Unix(path) => pipelined::Address::Unix(path.clone()),
                ConnectionAddr::Tcp(host, port) => pipelined::Address::Tcp(host.clone(), *port),
                other => unreachable!("address() gives tcp or unix, not {other:?}"),
            };
            let target = pipelined::Target {
                address,
                user: credentials.0,
                password: credentials.1,
                connect_timeout: target.timeout,
            };
            let mut connections = Vec::with_capacity(pool_size);
            for _ in 0..pool_size {
                let connection = Pipelined::connect(target.clone())
                    .await
                    .map_err(BackendError::Unavailable)?;
                connections.push(connection);
            }
            Ok(Store::Single(
                Arc::new(connections),
                Arc::new(AtomicUsize::new(0)),
            ))
        }
        (RedisType::Single, Some(files)) => {
            let client = tls_client(target.url, info, files)?.map_err(redis_error)?;
            // Answers are awaited within REDIS_TIMEOUT by the caller: one timer per
            // request, not two.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(target.timeout))
                .set_response_timeout(None)
                .set_number_of_retries(1);
            let mut connections = Vec::with_capacity(pool_size);
            for _ in 0..pool_size {
                let connection = ConnectionManager::new_with_config(client.clone(), config.clone())
                    .await
                    .map_err(redis_error)?;
                connections.push(connection);
            }
            Ok(Store::SingleTls(
                Arc::new(connections),
                Arc::new(AtomicUsize::new(0)),
            ))
        }
        (RedisType::Sentinel, _) => {
            let mut items = target.url.split(',');
            let master = items.next().unwrap_or_default().to_owned();
            let sentinels = items
                .map(|node| sentinel_address(target.socket_type, node, target.sentinel_auth))
                .collect::<Result<Vec<_>, _>>()?;
            if master.is_empty() || sentinels.is_empty() {
                return Err(BackendError::Settings(format!(
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
