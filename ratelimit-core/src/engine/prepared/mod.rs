//! A prepared keyed check: a descriptor's keys resolved to their rule once, then each
//! call counts the values it is given, with no matching, no request to build and no
//! allocation, and answers as the full decision would for the same one-descriptor
//! request: the same counters, statistics, codes and header values (a property test
//! compares the two).
//!
//! Only rules that apply whatever the values are can be prepared: at every level, the
//! key-only rule, with no rule of a value of its own beside it, and no statistics key that
//! carries the values (`detailed_metric`, `value_to_metric`). Everything else a single
//! descriptor meets is kept: every algorithm, `rate_limits` and the `replaces` among them,
//! `unlimited`, whitelists, shadow and quota modes, global shadow and quota modes and
//! STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.

mod resolve;

use std::sync::Arc;

use smallvec::SmallVec;

use crate::counting::counter_key::{CounterKey, Values};
use crate::counting::{Counting, Span};
use crate::engine::Applied;
use crate::engine::Engine;
use crate::engine::keys::{push_entries, push_window_and_suffix};
use crate::engine::status::{code_when_over, count_hits, decides_over, overall_code, tally};
use crate::limiter::Limiter;
use crate::model::request::{Descriptor, Request, RequestError};
use crate::model::response::{Code, DescriptorStatus, RateLimitHeaders};
use crate::model::time::UnixMillis;
use crate::rules::{Node, NodeId, NodeLimit};
use crate::stats::RuleStats;
use crate::store::CounterStore;

/// Why a check cannot be prepared, or a prepared check cannot decide.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// No configuration, or a name or addend past [`crate::RequestBounds`].
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The rules have no such domain.
    #[error("domain '{0}' is not in the rules")]
    UnknownDomain(String),
    /// No rule matches descriptors with these keys: every request would be allowed.
    #[error("no rule of domain '{domain}' matches descriptors with the keys {keys:?}")]
    NoRule {
        /// The domain.
        domain: String,
        /// The keys, outermost first.
        keys: Vec<String>,
    },
    /// A rule of a value of its own (exact or wildcard) decides for this key: use the
    /// full decision ([`Limiter::should_rate_limit`]).
    #[error(
        "the rule at {domain}: {path} matches key '{key}' by its value; a prepared check needs key-only rules"
    )]
    DependsOnValues {
        /// The domain.
        domain: String,
        /// The key whose value decides.
        key: String,
        /// Where one of the rules with a value is in the domain's YAML.
        path: String,
    },
    /// The rule keeps statistics per value (`detailed_metric`, `value_to_metric`).
    #[error("the rule at {domain}: {path} keeps statistics per value; a prepared check cannot")]
    PerValueStatistics {
        /// The domain.
        domain: String,
        /// Where the rule is in the domain's YAML.
        path: String,
    },
    /// The rule is a concurrency limit, whose places are given back by each request's
    /// refund: use the full decision ([`Limiter::should_rate_limit`]).
    #[error(
        "the rule at {domain}: {path} is a concurrency limit; a prepared check cannot hold a lease"
    )]
    Concurrency {
        /// The domain.
        domain: String,
        /// Where the rule is in the domain's YAML.
        path: String,
    },
    /// A call gave a different number of values than the check has keys.
    #[error("{given} values given for {expected} keys")]
    WrongValueCount {
        /// How many keys the check was prepared with.
        expected: usize,
        /// How many values the call gave.
        given: usize,
    },
}

/// The answer of a [`PreparedCheck`]: what the full decision's response says for the
/// same one-descriptor request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The request is within its limits (or over them in shadow mode): the response's
    /// overall code is [`Code::Ok`].
    pub allowed: bool,
    /// The limit, hits left and seconds until reset, when a counted limit applied.
    pub headers: Option<RateLimitHeaders>,
}

impl Decision {
    /// Hits left in the window (tokens in a bucket); `None` when no counted limit applied.
    pub fn remaining(&self) -> Option<u32> {
        self.headers.map(|h| h.remaining)
    }

    /// Seconds until the count goes down or one more request fits.
    pub fn reset(&self) -> Option<u64> {
        self.headers.map(|h| h.reset)
    }

    /// For a refused request, the seconds to wait before trying again (`Retry-After`).
    pub fn retry_after(&self) -> Option<u64> {
        self.headers
            .filter(|_| !self.allowed)
            .map(|h| h.reset.max(1))
    }
}

/// One descriptor shape (a domain and its entries' keys) resolved to its rule, ready to
/// decide values at the cost of counting them.
///
/// Made by [`Limiter::prepare`]. It follows reloads: after [`Limiter::set_config`] it
/// decides with the new rules, resolving its keys again on each call (or failing, when
/// the new rules cannot be prepared for them) until [`PreparedCheck::refresh`] keeps the
/// new resolution.
///
/// ```
/// use std::sync::Arc;
/// use ratelimit_core::config::{Domain, RateLimit, Rule};
/// use ratelimit_core::{Limiter, MemoryStore, Settings, Unit, UnixMillis};
///
/// let rules = Domain::new("api").rule(Rule::key("user").limit(RateLimit::per(Unit::Minute, 2)));
/// let limiter = Arc::new(Limiter::new(&rules.build()?, Settings::default()));
/// let check = limiter.prepare("api", &["user"])?;
/// let store = MemoryStore::default();
/// let now = UnixMillis(1_700_000_000_000);
/// let allowed: Vec<bool> = (0..3)
///     .map(|_| check.decide(&["alice"], &store, now).map(|d| d.allowed))
///     .collect::<Result<_, _>>()?;
/// assert_eq!(allowed, [true, true, false]);
/// assert_eq!(check.decide(&["bob"], &store, now)?.remaining(), Some(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PreparedCheck {
    limiter: Arc<Limiter>,
    domain: Box<str>,
    keys: Box<[Box<str>]>,
    generation: u64,
    target: Target,
}

/// What the keys resolved to in one configuration.
#[derive(Debug)]
struct Target {
    engine: Arc<Engine>,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A whitelist, or every limit replaced.
    NoLimit,
    Unlimited,
    /// A node with one counted limit left after `replaces` (the common case), with what
    /// each call needs of it worked out once.
    One(One),
    /// The node and its limits left after `replaces`.
    Limited(NodeId, SmallVec<[u16; 2]>),
}

/// Limit `which` of node `node`, as the full decision applies it, ready for
/// a call.
#[derive(Debug)]
struct One {
    node: NodeId,
    which: u16,
    stats: Arc<RuleStats>,
    counting: Counting,
    requests_per_unit: u32,
    /// The bound and the count from which hits are near it.
    bounds: (u64, u64),
    shadow: bool,
}

/// One call's inputs.
struct Call<'a> {
    domain: &'a str,
    keys: &'a [Box<str>],
    values: &'a [&'a str],
    addend: u64,
    now_ms: u64,
}

impl PreparedCheck {
    /// Resolves descriptors of `keys` (outermost first) in `domain` to their rule in
    /// `limiter`'s rules ([`Limiter::prepare`]).
    pub(crate) fn new(
        limiter: &Arc<Limiter>,
        domain: &str,
        keys: &[&str],
    ) -> Result<PreparedCheck, PrepareError> {
        let keys: Box<[Box<str>]> = keys.iter().map(|&k| k.into()).collect();
        let (generation, target) = Target::resolve(limiter, domain, &keys)?;
        Ok(PreparedCheck {
            limiter: Arc::clone(limiter),
            domain: domain.into(),
            keys,
            generation,
            target,
        })
    }

    /// Counts one hit for the descriptor whose values are `values` (one per key, in
    /// order) against `store` at `at`.
    #[inline]
    pub fn decide<S>(
        &self,
        values: &[&str],
        store: &S,
        at: UnixMillis,
    ) -> Result<Decision, PrepareError>
    where
        S: CounterStore + ?Sized,
    {
        self.decide_hits(values, 1, store, at)
    }

    /// [`PreparedCheck::decide`] counting `hits` (0 only checks).
    pub fn decide_hits<S>(
        &self,
        values: &[&str],
        hits: u64,
        store: &S,
        at: UnixMillis,
    ) -> Result<Decision, PrepareError>
    where
        S: CounterStore + ?Sized,
    {
        self.check(values, hits)?;
        let call = Call {
            domain: &self.domain,
            keys: &self.keys,
            values,
            addend: hits,
            now_ms: at.as_millis(),
        };
        if self.limiter.config_generation() == self.generation {
            return Ok(self.target.decide(&call, store));
        }
        let (_, target) = Target::resolve(&self.limiter, &self.domain, &self.keys)?;
        Ok(target.decide(&call, store))
    }

    /// Whether the check was resolved against the limiter's current rules.
    pub fn is_current(&self) -> bool {
        self.limiter.config_generation() == self.generation
    }

    /// Resolves the keys again against the current rules and keeps the result, so that
    /// calls after a reload no longer resolve them each time.
    pub fn refresh(&mut self) -> Result<(), PrepareError> {
        let (generation, target) = Target::resolve(&self.limiter, &self.domain, &self.keys)?;
        (self.generation, self.target) = (generation, target);
        Ok(())
    }

    /// The keys the check was prepared with.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| &**k)
    }

    /// The bounds of [`crate::RequestBounds`] on one call's values and hits.
    #[inline]
    fn check(&self, values: &[&str], hits: u64) -> Result<(), PrepareError> {
        if values.len() != self.keys.len() {
            return Err(PrepareError::WrongValueCount {
                expected: self.keys.len(),
                given: values.len(),
            });
        }
        let bounds = &self.limiter.settings().bounds;
        if hits > bounds.max_hits_addend || values.iter().any(|v| v.len() > bounds.max_value_bytes)
        {
            bounds.check(&self.request(values, hits))?;
        }
        Ok(())
    }

    /// The full decision's request for the same call.
    #[cold]
    fn request(&self, values: &[&str], hits: u64) -> Request {
        request_of(&self.domain, &self.keys, values, hits)
    }
}

/// The one-descriptor request a prepared check decides like.
fn request_of(domain: &str, keys: &[Box<str>], values: &[&str], hits: u64) -> Request {
    let entries = keys.iter().map(|k| &**k).zip(values.iter().copied());
    Request::new(domain, vec![Descriptor::new(entries).with_hits(hits)])
}

impl Target {
    /// The keys' rule in the limiter's current configuration, and its generation.
    fn resolve(
        limiter: &Limiter,
        domain: &str,
        keys: &[Box<str>],
    ) -> Result<(u64, Target), PrepareError> {
        let (generation, engine) = limiter.current_engine()?;
        let values = vec![""; keys.len()];
        let request = request_of(domain, keys, &values, 1);
        if request.domain.is_empty() {
            return Err(RequestError::EmptyDomain.into());
        }
        limiter.settings().bounds.check(&request)?;
        let id = resolve::find(&engine, domain, keys)?;
        let kind = Kind::of(&engine, domain, id)?;
        Ok((generation, Target { engine, kind }))
    }

    fn decide<S: CounterStore + ?Sized>(&self, call: &Call<'_>, store: &S) -> Decision {
        let engine = &*self.engine;
        let (status, quota) = match &self.kind {
            Kind::NoLimit => (DescriptorStatus::NO_LIMIT, engine.settings.quota_mode),
            Kind::Unlimited => (DescriptorStatus::UNLIMITED, false),
            Kind::One(one) => return self.decide_one(one, call, store),
            Kind::Limited(id, limits) => {
                let node = engine.rules.node(*id);
                let quota = node.quota_mode || engine.settings.quota_mode;
                (self.count_limits(node, limits, call, store), quota)
            }
        };
        let statuses = std::slice::from_ref(&status);
        Decision {
            allowed: overall_code(engine, statuses, &[quota], false) == Code::Ok,
            headers: RateLimitHeaders::choose(statuses, |_| quota),
        }
    }

    /// [`Target::decide`] of a lone limit: what the general path answers, without the
    /// statuses it would choose among.
    #[inline]
    fn decide_one<S: CounterStore + ?Sized>(
        &self,
        one: &One,
        call: &Call<'_>,
        store: &S,
    ) -> Decision {
        let engine = &*self.engine;
        let limit = &engine.rules.node(one.node).limits[usize::from(one.which)];
        let (bound, addend, now_ms) = (one.bounds.0, call.addend, call.now_ms);
        let count =
            |key: &CounterKey<'_>, span| engine.count(store, key, addend, span, bound, now_ms);
        let assessed = if one.counting.counter_count() == 1 {
            let span = one.counting.span(0, now_ms);
            let total = self.with_key(limit, span, call, |key| count(key, span));
            one.counting.assess(&[total], addend, bound, now_ms)
        } else {
            let (totals, counted) = self.totals(limit, one.counting, call, count);
            one.counting
                .assess(&totals[..counted], addend, bound, now_ms)
        };
        let (code, remaining) = tally(&one.stats, one.shadow, one.bounds, addend, assessed.after);
        // One status: the request is over exactly when it is, whatever the quota modes.
        let code = match code {
            Code::Ok => Code::Ok,
            _ => code_when_over(engine, false),
        };
        Decision {
            allowed: code == Code::Ok,
            headers: Some(RateLimitHeaders {
                limit: one.requests_per_unit,
                remaining,
                reset: assessed.reset,
            }),
        }
    }

    /// Counts every limit of `node` and reports the one that decided, as the plan does.
    fn count_limits<S: CounterStore + ?Sized>(
        &self,
        node: &Node,
        limits: &[u16],
        call: &Call<'_>,
        store: &S,
    ) -> DescriptorStatus {
        if let [which] = limits {
            return self.count_limit(node, *which, call.addend, call, store);
        }
        let held_back = self.held_back(node, limits, call, store);
        let mut decided: Option<DescriptorStatus> = None;
        for (i, &which) in limits.iter().enumerate() {
            let hits = match held_back.get(i) {
                Some(true) => 0,
                _ => call.addend,
            };
            let status = self.count_limit(node, which, hits, call, store);
            match &mut decided {
                Some(current) if !decides_over(&status, current) => {}
                slot => *slot = Some(status),
            }
        }
        decided.expect("a limited target has a limit")
    }

    /// With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT and several limits: whether each
    /// limit is only checked, not counted, because another would go over and it would
    /// not (empty: every limit is counted).
    fn held_back<S: CounterStore + ?Sized>(
        &self,
        node: &Node,
        limits: &[u16],
        call: &Call<'_>,
        store: &S,
    ) -> SmallVec<[bool; 4]> {
        let engine = &*self.engine;
        let mut within = SmallVec::new();
        if !engine.settings.stop_cache_key_increment_when_overlimit {
            return within;
        }
        for &which in limits {
            let (limit, applied) = self.limit(node, which);
            let now = call.now_ms / 1_000;
            let (current, read) =
                self.totals(limit, applied.counting, call, |key, _| store.get(key, now));
            let (addend, bound) = (call.addend, applied.bound);
            let over = applied
                .counting
                .exceeds(&current[..read], addend, bound, call.now_ms);
            within.push(!over);
        }
        if within.iter().all(|&w| w) {
            within.clear();
        }
        within
    }

    /// Counts `hits` on limit `which` of `node` and gives its status, with statistics.
    #[inline]
    fn count_limit<S: CounterStore + ?Sized>(
        &self,
        node: &Node,
        which: u16,
        hits: u64,
        call: &Call<'_>,
        store: &S,
    ) -> DescriptorStatus {
        let engine = &*self.engine;
        let (limit, applied) = self.limit(node, which);
        let (totals, counted) = self.totals(limit, applied.counting, call, |key, span| {
            engine.count(store, key, hits, span, applied.bound, call.now_ms)
        });
        let at = (applied.bound, call.now_ms);
        let assessed = applied
            .counting
            .assess(&totals[..counted], call.addend, at.0, at.1);
        count_hits(
            &applied,
            call.addend,
            assessed,
            engine.settings.near_limit_ratio,
        )
    }

    /// Limit `which` of `node`, and how it applies.
    #[inline(always)]
    fn limit<'a>(&'a self, node: &'a Node, which: u16) -> (&'a NodeLimit, Applied<'a>) {
        let limit = &node.limits[usize::from(which)];
        let stats = limit
            .stats
            .as_deref()
            .expect("counted limits have statistics");
        (limit, self.engine.applied_node(node, which, stats))
    }

    /// What `count` gives for each counter of `limit`, in order, and how many there are.
    #[inline(always)]
    fn totals(
        &self,
        limit: &NodeLimit,
        counting: Counting,
        call: &Call<'_>,
        mut count: impl FnMut(&CounterKey<'_>, Span) -> u64,
    ) -> ([u64; 2], usize) {
        let (mut totals, mut counted) = ([0u64; 2], 0);
        self.for_each_counter(limit, counting, call, |key, span| {
            totals[counted] = count(key, span);
            counted += 1;
        });
        (totals, counted)
    }

    /// Calls `f` for each counter `limit` needs, keyed as the full decision keys it.
    #[inline(always)]
    fn for_each_counter(
        &self,
        limit: &NodeLimit,
        counting: Counting,
        call: &Call<'_>,
        mut f: impl FnMut(&CounterKey<'_>, Span),
    ) {
        for span in counting.counters(call.now_ms) {
            self.with_key(limit, span, call, |key| f(key, span));
        }
    }

    /// Calls `f` with the key of the counter of `limit` for `span`, as the full decision
    /// keys it.
    #[inline(always)]
    fn with_key<R>(
        &self,
        limit: &NodeLimit,
        span: Span,
        call: &Call<'_>,
        f: impl FnOnce(&CounterKey<'_>) -> R,
    ) -> R {
        let start = (!span.op.is_windowless()).then_some(span.start);
        let write = |out: &mut String| {
            let prefix = &self.engine.settings.cache_key_prefix;
            let entries = call
                .keys
                .iter()
                .map(|k| &**k)
                .zip(call.values.iter().copied());
            push_entries(out, prefix, call.domain, entries);
            push_window_and_suffix(out, start, &limit.key_suffix);
        };
        let values = Values::Strs(call.values);
        f(&CounterKey::new(
            limit.identity,
            start.unwrap_or(0),
            values,
            &write,
        ))
    }
}
