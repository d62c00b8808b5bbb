//! Where counters live: this process's memory, or a remote store behind
//! [`RemoteCounters`] (Redis and memcached, one module each).
//!
//! Running a plan remotely is written once, in [`Remote::run`]: the deadline (which each
//! store keeps, without a timer per call on the pipelined connections), the error
//! statistic, the routing of per-second counters to their own store, and the
//! current-counts step of STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (whose rule the core
//! owns: [`Plan::needs_current_counts`] and [`Plan::apply_current`]).

pub mod breaker;
pub mod memcache;
pub mod redis;
mod send_buffer;
mod waiting;
pub mod write_behind;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, Either};
use ratelimit_core::stats::{Counter, StatsRegistry, names};
use ratelimit_core::{Increment, MemoryStore, MemoryUsage, Plan};
use smallvec::SmallVec;

use self::breaker::Breakers;
use self::write_behind::WriteBehind;
use crate::runtime::{PerWorker, Pool};
use crate::settings::{BackendType, Settings};

/// Why a store gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A setting does not describe a usable store: retrying will not help.
    #[error("{0}")]
    Settings(String),
    /// The store failed or did not answer in time.
    #[error("{0}")]
    Unavailable(String),
    /// The call's deadline passed first: [`Remote`] reports it as `Unavailable`, naming
    /// the deadline.
    #[error("no answer in time")]
    Late,
    /// A counter's key cannot be stored there (the request's fault).
    #[error("{0}")]
    Key(String),
    /// The caller's own deadline (its `grpc-timeout`, shorter than the store's) passed
    /// before the store answered: not the store's failure, so neither its error
    /// statistic nor its breaker counts it.
    #[error("no answer within the caller's grpc-timeout ({0:?})")]
    CallerDeadline(Duration),
}

/// A pipelined connection's failure: late, or the store unavailable.
impl From<waiting::Failure> for BackendError {
    fn from(failure: waiting::Failure) -> BackendError {
        match failure {
            waiting::Failure::Late => BackendError::Late,
            waiting::Failure::Failed(error) => BackendError::Unavailable(error),
        }
    }
}

/// A call's totals, in order: a request has a few counters, kept inline.
pub type Totals = SmallVec<[u64; 4]>;

/// What a call does with its counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Adds each increment's hits to its counter (creating it with the window's expiry)
    /// and returns the totals.
    Increment,
    /// Returns the counters' current totals (0 for a counter that does not exist).
    Current,
}

/// One call to a store: what to do with which counters, by when.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// The counters, in the order their totals come back.
    pub increments: &'a [&'a Increment],
    /// Whether they are added to or read.
    pub mode: Mode,
    /// When the call must have ended, and when a node that has not answered has failed.
    pub deadlines: Deadlines,
}

/// A call's two deadlines. The call stops waiting at `wait`: the store's own deadline
/// (REDIS_TIMEOUT, MEMCACHE_TIMEOUT), or the caller's `grpc-timeout` when that is
/// sooner. A node is judged only by the store's own, `judge`: a call that ends before it
/// (late for its caller, or dropped because its caller went away) says nothing about the
/// node, so that no caller can open a node's breaker by choosing a short deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// When the call stops waiting.
    pub wait: Instant,
    /// The store's own deadline, by which an unanswered call is the node's failure.
    pub judge: Instant,
}

impl Deadlines {
    /// One deadline for both: the store's own.
    pub fn store(at: Instant) -> Deadlines {
        Deadlines {
            wait: at,
            judge: at,
        }
    }
}

impl<'a> Batch<'a> {
    /// The same call on other counters.
    fn on(self, increments: &'a [&'a Increment]) -> Batch<'a> {
        Batch { increments, ..self }
    }
}

/// A store of counters in another process: each kind is one module behind this seam,
/// and [`RemoteStore`] names them.
pub trait RemoteCounters: Send + Sync + std::fmt::Debug {
    /// Runs the batch and returns its counters' totals, in order.
    fn call(&self, batch: Batch<'_>) -> impl Future<Output = Result<Totals, BackendError>> + Send;

    /// Whether the store answers.
    fn ping(&self) -> impl Future<Output = bool> + Send;
}

/// One of the remote stores, called without a boxed future.
#[derive(Debug)]
pub enum RemoteStore {
    /// Redis: a single server, a cluster or a sentinel-monitored master.
    Redis(redis::RedisCounters),
    /// memcached nodes.
    Memcache(memcache::MemcacheCounters),
}

impl RemoteStore {
    /// The store's call, as it is: not inside a future of its own, which would copy it in.
    /// memcached's is boxed: a call's rounds on several nodes make it the larger, and
    /// every layer of every request's future would be as large, Redis's too.
    fn call<'a>(
        &'a self,
        batch: Batch<'a>,
    ) -> impl Future<Output = Result<Totals, BackendError>> + Send + 'a {
        match self {
            RemoteStore::Redis(store) => Either::Left(store.call(batch)),
            RemoteStore::Memcache(store) => Either::Right(Box::pin(store.call(batch))),
        }
    }

    async fn ping(&self) -> bool {
        match self {
            RemoteStore::Redis(store) => store.ping().await,
            RemoteStore::Memcache(store) => store.ping().await,
        }
    }
}

/// One remote store per worker: each worker's connections wake only that worker.
pub type PerWorkerStore = PerWorker<RemoteStore>;

/// Opens the backend the settings choose, with one set of connections per worker of
/// `pool` for a remote store, written behind with `WRITE_BEHIND=true`.
pub async fn open(
    settings: &Settings,
    pool: &Pool,
    stats: &StatsRegistry,
) -> Result<Backend, BackendError> {
    let behind = &settings.write_behind;
    match open_store(settings, pool, stats).await? {
        Backend::Remote(remote) if behind.write_behind => {
            let interval = behind.write_behind_flush_interval;
            tracing::warn!(
                ?interval,
                "write-behind counters: decisions read local counts, sent to the store every interval; across replicas a key may admit more than its limit (docs/backends.md)"
            );
            let max_keys = behind.write_behind_max_keys;
            let behind = WriteBehind::new(remote, interval, max_keys, stats);
            Ok(Backend::WriteBehind(Arc::new(behind)))
        }
        backend => Ok(backend),
    }
}

/// The store the settings choose.
async fn open_store(
    settings: &Settings,
    pool: &Pool,
    stats: &StatsRegistry,
) -> Result<Backend, BackendError> {
    match settings.backend() {
        BackendType::Memory => {
            tracing::info!(
                max_counters = settings.limiter.memory_max_counters,
                max_bytes = settings.bounds.memory_max_bytes,
                "using the memory backend: counters are local to this process and not shared with other instances"
            );
            let store = Arc::new(
                MemoryStore::new(settings.limiter.memory_max_counters)
                    .with_max_bytes(settings.bounds.memory_max_bytes),
            );
            let level = |pick: fn(&MemoryUsage) -> u64| {
                let store = Arc::downgrade(&store);
                Arc::new(move || store.upgrade().map_or(0, |s| pick(&s.usage())))
            };
            stats.gauge(names::MEMORY_COUNTERS, level(|u| u.counters as u64));
            stats.gauge(names::MEMORY_BYTES, level(|u| u.bytes as u64));
            stats.gauge(names::MEMORY_EVICTIONS, level(|u| u.evictions));
            Ok(Backend::Memory(store))
        }
        BackendType::Redis => {
            let breakers = breakers("redis", settings, stats);
            let (main, per_second) = redis::per_worker(pool, settings, &breakers).await?;
            tracing::info!(redis_type = %settings.redis.redis_type, per_second = settings.redis.redis_persecond, "using the redis backend");
            Ok(Backend::Remote(Remote::new(
                "redis",
                main,
                per_second,
                (settings.redis.redis_timeout, "REDIS_TIMEOUT"),
                stats.counter(names::REDIS_ERROR),
                breakers,
            )))
        }
        BackendType::Memcache => {
            let jitter = settings.limiter.expiration_jitter_max_seconds;
            let breakers = breakers("memcache", settings, stats);
            let workers = memcache::per_worker(&settings.memcache, jitter, pool, &breakers)
                .await?
                .into_iter()
                .map(RemoteStore::Memcache)
                .collect();
            tracing::info!(nodes = %settings.memcache.memcache_host_port, "using the memcache backend");
            Ok(Backend::Remote(Remote::new(
                "memcache",
                PerWorker::new(workers),
                None,
                (settings.memcache.memcache_timeout, "MEMCACHE_TIMEOUT"),
                stats.counter(names::MEMCACHE_ERROR),
                breakers,
            )))
        }
    }
}

fn breakers(name: &'static str, settings: &Settings, stats: &StatsRegistry) -> Arc<Breakers> {
    Arc::new(Breakers::new(
        name,
        settings.outage.backend_breaker_failures,
        settings.outage.backend_breaker_open_duration,
        stats,
    ))
}

/// Where counters live.
#[derive(Debug)]
pub enum Backend {
    /// This process's memory: counters are not shared with other instances.
    Memory(Arc<MemoryStore>),
    /// A remote store, shared by every instance pointed at it.
    Remote(Remote),
    /// A remote store, counted here and sent to it in the background.
    WriteBehind(Arc<WriteBehind>),
}

impl Backend {
    /// The store's name, as the dashboard and trace spans show it.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Remote(remote) => remote.name,
            Backend::WriteBehind(behind) => behind.remote().name,
        }
    }

    /// The remote store, counted through or written behind.
    pub fn remote(&self) -> Option<&Remote> {
        match self {
            Backend::Memory(_) => None,
            Backend::Remote(remote) => Some(remote),
            Backend::WriteBehind(behind) => Some(behind.remote()),
        }
    }

    /// Why rules cannot be counted on this backend: write-behind counters refuse the
    /// algorithms that need the store's answer for each request.
    pub fn refusal(&self, config: &ratelimit_core::Config) -> Option<String> {
        match self {
            Backend::WriteBehind(_) => write_behind::refusal(config),
            _ => None,
        }
    }
}

/// A remote store, with the per-second one when configured, and what bounds a call.
#[derive(Debug)]
pub struct Remote {
    /// The store's name: `redis` or `memcache`.
    pub name: &'static str,
    main: PerWorkerStore,
    per_second: Option<PerWorkerStore>,
    deadline: Duration,
    /// The setting that names `deadline`, for the error.
    deadline_setting: &'static str,
    errors: Arc<Counter>,
    breakers: Arc<Breakers>,
}

impl Remote {
    /// Counters in `main`, except those of `second` limits, which go to `per_second`
    /// when there is one. Every call gets at most `deadline` (named by the setting
    /// `deadline_setting`); `errors` counts the calls that fail. The stores call each
    /// node through its breaker in `breakers`, which keeps calls from a node while it
    /// keeps failing.
    pub fn new(
        name: &'static str,
        main: PerWorkerStore,
        per_second: Option<PerWorkerStore>,
        deadline: (Duration, &'static str),
        errors: Arc<Counter>,
        breakers: Arc<Breakers>,
    ) -> Remote {
        Remote {
            name,
            main,
            per_second,
            deadline: deadline.0,
            deadline_setting: deadline.1,
            errors,
            breakers,
        }
    }

    /// Runs the plan's counters and returns their totals, in plan order, within the
    /// store's deadline or `caller_deadline` when that is shorter. While the breaker of
    /// a node the plan needs is open, nothing is sent to it and the answer is
    /// `Unavailable` at once. A call the caller's shorter deadline ends is
    /// [`BackendError::CallerDeadline`]: the store is not judged by it.
    pub async fn run(
        &self,
        plan: &mut Plan,
        caller_deadline: Option<Duration>,
    ) -> Result<Totals, BackendError> {
        // A tenth of the caller's time is kept for answering (the failure mode's answer
        // must reach it before it gives up).
        let wait = caller_deadline.map_or(self.deadline, |d| (d - d / 10).min(self.deadline));
        let now = Instant::now();
        let deadlines = Deadlines {
            wait: now + wait,
            judge: now + self.deadline,
        };
        // Every store call ends by `deadlines.wait`: the pipelined connections' timers
        // fail their late requests, and the other connections' calls are bounded where
        // they are made. The current counts first when the plan needs them; written out
        // here rather than in a function of its own, whose future this one would copy in.
        let result = 'run: {
            if plan.needs_current_counts() {
                match self
                    .routed(plan.increments(), Mode::Current, deadlines)
                    .await
                {
                    Ok(current) => plan.apply_current(&current),
                    Err(error) => break 'run Err(error),
                }
            }
            self.routed(plan.increments(), Mode::Increment, deadlines)
                .await
        };
        let result = match result {
            Err(BackendError::Late) if wait < self.deadline => {
                return Err(BackendError::CallerDeadline(wait));
            }
            Err(BackendError::Late) => Err(self.late()),
            result => result,
        };
        if result.is_err() {
            self.errors.add(1);
        }
        result
    }

    /// Sends `increments` (a write-behind flush) within the store's deadline, through its
    /// breakers; a failure counts in its error statistic.
    pub async fn send(&self, increments: &[Increment]) -> Result<Totals, BackendError> {
        let until = Deadlines::store(Instant::now() + self.deadline);
        let result = match self.routed(increments, Mode::Increment, until).await {
            Err(BackendError::Late) => Err(self.late()),
            result => result,
        };
        if result.is_err() {
            self.errors.add(1);
        }
        result
    }

    /// The nodes whose breakers keep calls from them.
    pub fn open_breakers(&self) -> Vec<String> {
        self.breakers.open_nodes()
    }

    /// The counters' current totals, in order, without adding to them (an explanation).
    pub async fn current(&self, increments: &[Increment]) -> Result<Totals, BackendError> {
        let until = Deadlines::store(Instant::now() + self.deadline);
        let read = self.routed(increments, Mode::Current, until);
        match read.await {
            Err(BackendError::Late) => Err(self.late()),
            result => result,
        }
    }

    /// `Unavailable`, naming the store's deadline that a call did not end within.
    fn late(&self) -> BackendError {
        let (setting, deadline) = (self.deadline_setting, self.deadline);
        BackendError::Unavailable(format!("no answer within {setting} ({deadline:?})"))
    }

    /// Whether the main store answers, within the deadline.
    pub async fn ping(&self) -> bool {
        let answer = tokio::time::timeout(self.deadline, self.main.get().ping());
        matches!(answer.await, Ok(true))
    }

    /// Runs `mode` on the main store with every increment, or, with a per-second store,
    /// on each store with its share, at once; the totals come back in plan order.
    async fn routed(
        &self,
        increments: &[Increment],
        mode: Mode,
        deadlines: Deadlines,
    ) -> Result<Totals, BackendError> {
        let Some(per_second) = &self.per_second else {
            let all: SmallVec<[&Increment; 4]> = increments.iter().collect();
            let batch = Batch {
                increments: &all,
                mode,
                deadlines,
            };
            return self.main.get().call(batch).await;
        };
        // Boxed: the two stores' calls at once would double every request's future.
        let split: BoxFuture<'_, _> = Box::pin(self.split(per_second, increments, mode, deadlines));
        split.await
    }

    /// [`Remote::routed`] with a per-second store.
    async fn split(
        &self,
        per_second: &PerWorkerStore,
        increments: &[Increment],
        mode: Mode,
        deadlines: Deadlines,
    ) -> Result<Totals, BackendError> {
        let batch = |increments| Batch {
            increments,
            mode,
            deadlines,
        };
        let (seconds, others): (Vec<usize>, Vec<usize>) =
            (0..increments.len()).partition(|&i| increments[i].per_second());
        let pick = |indexes: &[usize]| -> Vec<&Increment> {
            indexes.iter().map(|&i| &increments[i]).collect()
        };
        let (seconds_items, others_items) = (pick(&seconds), pick(&others));
        let (a, b) = tokio::join!(
            per_second.get().call(batch(&seconds_items)),
            self.main.get().call(batch(&others_items))
        );
        let mut totals: Totals = smallvec::smallvec![0; increments.len()];
        for (i, total) in seconds.iter().zip(a?).chain(others.iter().zip(b?)) {
            totals[*i] = total;
        }
        Ok(totals)
    }
}
