//! Planning a request (which counters to add to) and deciding it from the counts.
//!
//! Remote stores run a [`Plan`]'s increments in one round trip and hand the totals back
//! to [`Plan::decide`]; the in-process [`crate::Limiter::should_rate_limit`] does the same
//! against a [`crate::CounterStore`]. Matching, windows, replaces, shadow and quota modes
//! and statistics all happen here, once.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::config::Limit;
use crate::limiter::Engine;
use crate::local_cache::OverLimitCache;
use crate::request::{Descriptor, LimitOverride, Request};
use crate::response::{Code, CurrentLimit, DescriptorStatus, RateLimitHeaders, Response};
use crate::rules::{Level, MatchKind, Node, NodeId};
use crate::stats::{RULE_STATS_PREFIX, RuleStats, push_key_part};
use crate::unit::{Unit, Window};

/// One counter to add to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Increment {
    /// The cache key, byte for byte envoyproxy/ratelimit's:
    /// `CACHE_KEY_PREFIX` + domain + `_` + (`key_value_` per entry) + window start.
    pub key: String,
    /// How much to add (0 only checks).
    pub hits: u64,
    /// The window the counter belongs to.
    pub window: Window,
    /// Unix second at which the window, and so the counter, ends.
    pub window_end: u64,
}

impl Increment {
    /// Whether this counter belongs on the per-second store of a split deployment.
    pub fn per_second(&self) -> bool {
        self.window.unit() == Unit::Second
    }

    /// Expiry to set on a remote counter: the window length plus `jitter` seconds, which
    /// spreads the expiry of many keys created together.
    pub fn expiry_seconds(&self, jitter: u64) -> u64 {
        self.window.seconds() + jitter
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
}

#[derive(Debug)]
pub(crate) struct PlanBody {
    now: u64,
    items: SmallVec<[Item; 4]>,
    /// Only the remote path fills it; in process it stays empty and unallocated.
    increments: Vec<Increment>,
}

#[derive(Debug)]
enum Item {
    NoLimit { quota: bool },
    Unlimited { node: NodeId },
    Limited(Limited),
}

#[derive(Debug)]
struct Limited {
    source: Source,
    addend: u64,
    /// Statistics whose key depends on the request; otherwise the node's own.
    stats: Option<Arc<RuleStats>>,
    /// Index of its counter in the plan's increments (unused when `cached`).
    increment: usize,
    /// The local cache knows the counter is over its limit: the store is not asked.
    cached: bool,
}

#[derive(Debug, Clone, Copy)]
enum Source {
    Node(NodeId),
    Override(LimitOverride),
}

struct Applied<'a> {
    requests_per_unit: u32,
    window: Window,
    name: Option<&'a Arc<str>>,
    shadow: bool,
    quota: bool,
    stats: &'a RuleStats,
}

impl Applied<'_> {
    /// The status of a descriptor this limit applied to.
    fn status(&self, code: Code, remaining: u32, reset: u64) -> DescriptorStatus {
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

impl Engine {
    /// Matches `request`: what applies to each descriptor, and which counters it needs.
    pub(crate) fn match_request(&self, request: &Request, now: u64) -> PlanBody {
        let root = self.rules.domain(&request.domain);
        if root.is_none() {
            self.stats
                .counter(&format!(
                    "{RULE_STATS_PREFIX}{}.domain_not_found",
                    request.domain
                ))
                .add(1);
        }
        let default_addend = u64::from(request.hits_addend.max(1));
        let mut replaces = false;
        let mut items: SmallVec<[Item; 4]> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                let Some(root) = root else {
                    return self.no_limit();
                };
                let addend = descriptor.hits_addend.unwrap_or(default_addend);
                if let Some(limit) = descriptor.limit {
                    let key = override_stats_key(&request.domain, descriptor);
                    return Item::Limited(Limited {
                        source: Source::Override(limit),
                        addend,
                        stats: Some(self.stats.rule(&key)),
                        increment: 0,
                        cached: false,
                    });
                }
                let Some(id) = self.rules.find(root, &descriptor.entries, |_, _, _| {}) else {
                    return self.no_limit();
                };
                let node = self.rules.node(id);
                let Some(limit) = &node.limit else {
                    return self.no_limit();
                };
                replaces |= !limit.replaces.is_empty();
                match limit.limit {
                    Limit::Unlimited => Item::Unlimited { node: id },
                    Limit::Fixed { .. } => Item::Limited(Limited {
                        source: Source::Node(id),
                        addend,
                        stats: node.per_level_stats_key.then(|| {
                            self.stats.rule(&self.runtime_stats_key(
                                &request.domain,
                                root,
                                descriptor,
                                node,
                            ))
                        }),
                        increment: 0,
                        cached: false,
                    }),
                }
            })
            .collect();
        if replaces {
            self.apply_replaces(&mut items);
        }
        let mut counters = 0;
        for item in items.iter_mut() {
            if let Item::Limited(limited) = item {
                limited.increment = counters;
                counters += 1;
            }
        }
        PlanBody {
            now,
            items,
            increments: Vec::new(),
        }
    }

    /// Matches `request` and lists its counters with their keys, leaving out those the
    /// local over-limit cache already knows about.
    pub(crate) fn plan_body(&self, request: &Request, now: u64) -> PlanBody {
        let mut body = self.match_request(request, now);
        let mut increments = Vec::with_capacity(body.items.len());
        let mut key = String::new();
        self.for_each_counter(&body, request, &mut key, |key, hits, window, window_end| {
            increments.push(Increment {
                key: std::mem::take(key),
                hits,
                window,
                window_end,
            });
        });
        body.increments = increments;
        if let Some(cache) = &self.local_cache {
            body.skip_cached(cache, self.settings.stop_cache_key_increment_when_overlimit);
        }
        body
    }

    /// Calls `f(cache key, hits, window, window end)` for each counter of `body`, in counter order,
    /// building each key in `buffer`: the in-process path reuses one buffer and allocates
    /// no key, a plan takes each key out of it.
    pub(crate) fn for_each_counter(
        &self,
        body: &PlanBody,
        request: &Request,
        buffer: &mut String,
        mut f: impl FnMut(&mut String, u64, Window, u64),
    ) {
        let root = self.rules.domain(&request.domain);
        for (item, descriptor) in body.items.iter().zip(&request.descriptors) {
            if let Item::Limited(limited) = item {
                let window = self.applied(limited).window;
                buffer.clear();
                let start = window.start(body.now);
                self.cache_key(
                    buffer,
                    &request.domain,
                    root,
                    descriptor,
                    limited.source,
                    start,
                );
                f(buffer, limited.addend, window, start + window.seconds());
            }
        }
    }

    fn no_limit(&self) -> Item {
        Item::NoLimit {
            quota: self.settings.quota_mode,
        }
    }

    /// Drops every matched limit whose name another matched limit replaces; a dropped
    /// limit is neither counted nor reported.
    fn apply_replaces(&self, items: &mut [Item]) {
        let node_of = |item: &Item| match item {
            Item::Unlimited { node }
            | Item::Limited(Limited {
                source: Source::Node(node),
                ..
            }) => Some(*node),
            _ => None,
        };
        let replaced: Vec<&str> = items
            .iter()
            .filter_map(node_of)
            .filter_map(|id| self.rules.node(id).limit.as_ref())
            .flat_map(|limit| limit.replaces.iter().map(AsRef::as_ref))
            .collect();
        for item in items.iter_mut() {
            let name = node_of(item)
                .and_then(|id| self.rules.node(id).limit.as_ref())
                .and_then(|limit| limit.name.as_deref());
            if name.is_some_and(|name| replaced.contains(&name)) {
                *item = self.no_limit();
            }
        }
    }

    fn cache_key(
        &self,
        key: &mut String,
        domain: &str,
        root: Option<&Level>,
        descriptor: &Descriptor,
        source: Source,
        start: u64,
    ) {
        key.push_str(&self.settings.cache_key_prefix);
        key.push_str(domain);
        key.push('_');
        let per_level = match source {
            Source::Node(id) => self
                .rules
                .node(id)
                .per_level_cache_key
                .then_some(root)
                .flatten(),
            Source::Override(_) => None,
        };
        match per_level {
            Some(root) => {
                self.rules
                    .find(root, &descriptor.entries, |entry, node, kind| {
                        let value = match (&node.value, kind) {
                            (Some(pattern), MatchKind::Wildcard) if node.share_threshold => pattern,
                            _ => entry.value.as_str(),
                        };
                        push_entry(key, &entry.key, value);
                    });
            }
            None => {
                for entry in &descriptor.entries {
                    push_entry(key, &entry.key, &entry.value);
                }
            }
        }
        key.push_str(itoa::Buffer::new().format(start));
    }

    /// The statistics key of a rule whose key carries runtime values.
    fn runtime_stats_key(
        &self,
        domain: &str,
        root: &Level,
        descriptor: &Descriptor,
        leaf: &Node,
    ) -> String {
        let mut key = domain.to_owned();
        self.rules
            .find(root, &descriptor.entries, |entry, node, kind| {
                let shared = node
                    .share_threshold
                    .then_some(node.value.as_deref())
                    .flatten();
                let runtime = (!entry.value.is_empty()).then_some(entry.value.as_str());
                let value = if leaf.detailed_metric {
                    Some(shared.unwrap_or(&entry.value))
                } else {
                    match kind {
                        MatchKind::Exact => node.value.as_deref(),
                        _ if shared.is_some() => shared,
                        _ if node.value_to_metric => runtime,
                        MatchKind::Wildcard => node.value.as_deref(),
                        MatchKind::Default => None,
                    }
                };
                push_key_part(&mut key, &entry.key, value);
            });
        key
    }

    fn applied<'a>(&'a self, limited: &'a Limited) -> Applied<'a> {
        let global_quota = self.settings.quota_mode;
        match limited.source {
            Source::Override(limit) => Applied {
                requests_per_unit: limit.requests_per_unit,
                window: Window::of(limit.unit),
                name: None,
                shadow: false,
                quota: global_quota,
                stats: limited
                    .stats
                    .as_deref()
                    .expect("override limits carry their statistics"),
            },
            Source::Node(id) => {
                let node = self.rules.node(id);
                let limit = node
                    .limit
                    .as_ref()
                    .expect("limited items point at nodes with a limit");
                let Limit::Fixed {
                    window,
                    requests_per_unit,
                } = limit.limit
                else {
                    unreachable!("unlimited rules are never planned as limited")
                };
                Applied {
                    requests_per_unit,
                    window,
                    name: limit.name.as_ref(),
                    shadow: node.shadow_mode,
                    quota: node.quota_mode || global_quota,
                    stats: limited
                        .stats
                        .as_deref()
                        .or(node.stats.as_deref())
                        .expect("nodes with a fixed limit have statistics"),
                }
            }
        }
    }
}

fn push_entry(key: &mut String, entry_key: &str, value: &str) {
    key.push_str(entry_key);
    key.push('_');
    key.push_str(value);
    key.push('_');
}

fn override_stats_key(domain: &str, descriptor: &Descriptor) -> String {
    let mut key = domain.to_owned();
    for entry in &descriptor.entries {
        push_key_part(
            &mut key,
            &entry.key,
            (!entry.value.is_empty()).then_some(entry.value.as_str()),
        );
    }
    key
}

impl PlanBody {
    /// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: given each counter's current
    /// value, which counters to increment. `None` means all: no descriptor would go over.
    /// Otherwise only the ones that would go over are incremented, as upstream does.
    pub(crate) fn counters_to_increment(
        &self,
        engine: &Engine,
        current: &[u64],
    ) -> Option<SmallVec<[bool; 8]>> {
        let mut exceeds: SmallVec<[bool; 8]> = SmallVec::new();
        for item in &self.items {
            if let Item::Limited(limited) = item
                && !limited.cached
            {
                let count = current.get(limited.increment).copied().unwrap_or(0);
                let limit = u64::from(engine.applied(limited).requests_per_unit);
                exceeds.push(count.saturating_add(limited.addend) > limit);
            }
        }
        exceeds.contains(&true).then_some(exceeds)
    }

    /// Leaves out the counters `cache` knows to be over their limit; with `stop`
    /// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), a known one makes every other counter
    /// only checked, as upstream does.
    fn skip_cached(&mut self, cache: &OverLimitCache, stop: bool) {
        let increments = std::mem::take(&mut self.increments);
        let mut kept = Vec::with_capacity(increments.len());
        let mut any_cached = false;
        let mut increments = increments.into_iter();
        for item in &mut self.items {
            if let Item::Limited(limited) = item {
                let increment = increments.next().expect("one increment per limited item");
                if cache.contains(&increment.key, self.now) {
                    limited.cached = true;
                    any_cached = true;
                } else {
                    limited.increment = kept.len();
                    kept.push(increment);
                }
            }
        }
        if any_cached && stop {
            kept.iter_mut().for_each(|increment| increment.hits = 0);
        }
        self.increments = kept;
    }

    pub(crate) fn decide(&self, engine: &Engine, counts: &[u64]) -> Response {
        assert!(
            counts.len() >= self.increments.len(),
            "one count per increment"
        );
        let ratio = engine.settings.near_limit_ratio;
        let mut statuses = Vec::with_capacity(self.items.len());
        let (mut over_non_quota, mut quota, mut quota_over) = (false, 0usize, 0usize);
        for item in &self.items {
            let (status, is_quota) = match item {
                Item::NoLimit { quota } => (DescriptorStatus::NO_LIMIT, *quota),
                Item::Unlimited { node } => (
                    DescriptorStatus {
                        limit_remaining: u32::MAX,
                        metadata: engine.rules.node(*node).metadata.clone(),
                        ..DescriptorStatus::NO_LIMIT
                    },
                    engine.rules.node(*node).quota_mode || engine.settings.quota_mode,
                ),
                Item::Limited(limited) => {
                    let applied = engine.applied(limited);
                    let reset = applied.window.until_reset(self.now);
                    let mut status = if limited.cached {
                        cached_over_limit(&applied, limited.addend, reset)
                    } else {
                        let after = counts[limited.increment];
                        let status = count_hits(&applied, limited.addend, after, ratio, reset);
                        if let (Some(cache), Some(counter)) =
                            (&engine.local_cache, self.increments.get(limited.increment))
                            && after > u64::from(applied.requests_per_unit)
                        {
                            cache.insert(&counter.key, counter.window_end, self.now);
                        }
                        status
                    };
                    if let Source::Node(id) = limited.source {
                        status.metadata.clone_from(&engine.rules.node(id).metadata);
                    }
                    (status, applied.quota)
                }
            };
            if is_quota {
                quota += 1;
                quota_over += usize::from(status.code == Code::OverLimit);
            } else {
                over_non_quota |= status.code == Code::OverLimit;
            }
            statuses.push(status);
        }
        let mut overall = if over_non_quota || (quota > 0 && quota_over == quota) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        if overall == Code::OverLimit && engine.settings.shadow_mode {
            engine.global_shadow.add(1);
            overall = Code::Ok;
        }
        Response {
            overall_code: overall,
            headers: RateLimitHeaders::for_statuses(&statuses),
            statuses,
        }
    }
}

/// The status of a descriptor whose counter the local cache knows to be over its limit.
fn cached_over_limit(applied: &Applied<'_>, addend: u64, reset: u64) -> DescriptorStatus {
    let stats = applied.stats;
    stats.total_hits.add(addend);
    stats.over_limit.add(addend);
    stats.over_limit_with_local_cache.add(addend);
    let code = if applied.shadow {
        stats.shadow_mode.add(addend);
        Code::Ok
    } else {
        Code::OverLimit
    };
    applied.status(code, 0, reset)
}

/// The status of one limited descriptor and its statistics, from the counter after the
/// hits were added. Hits that straddle the limit are split between `near_limit` and
/// `over_limit` as envoyproxy/ratelimit splits them.
fn count_hits(
    applied: &Applied<'_>,
    addend: u64,
    after: u64,
    ratio: f32,
    reset: u64,
) -> DescriptorStatus {
    let limit = u64::from(applied.requests_per_unit);
    let near = (applied.requests_per_unit as f32 * ratio).floor() as u64;
    let before = after.saturating_sub(addend);
    let stats = applied.stats;
    stats.total_hits.add(addend);
    let (code, remaining) = if after > limit {
        let over = if before >= limit {
            addend
        } else {
            stats.near_limit.add(limit - near.max(before));
            after - limit
        };
        stats.over_limit.add(over);
        if applied.shadow {
            stats.shadow_mode.add(over);
            (Code::Ok, 0)
        } else {
            (Code::OverLimit, 0)
        }
    } else {
        if after > near {
            stats
                .near_limit
                .add(if before >= near { addend } else { after - near });
        }
        stats.within_limit.add(addend);
        (Code::Ok, u32::try_from(limit - after).unwrap_or(u32::MAX))
    };
    applied.status(code, remaining, reset)
}
