//! A descriptor's status from its counter: its hits counted against its limit (within,
//! near, over, shadow mode), refunds, the local cache's over-limit answer, and the
//! request's overall code. The one-pass decision ([`super::direct`]), the plan's
//! ([`super::decision`]) and the prepared check share these, so that every road answers
//! and counts alike.

use super::Applied;
use crate::counting::Assessed;
use crate::engine::Engine;
use crate::model::response::{Code, DescriptorStatus};
use crate::rules::Node;
use crate::stats::RuleStats;

/// The status of a descriptor that matched `node`'s one plain limit, `applied`, counting
/// its statistics, from its counters' `totals` after `addend` hits; and the count the
/// limit reached.
#[inline(always)]
pub(super) fn direct_status(
    engine: &Engine,
    node: &Node,
    applied: &Applied<'_>,
    addend: u64,
    totals: &[u64],
    now_ms: u64,
) -> (DescriptorStatus, u64) {
    let assessed = applied
        .counting
        .assess(totals, addend, applied.bound, now_ms);
    let mut status = count_hits(applied, addend, assessed, engine.settings.near_limit_ratio);
    status.metadata.clone_from(&node.metadata);
    (status, assessed.after)
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
