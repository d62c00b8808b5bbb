//! The entry point: compiled rules, global settings and statistics.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use smallvec::SmallVec;

use crate::counting::local_cache::OverLimitCache;
use crate::engine::Engine;
use crate::engine::{Explanation, Plan, PrepareError, PreparedCheck, QuotaRule};
use crate::model::request::{Entry, Request, RequestBounds, RequestError};
use crate::model::response::Response;
use crate::model::time::{Decide, Planning, UnixMillis};
use crate::rules::config::Config;
use crate::rules::{RuleSet, RuleView};
use crate::settings::Settings;
use crate::stats::{Counter, StatsRegistry, names};
use crate::store::CounterStore;

thread_local! {
    /// The configuration this thread last decided with: a limiter's id, its generation
    /// then, and the engine. A decision reads one atomic instead of taking (and giving
    /// back) a reference from the `ArcSwap`, which costs two atomic read-modify-writes.
    /// The engine of a replaced configuration stays here until this thread's next
    /// decision.
    static ENGINE: RefCell<Option<(u64, u64, Arc<Engine>)>> = const { RefCell::new(None) };
}

/// Ids of limiters, for [`ENGINE`].
static LIMITER_IDS: AtomicU64 = AtomicU64::new(0);

/// Decides rate-limit requests against a configuration that can be replaced at any time.
///
/// Requests in flight during [`Limiter::set_config`] finish with the configuration they
/// started with. Statistics live in the limiter's [`StatsRegistry`] and survive reloads.
#[derive(Debug)]
pub struct Limiter {
    settings: Settings,
    stats: Arc<StatsRegistry>,
    global_shadow: Arc<Counter>,
    local_cache: Option<Arc<OverLimitCache>>,
    engine: ArcSwapOption<Engine>,
    /// This limiter among others in the process.
    id: u64,
    /// How many configurations were set: a thread's cached engine is current while the
    /// generation it was cached at is.
    generation: AtomicU64,
}

impl Limiter {
    /// A limiter serving `config`.
    pub fn new(config: &Config, settings: Settings) -> Limiter {
        let limiter = Limiter::without_config(settings);
        limiter.set_config(config);
        limiter
    }

    /// A limiter with no configuration yet: every request fails with
    /// [`RequestError::NoConfiguration`] until [`Limiter::set_config`].
    pub fn without_config(settings: Settings) -> Limiter {
        let stats = Arc::new(StatsRegistry::new(settings.max_stat_keys));
        let local_cache = (settings.local_cache_size_in_bytes > 0)
            .then(|| OverLimitCache::new(settings.local_cache_size_in_bytes, &stats));
        Limiter {
            global_shadow: stats.counter(names::GLOBAL_SHADOW_MODE),
            local_cache,
            settings,
            stats,
            engine: ArcSwapOption::empty(),
            id: LIMITER_IDS.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
        }
    }

    /// Replaces the configuration atomically, and the gauges of the configured limits
    /// with the new rules'.
    pub fn set_config(&self, config: &Config) {
        let rules = RuleSet::compile(config, &self.stats, &self.settings.cache_key_prefix);
        self.stats.set_rule_limits(rules.configured_limits());
        let engine = Engine {
            rules,
            settings: self.settings.clone(),
            stats: Arc::clone(&self.stats),
            global_shadow: Arc::clone(&self.global_shadow),
            local_cache: self.local_cache.clone(),
        };
        self.engine.store(Some(Arc::new(engine)));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// `f` on the current configuration, through this thread's cached engine when it is
    /// still current.
    /// (`f` returns the result itself, so that the answer is written once, where the
    /// caller reads it.)
    fn with_engine<R>(
        &self,
        f: impl FnOnce(&Arc<Engine>) -> Result<R, RequestError>,
    ) -> Result<R, RequestError> {
        let generation = self.generation.load(Ordering::Acquire);
        ENGINE.with(|cache| {
            if let Ok(cached) = cache.try_borrow()
                && let Some((id, at, engine)) = cached.as_ref()
                && (*id, *at) == (self.id, generation)
            {
                return f(engine);
            }
            let engine = self
                .engine
                .load_full()
                .ok_or(RequestError::NoConfiguration)?;
            // A decision nested in another's (a store that decides) keeps the outer's.
            if let Ok(mut cached) = cache.try_borrow_mut() {
                *cached = Some((self.id, generation, Arc::clone(&engine)));
            }
            f(&engine)
        })
    }

    /// The generation of the current configuration and its engine (read in that order,
    /// so the engine is never older than the generation says).
    pub(crate) fn current_engine(&self) -> Result<(u64, Arc<Engine>), RequestError> {
        let generation = self.generation.load(Ordering::Acquire);
        let engine = self
            .engine
            .load_full()
            .ok_or(RequestError::NoConfiguration)?;
        Ok((generation, engine))
    }

    /// A number that changes each time a configuration is set.
    pub fn config_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether a configuration was loaded.
    pub fn has_config(&self) -> bool {
        self.engine.load().is_some()
    }

    /// The settings given at construction.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The statistics of every rule, and any counters the caller adds.
    pub fn stats(&self) -> &Arc<StatsRegistry> {
        &self.stats
    }

    /// The local over-limit cache, when `local_cache_size_in_bytes` is set.
    pub fn local_cache(&self) -> Option<&OverLimitCache> {
        self.local_cache.as_deref()
    }

    /// The loaded rules, one line per limited rule, as envoyproxy/ratelimit's `/rlconfig`
    /// prints them: `<domain>.<key>_<value>: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false`.
    pub fn describe(&self) -> String {
        self.engine
            .load()
            .as_ref()
            .map(|e| e.rules.describe())
            .unwrap_or_default()
    }

    /// Every loaded rule, for display, domain by domain in file order, depth first.
    pub fn rules(&self) -> Vec<RuleView> {
        self.engine
            .load()
            .as_ref()
            .map(|e| e.rules.views())
            .unwrap_or_default()
    }

    /// What the rules say about the Rate Limit Quota Service bucket whose id is `bucket`
    /// in `domain`, at `now_ms`: see [`QuotaRule`].
    pub fn quota_rule(
        &self,
        domain: &str,
        bucket: &[Entry],
        now_ms: u64,
    ) -> Result<QuotaRule, RequestError> {
        let engine = self
            .engine
            .load_full()
            .ok_or(RequestError::NoConfiguration)?;
        Ok(engine.quota_rule(domain, bucket, now_ms))
    }

    /// Resolves descriptors of `keys` (outermost first) in `domain` to their rule, for
    /// [`PreparedCheck::decide`] on each request. Fails when the rule depends on the
    /// values (see [`PrepareError`]).
    pub fn prepare(
        self: &Arc<Limiter>,
        domain: &str,
        keys: &[&str],
    ) -> Result<PreparedCheck, PrepareError> {
        PreparedCheck::new(self, domain, keys)
    }

    /// Plans `request` for a remote counter store: the counters to add to
    /// ([`Plan::increments`]), to be run in one round trip and decided from their totals
    /// ([`Plan::decide`]). `how`: a [`UnixMillis`], or one reusing an earlier plan's
    /// buffers ([`UnixMillis::reusing`]).
    pub fn plan(&self, request: &Request, how: impl Into<Planning>) -> Result<Plan, RequestError> {
        let Planning { at, buffers } = how.into();
        let engine = self.engine_for(request)?;
        let body = engine.plan_body(request, at.as_millis(), false, buffers);
        Ok(Plan { engine, body })
    }

    /// Why `request` would get its answer at `at`, without counting it: read the
    /// counters of [`Explanation::increments`] and pass them to [`Explanation::answer`].
    pub fn explain(&self, request: &Request, at: UnixMillis) -> Result<Explanation, RequestError> {
        Ok(Explanation::new(
            self.engine_for(request)?,
            request,
            at.as_millis(),
        ))
    }

    /// The configuration a plan keeps alive, once `request` is known to be valid.
    fn engine_for(&self, request: &Request) -> Result<Arc<Engine>, RequestError> {
        // This thread's cached engine: one reference count, not the `ArcSwap`'s load.
        self.with_engine(|engine| {
            check(request, &self.settings.bounds)?;
            Ok(Arc::clone(engine))
        })
    }

    /// Decides `request` against counters in `store`. `how`: a [`UnixMillis`], or one
    /// deciding as a share of a fleet ([`UnixMillis::shared_by`]).
    pub fn should_rate_limit<S>(
        &self,
        request: &Request,
        store: &S,
        how: impl Into<Decide>,
    ) -> Result<Response, RequestError>
    where
        S: CounterStore + ?Sized,
    {
        let Decide { at, deciders } = how.into();
        self.with_engine(|engine| {
            check(request, &self.settings.bounds)?;
            Ok(decide(
                engine,
                request,
                store,
                at.as_millis(),
                deciders.max(1),
            ))
        })
    }
}

/// Decides `request` with `engine` against `store` as one of `deciders` (see
/// [`UnixMillis::shared_by`]).
fn decide<S>(engine: &Engine, request: &Request, store: &S, now_ms: u64, deciders: u32) -> Response
where
    S: CounterStore + ?Sized,
{
    if deciders == 1
        && let Some(response) = engine.decide_direct(request, store, now_ms)
    {
        return response;
    }
    let mut body = engine.match_request(request, now_ms, false);
    if deciders > 1 {
        body.share_among(deciders);
    }
    let now = now_ms / 1_000;
    let increment = if engine.settings.stop_cache_key_increment_when_overlimit {
        let mut current: SmallVec<[u64; 8]> = SmallVec::new();
        engine.for_each_counter(&body, request, |key, _, _, _| {
            current.push(store.get(key, now))
        });
        body.counters_to_increment(engine, &current)
    } else {
        None
    };
    let mut counts: SmallVec<[u64; 8]> = SmallVec::new();
    engine.for_each_counter(&body, request, |key, hits, span, bound| {
        let included = increment.as_ref().is_none_or(|inc| inc[counts.len()]);
        let hits = if included { hits } else { 0 };
        counts.push(engine.count(store, key, hits, span, bound, now_ms));
    });
    body.decide(engine, &counts)
}

fn check(request: &Request, bounds: &RequestBounds) -> Result<(), RequestError> {
    if request.domain.is_empty() {
        return Err(RequestError::EmptyDomain);
    }
    if request.descriptors.is_empty() {
        return Err(RequestError::NoDescriptors);
    }
    bounds.check(request)
}
