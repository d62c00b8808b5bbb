//! The engine: one configuration compiled ([`Engine`]), and planning a request (which
//! counters to add to) and deciding it from the counts.
//!
//! Remote stores run a [`Plan`]'s increments in one round trip and hand the totals back
//! to [`Plan::decide`]; the in-process [`crate::Limiter::should_rate_limit`] does the same
//! against a [`crate::CounterStore`]. Both go in one pass (`direct`: no list of matched
//! limits to walk again) when each descriptor matches at most one plain limit. Matching,
//! windows, replaces, shadow and quota modes and statistics all
//! happen here, once, by concern: `matching` (which rule applies to each descriptor),
//! `keys` (counter and statistic keys), `status` (a descriptor's status from its
//! counter), `decision` (codes, counts and statistics from the totals), `direct` (the
//! one-pass order of the same steps), `prepared` (a keyed check made once and run many
//! times), `quota` (the Rate Limit Quota Service's rules) and `explain` (the same, dry).
//! Which counters a limit needs, and what their totals mean, is its [`Counting`].

mod decision;
mod direct;
mod explain;
mod keys;
mod matching;
mod prepared;
mod quota;
mod status;

pub use explain::{DescriptorExplanation, Explanation, MatchedEntry, Outcome};
pub use prepared::{Decision, PrepareError, PreparedCheck};
pub use quota::{QuotaLimit, QuotaRule};

use std::sync::Arc;

use smallvec::SmallVec;

use crate::counting::counter_key::{CounterId, CounterKey};
use crate::counting::gcra::Bucket;
use crate::counting::local_cache::OverLimitCache;
use crate::counting::{CounterOp, Counting, Span};
use crate::model::request::LimitOverride;
use crate::model::response::{Code, CurrentLimit, DescriptorStatus, Response};
use crate::rules::unit::{Unit, Window};
use crate::rules::{NodeId, RuleSet};
use crate::settings::Settings;
use crate::stats::{Counter, RuleStats, StatsRegistry};

/// One configuration, compiled, with what deciding needs next to it.
#[derive(Debug)]
pub(crate) struct Engine {
    pub rules: RuleSet,
    pub settings: Settings,
    pub stats: Arc<StatsRegistry>,
    pub global_shadow: Arc<Counter>,
    pub local_cache: Option<Arc<OverLimitCache>>,
}

/// The largest addend a remote counter is sent ([`Increment::store_hits`]).
pub const STORE_HITS_CAP: u64 = 1 << 62;

/// One counter to add to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Increment {
    /// The cache key, byte for byte envoyproxy/ratelimit's:
    /// `CACHE_KEY_PREFIX` + domain + `_` + (`key_value_` per entry) + window start.
    pub key: String,
    /// The same counter as the in-process stores key it.
    pub(crate) id: CounterId,
    /// How much to add (0 only checks); a bucket's cost.
    pub hits: u64,
    /// What the store does with the counter.
    pub op: CounterOp,
    /// The window the counter belongs to.
    pub window: Window,
    /// Unix second at which the window ends.
    pub window_end: u64,
    /// Unix second after which the counter is no longer needed (a sliding window's
    /// counter is read again during the next window).
    pub expires: u64,
    /// The request's time, unix milliseconds (what a bucket's step runs at).
    pub now_ms: u64,
}

impl Increment {
    /// The increment of `hits` on the counter `key`, counted as `span` says, at `now_ms`.
    pub(crate) fn new(key: &CounterKey<'_>, hits: u64, span: Span, now_ms: u64) -> Increment {
        let mut increment = Increment {
            key: String::new(),
            id: CounterId::default(),
            hits,
            op: span.op,
            window: span.window,
            window_end: 0,
            expires: 0,
            now_ms,
        };
        increment.refill(key, hits, span, now_ms);
        increment
    }

    /// This increment made the one of [`Increment::new`], in place: its key's string and
    /// its id's buffers are reused.
    pub(crate) fn refill(&mut self, key: &CounterKey<'_>, hits: u64, span: Span, now_ms: u64) {
        self.key.clear();
        key.write_text(&mut self.key);
        self.id.refill(key);
        self.hits = hits;
        self.op = span.op;
        self.window = span.window;
        self.window_end = span.start + span.window.seconds();
        self.expires = span.expires;
        self.now_ms = now_ms;
    }

    /// Writes the increment of [`Increment::new`] at `at` in `increments`: over an
    /// earlier plan's counter there, reusing its strings, or after the last.
    pub(crate) fn put(
        increments: &mut Vec<Increment>,
        at: usize,
        (key, hits, span, now_ms): (&CounterKey<'_>, u64, Span, u64),
    ) {
        match increments.get_mut(at) {
            Some(earlier) => earlier.refill(key, hits, span, now_ms),
            None => increments.push(Increment::new(key, hits, span, now_ms)),
        }
    }

    /// Whether this counter belongs on the per-second store of a split deployment.
    pub fn per_second(&self) -> bool {
        self.window.unit() == Unit::Second
    }

    /// Expiry to set on a remote counter: how long it is needed (the window length for
    /// a fixed window) plus `jitter` seconds, which spreads the expiry of many keys
    /// created together.
    pub fn expiry_seconds(&self, jitter: u64) -> u64 {
        self.window.seconds() + self.expires.saturating_sub(self.window_end) + jitter
    }

    /// The hits to send to a remote counter: [`Increment::hits`], capped at 2^62. Every
    /// limit is below 2^32, so a capped addend is over every limit just the same, and a
    /// 64-bit counter (Redis's signed one, memcached's unsigned one) cannot wrap from one
    /// addend: a counter that holds less than 2^62 stays below 2^63 after it, and one
    /// that holds more is over every limit already.
    pub fn store_hits(&self) -> u64 {
        self.hits.min(STORE_HITS_CAP)
    }

    /// What the store would report for this counter when it currently holds `current`.
    pub fn after(&self, current: u64) -> u64 {
        match self.op {
            CounterOp::Add => current.saturating_add(self.hits),
            CounterOp::Read => current,
            CounterOp::Gcra(bucket) => bucket.next(current, self.now_ms, self.hits),
            CounterOp::Refund => current.saturating_sub(self.hits),
            CounterOp::GcraRefund(bucket) => bucket.refund(current, self.now_ms, self.hits),
            CounterOp::Acquire(_) => current.saturating_add(self.hits.min(1)),
            CounterOp::Release(_) => current.saturating_sub(1),
        }
    }
}

/// The work for one request: the increments to run, then [`Plan::decide`] on their totals.
///
/// A plan keeps the configuration it was made with alive, so a reload in between does not
/// change its answer.
#[derive(Debug)]
pub struct Plan {
    pub(crate) engine: Arc<Engine>,
    pub(crate) body: PlanBody,
}

impl Plan {
    /// The counters to add to, in order. Send `increments()[i].hits` to counter `i` and
    /// pass the totals after the additions to [`Plan::decide`] in the same order.
    pub fn increments(&self) -> &[Increment] {
        &self.body.increments
    }

    /// Whether [`Plan::apply_current`] must be called first: with
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, the current counts decide which counters
    /// are incremented at all.
    pub fn needs_current_counts(&self) -> bool {
        self.engine.settings.stop_cache_key_increment_when_overlimit
            && !self.body.increments.is_empty()
    }

    /// With the current value of each counter (same order as [`Plan::increments`]): when
    /// any descriptor would go over its limit, only those descriptors are incremented and
    /// the others are only checked, as envoyproxy/ratelimit does.
    pub fn apply_current(&mut self, current: &[u64]) {
        if let Some(increment) = self.body.counters_to_increment(&self.engine, current) {
            for (counter, increment) in self.body.increments.iter_mut().zip(increment) {
                if !increment {
                    counter.hits = 0;
                }
            }
        }
    }

    /// The response, from the counter totals after the increments.
    ///
    /// # Panics
    /// If `counts` is shorter than [`Plan::increments`].
    pub fn decide(self, counts: &[u64]) -> Response {
        self.body.decide(&self.engine, counts)
    }

    /// [`Plan::decide`], and the buffers this plan leaves for another
    /// ([`crate::Limiter::plan_millis_in`]).
    ///
    /// # Panics
    /// If `counts` is shorter than [`Plan::increments`].
    pub fn decide_keeping_buffers(self, counts: &[u64]) -> (Response, PlanBuffers) {
        let response = self.body.decide(&self.engine, counts);
        let increments = self.body.increments;
        (response, PlanBuffers { increments })
    }
}

/// The buffers a decided plan leaves for the next one ([`crate::Limiter::plan_millis_in`]):
/// its counters, whose vector and key strings the next plan writes over. A caller that
/// keeps a few plans' buffers, as a remote store's caller does, plans a request without
/// allocating once it has planned one as large.
#[derive(Debug, Default)]
pub struct PlanBuffers {
    increments: Vec<Increment>,
}

impl PlanBuffers {
    /// The bytes it holds on the heap.
    pub fn held(&self) -> usize {
        let keys: usize = self.increments.iter().map(|i| i.key.capacity()).sum();
        self.increments.capacity() * size_of::<Increment>() + keys
    }
}

#[derive(Debug)]
pub(crate) struct PlanBody {
    /// An explanation's plan: no statistic, no local cache.
    dry: bool,
    /// The request's time, unix milliseconds.
    now_ms: u64,
    items: SmallVec<[Item; 4]>,
    /// Only the remote path fills it; in process it stays empty and unallocated.
    increments: Vec<Increment>,
}

#[derive(Debug)]
enum Item {
    NoLimit {
        quota: bool,
    },
    Unlimited {
        node: NodeId,
    },
    Limited(Limited),
    /// Planned in one pass (`direct`): a plan's items are all this or `NoLimit`, or none.
    Direct(Direct),
}

/// A descriptor planned in one pass: it matched the one plain limit of a rule, and its
/// counters follow the ones of the descriptors before it.
#[derive(Debug)]
struct Direct {
    node: NodeId,
    /// How many counters its limit needs.
    counters: u8,
    addend: u64,
}

#[derive(Debug)]
struct Limited {
    source: Source,
    /// The descriptor it limits, in request order.
    descriptor: usize,
    /// Another limit of the same descriptor comes before it (`rate_limits`).
    follows: bool,
    /// Each of this many deciders allows its share of the limit (1: all of it).
    divisor: u32,
    addend: u64,
    /// The hits are a refund (Envoy's `is_negative_hits`).
    refund: bool,
    /// Statistics whose key depends on the request; otherwise the node's own.
    stats: Option<Arc<RuleStats>>,
    /// Index of its first counter in the plan's increments (unused when `cached`).
    increment: usize,
    /// How many counters its limit needs ([`Counting::counters`]).
    counters: usize,
    /// The local cache knows the counter is over its limit: the store is not asked.
    cached: bool,
    /// Part of an explanation: counts no statistic.
    dry: bool,
}

#[derive(Debug, Clone, Copy)]
enum Source {
    /// A rule's limit: the node and which of its limits.
    Node(NodeId, u16),
    Override(LimitOverride),
}

struct Applied<'a> {
    requests_per_unit: u32,
    /// The most hits admitted: `requests_per_unit`, or a bucket's burst.
    bound: u64,
    window: Window,
    counting: Counting,
    name: Option<&'a Arc<str>>,
    shadow: bool,
    quota: bool,
    stats: &'a RuleStats,
}

impl Applied<'_> {
    /// This limit shared among `n` deciders: each allows `requests_per_unit / n` and, for
    /// a bucket, `burst / n`, rounded up so that no share of a limit above 0 becomes 0.
    fn divided(mut self, n: u32) -> Self {
        let share = |value: u32| value.div_ceil(n);
        self.requests_per_unit = share(self.requests_per_unit);
        self.counting = match self.counting {
            Counting::TokenBucket(bucket, window) => {
                let burst = share(bucket.burst);
                self.bound = u64::from(burst);
                Counting::TokenBucket(Bucket::new(window, self.requests_per_unit, burst), window)
            }
            Counting::Concurrency { window, .. } => {
                self.bound = u64::from(self.requests_per_unit);
                Counting::Concurrency {
                    window,
                    places: self.requests_per_unit,
                }
            }
            other => {
                self.bound = u64::from(self.requests_per_unit);
                other
            }
        };
        self
    }

    /// The status of a descriptor this limit applied to.
    pub(super) fn status(&self, code: Code, remaining: u32, reset: u64) -> DescriptorStatus {
        DescriptorStatus {
            code,
            current_limit: Some(CurrentLimit {
                requests_per_unit: self.requests_per_unit,
                unit: self.window.unit(),
                name: self.name.cloned(),
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(reset),
            metadata: None,
        }
    }
}
