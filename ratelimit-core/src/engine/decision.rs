//! The decision from the counts: codes, remaining hits, statistics, shadow and quota
//! modes, the local over-limit cache and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.

use std::ops::Range;

use smallvec::SmallVec;

use super::status::{
    cached_over_limit, count_hits, decides_over, direct_status, overall_code, refund_status,
};
use super::{Applied, Direct, Increment, Item, Limited, PlanBody, Source};
use crate::counting::Counting;
use crate::counting::local_cache::OverLimitCache;
use crate::engine::Engine;
use crate::model::response::Policy;
use crate::model::response::{Code, DescriptorStatus, RateLimitHeaders, Response, Statuses};

impl PlanBody {
    /// Every limit of the plan is shared among `deciders`.
    pub(crate) fn share_among(&mut self, deciders: u32) {
        for item in &mut self.items {
            if let Item::Limited(limited) = item {
                limited.divisor = deciders.max(1);
            }
        }
    }

    /// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: given each counter's current
    /// value, which counters to increment. `None` means all: no descriptor would go over.
    /// Otherwise only the ones that would go over are incremented, as upstream does.
    pub(crate) fn counters_to_increment(
        &self,
        engine: &Engine,
        current: &[u64],
    ) -> Option<SmallVec<[bool; 8]>> {
        let mut exceeds: SmallVec<[bool; 8]> = SmallVec::new();
        let mut any = false;
        for item in &self.items {
            if let Item::Limited(limited) = item
                && !limited.cached
            {
                if limited.refund {
                    // A refund is never held back (nor does it hold others back).
                    exceeds.extend(std::iter::repeat_n(true, limited.counters));
                    continue;
                }
                let applied = engine.applied(limited);
                let totals = current
                    .get(limited.increment..limited.increment + limited.counters)
                    .unwrap_or_default();
                let over =
                    applied
                        .counting
                        .exceeds(totals, limited.addend, applied.bound, self.now_ms);
                any |= over;
                exceeds.extend(std::iter::repeat_n(over, limited.counters));
            }
        }
        any.then_some(exceeds)
    }

    /// Leaves out the counters `cache` knows to be over their limit; with `stop`
    /// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), a known one makes every other counter
    /// only checked, as upstream does.
    pub(super) fn skip_cached(&mut self, cache: &OverLimitCache, stop: bool) {
        // In place: the counters kept move down over the ones left out, which are
        // dropped at the end, so the list's room is the one the plan was made in.
        let (mut read, mut kept, mut any_cached) = (0, 0, false);
        let increments = &mut self.increments;
        for item in &mut self.items {
            let Item::Limited(limited) = item else {
                continue;
            };
            let own = read..read + limited.counters;
            read = own.end;
            // The local cache knows a limit by its first counter. A refund is always
            // run, and the counter it lowers is no longer known to be over.
            let first = (!own.is_empty()).then(|| increments[own.start].key.as_str());
            if limited.refund {
                first.inspect(|key| cache.remove(key));
            } else if first.is_some_and(|key| cache.contains(key, self.now_ms / 1_000)) {
                limited.cached = true;
                any_cached = true;
                continue;
            }
            limited.increment = kept;
            for at in own {
                increments.swap(kept, at);
                kept += 1;
            }
        }
        increments.truncate(kept);
        if any_cached && stop {
            increments
                .iter_mut()
                .filter(|increment| !increment.op.is_refund())
                .for_each(|increment| increment.hits = 0);
        }
    }

    pub(crate) fn decide(&self, engine: &Engine, counts: &[u64]) -> Response {
        assert!(
            counts.len() >= self.increments.len(),
            "one count per increment"
        );
        let mut statuses = Statuses::with_capacity(self.items.len());
        let mut policies = Vec::new();
        let mut quotas: SmallVec<[bool; 4]> = SmallVec::new();
        // Where the next item planned in one pass has its counters.
        let mut direct_at = 0;
        for item in &self.items {
            let (status, is_quota) = match item {
                Item::Direct(direct) => {
                    let own = direct_at..direct_at + usize::from(direct.counters);
                    direct_at = own.end;
                    self.direct_status_of(engine, direct, own, counts)
                }
                Item::NoLimit { quota } => (DescriptorStatus::NO_LIMIT, *quota),
                // Unlimited is neither a quota descriptor nor a passed one, whatever the
                // quota modes say: it counts for nothing and contributes no metadata.
                Item::Unlimited { .. } => (DescriptorStatus::UNLIMITED, false),
                Item::Limited(limited) => {
                    let applied = engine.applied(limited);
                    let mut status = self.status_of(engine, limited, &applied, counts);
                    if let Source::Node(id, _) = limited.source {
                        status.metadata.clone_from(&engine.rules.node(id).metadata);
                    }
                    if engine.settings.report_policies {
                        policies.push(engine.policy(limited, &applied, &status));
                    }
                    if limited.follows
                        && let Some(previous) = statuses.last_mut()
                    {
                        // Another limit of the same descriptor: the status reports the
                        // one that decided.
                        if decides_over(&status, previous) {
                            *previous = status;
                        }
                        continue;
                    }
                    (status, applied.quota)
                }
            };
            statuses.push(status);
            quotas.push(is_quota);
        }
        Response {
            overall_code: overall_code(engine, &statuses, &quotas, self.dry),
            headers: RateLimitHeaders::choose(&statuses, |i| quotas[i]),
            statuses,
            policies,
        }
    }
}

impl PlanBody {
    /// The status of `limited`, counting its statistics, from the plan's `counts`.
    fn status_of(
        &self,
        engine: &Engine,
        limited: &Limited,
        applied: &Applied<'_>,
        counts: &[u64],
    ) -> DescriptorStatus {
        if limited.cached {
            let reset = applied.counting.assess(&[], 0, 0, self.now_ms).reset;
            return cached_over_limit(applied, limited.addend, reset);
        }
        let totals = &counts[limited.increment..limited.increment + limited.counters];
        let assessed = applied
            .counting
            .assess(totals, limited.addend, applied.bound, self.now_ms);
        if limited.refund {
            return refund_status(applied, limited.addend, assessed);
        }
        let ratio = engine.settings.near_limit_ratio;
        let status = count_hits(applied, limited.addend, assessed, ratio);
        let first = self.increments.get(limited.increment);
        self.observe(engine, first, applied, assessed.after);
        status
    }

    /// The status of a descriptor planned in one pass, whose counters are `own`, counting
    /// its statistics, and whether it is in quota mode.
    fn direct_status_of(
        &self,
        engine: &Engine,
        direct: &Direct,
        own: Range<usize>,
        counts: &[u64],
    ) -> (DescriptorStatus, bool) {
        let (node, applied) = engine.direct_limit(direct.node);
        let first = self.increments.get(own.start);
        let totals = &counts[own];
        let (status, after) =
            direct_status(engine, node, &applied, direct.addend, totals, self.now_ms);
        self.observe(engine, first, &applied, after);
        (status, applied.quota)
    }

    /// After a counted request: offers the first counter of a limit, `applied`, which
    /// reached `after`, to the nearest-counters list and, when a fixed window went over
    /// its bound, to the local over-limit cache.
    fn observe(
        &self,
        engine: &Engine,
        first: Option<&Increment>,
        applied: &Applied<'_>,
        after: u64,
    ) {
        let Some(counter) = first else {
            return;
        };
        if self.dry {
            return;
        }
        let bound = u32::try_from(applied.bound).unwrap_or(u32::MAX);
        let nearest = engine.stats.nearest();
        nearest.observe(&counter.key, after, bound, counter.window_end);
        if let Some(cache) = &engine.local_cache
            && after > applied.bound
            && matches!(applied.counting, Counting::FixedWindow(_))
        {
            cache.insert(&counter.key, counter.window_end, self.now_ms / 1_000);
        }
    }
}

impl Engine {
    /// The limit `limited` as a `RateLimit-Policy` entry, with its `status`.
    fn policy(
        &self,
        limited: &Limited,
        applied: &Applied<'_>,
        status: &DescriptorStatus,
    ) -> Policy {
        let name = match (applied.name, limited.source) {
            (Some(name), _) => name.to_string(),
            (None, Source::Node(id, which)) => {
                let node = self.rules.node(id);
                format!(
                    "{}{}",
                    node.full_key,
                    node.limits[usize::from(which)].stats_suffix
                )
            }
            (None, Source::Override(_)) => "override".to_owned(),
        };
        Policy {
            name,
            quota: u64::from(applied.requests_per_unit),
            window: applied.window.seconds(),
            remaining: u64::from(status.limit_remaining),
            reset: status.duration_until_reset.unwrap_or(0),
            over: status.code == Code::OverLimit,
        }
    }
}
