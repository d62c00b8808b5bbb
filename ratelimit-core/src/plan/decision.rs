//! The decision from the counts: codes, remaining hits, statistics, shadow and quota
//! modes, the local over-limit cache and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.

use std::ops::Range;

use smallvec::SmallVec;

use super::direct::direct_status;
use super::{Applied, Direct, Increment, Item, Limited, PlanBody, Source};
use crate::counting::{Assessed, Counting};
use crate::engine::Engine;
use crate::local_cache::OverLimitCache;
use crate::response::Policy;
use crate::response::{Code, DescriptorStatus, RateLimitHeaders, Response, Statuses};
use crate::stats::RuleStats;

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

/// The request's code from its descriptors' statuses and whether each is in quota mode:
/// over the limit when a descriptor not in quota mode is, or when every one in quota mode
/// is; `Ok` in global shadow mode, which counts it unless `dry`.
pub(super) fn overall_code(
    engine: &Engine,
    statuses: &[DescriptorStatus],
    quotas: &[bool],
    dry: bool,
) -> Code {
    let (mut over_non_quota, mut quota, mut quota_over) = (false, 0usize, 0usize);
    for (status, &is_quota) in statuses.iter().zip(quotas) {
        if is_quota {
            quota += 1;
            quota_over += usize::from(status.code == Code::OverLimit);
        } else {
            over_non_quota |= status.code == Code::OverLimit;
        }
    }
    let over = over_non_quota || (quota > 0 && quota_over == quota);
    if over {
        code_when_over(engine, dry)
    } else {
        Code::Ok
    }
}

/// The code of a request over its limits: `Ok` in global shadow mode, which counts it
/// unless `dry`.
#[inline]
pub(super) fn code_when_over(engine: &Engine, dry: bool) -> Code {
    if !engine.settings.shadow_mode {
        return Code::OverLimit;
    }
    if !dry {
        engine.global_shadow.add(1);
    }
    Code::Ok
}

/// Whether `candidate` rather than `current` reports a descriptor with several limits: an
/// over-limit one first, otherwise the one with the fewest hits remaining.
pub(super) fn decides_over(candidate: &DescriptorStatus, current: &DescriptorStatus) -> bool {
    match (candidate.code, current.code) {
        (Code::OverLimit, Code::OverLimit) => false,
        (Code::OverLimit, _) => true,
        (_, Code::OverLimit) => false,
        _ => candidate.limit_remaining < current.limit_remaining,
    }
}

/// The status of a descriptor whose counter the local cache knows to be over its limit.
pub(super) fn cached_over_limit(
    applied: &Applied<'_>,
    addend: u64,
    reset: u64,
) -> DescriptorStatus {
    let stats = applied.stats;
    stats.add_not_within(addend);
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

/// The status of a descriptor whose hits were a refund, from the counters after it: `Ok`
/// with what is left, whatever the count; the hits count only in `total_negative_hits`,
/// never as hits, over or near the limit (as upstream's main counts them).
pub(super) fn refund_status(
    applied: &Applied<'_>,
    addend: u64,
    assessed: Assessed,
) -> DescriptorStatus {
    applied.stats.total_negative_hits.add(addend);
    let remaining = applied.bound.saturating_sub(assessed.after);
    let remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
    applied.status(Code::Ok, remaining, assessed.reset)
}

/// The status of one limited descriptor and its statistics, from the counter after the
/// hits were added. Hits that straddle the limit are split between `near_limit` and
/// `over_limit` as envoyproxy/ratelimit splits them.
pub(super) fn count_hits(
    applied: &Applied<'_>,
    addend: u64,
    assessed: Assessed,
    ratio: f32,
) -> DescriptorStatus {
    let limit = applied.bound;
    let near = near_limit(limit, ratio);
    let (code, remaining) = tally(
        applied.stats,
        applied.shadow,
        (limit, near),
        addend,
        assessed.after,
    );
    applied.status(code, remaining, assessed.reset)
}

/// The count from which hits are near `limit`: its `ratio`, rounded down.
pub(super) fn near_limit(limit: u64, ratio: f32) -> u64 {
    // Truncation is the floor of a non-negative number (and a cast saturates).
    (limit as f32 * ratio) as u64
}

/// The code and hits remaining of a limit (`bounds`: its bound and [`near_limit`]) whose
/// count is `after` once `addend` hits are added, and their statistics.
#[inline]
pub(super) fn tally(
    stats: &RuleStats,
    shadow: bool,
    (limit, near): (u64, u64),
    addend: u64,
    after: u64,
) -> (Code, u32) {
    let before = after.saturating_sub(addend);
    if after > limit {
        stats.add_not_within(addend);
        let over = if before >= limit {
            addend
        } else {
            stats.near_limit.add(limit - near.max(before));
            after - limit
        };
        stats.over_limit.add(over);
        if shadow {
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
    }
}
