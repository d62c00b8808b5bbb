//! The counter work of a grant, run through the service's plan execution (a remote
//! store's deadline, breakers and error statistic, as for ShouldRateLimit): reserving
//! quota in the window's counter, giving it back, marking the window skewed, and
//! counting a shadow rule's usage. What to ask for is the core's
//! ([`ratelimit_core::grants`]).

use ratelimit_core::grants::Ask;
use ratelimit_core::{CounterOp, Increment, QuotaLimit};

use super::Shared;

/// Runs `ask` for an Envoy whose report showed `denied` requests; what was reserved or
/// given back (0 when the store did not answer).
pub async fn run(shared: &Shared, bucket: &str, limit: &QuotaLimit, ask: Ask, denied: bool) -> u64 {
    let skew = limit.skewed(u64::from(denied));
    match ask {
        Ask::Keep => {
            if denied {
                counters(shared, bucket, limit, vec![skew]).await;
            }
            0
        }
        Ask::Reserve(want) => {
            let mut ops = vec![limit.quota(CounterOp::Add, want)];
            if denied {
                ops.push(skew);
            }
            let Some(totals) = counters(shared, bucket, limit, ops).await else {
                return 0;
            };
            let over = totals[0].saturating_sub(u64::from(limit.requests_per_unit));
            let got = want - want.min(over);
            if got < want {
                // What did not fit goes back, or it would keep others from quota that a
                // release frees.
                let back = limit.quota(CounterOp::Refund, want - got);
                counters(shared, bucket, limit, vec![back]).await;
            }
            got
        }
        Ask::Release { now, skewed } => release(shared, bucket, limit, now, skewed).await,
    }
}

/// Gives back `now`, and `skewed` more when the window's skew count is above 0.
async fn release(shared: &Shared, bucket: &str, limit: &QuotaLimit, now: u64, skewed: u64) -> u64 {
    let mut ops = Vec::with_capacity(2);
    if skewed > 0 {
        ops.push(limit.skewed(0));
    }
    if now > 0 {
        ops.push(limit.quota(CounterOp::Refund, now));
    }
    let Some(totals) = counters(shared, bucket, limit, ops).await else {
        return 0;
    };
    if skewed == 0 || totals[0] == 0 {
        return now;
    }
    let more = vec![limit.quota(CounterOp::Refund, skewed)];
    match counters(shared, bucket, limit, more).await {
        Some(_) => now + skewed,
        None => now,
    }
}

/// Gives `unspent` back to the window's counter (an Envoy left); whether it went back.
pub async fn give_back(shared: &Shared, bucket: &str, limit: &QuotaLimit, unspent: u64) -> bool {
    if unspent == 0 {
        return false;
    }
    let back = limit.quota(CounterOp::Refund, unspent);
    counters(shared, bucket, limit, vec![back]).await.is_some()
}

/// Shadow mode: usage is counted in the rule's counter, and what went past the limit in
/// the statistics; nothing is enforced.
pub async fn count_shadow(shared: &Shared, bucket: &str, limit: &QuotaLimit, used: (u64, u64)) {
    let (allowed, denied) = used;
    if allowed == 0 && denied == 0 {
        return;
    }
    let add = vec![limit.quota(CounterOp::Add, allowed)];
    let over = match counters(shared, bucket, limit, add).await {
        Some(totals) => {
            let before = totals[0].saturating_sub(allowed);
            allowed - allowed.min(u64::from(limit.requests_per_unit).saturating_sub(before))
        }
        None => 0,
    };
    limit.count_usage(allowed, denied, over);
}

/// The totals of `ops`, or `None` (counted and logged) when the store did not answer.
async fn counters(
    shared: &Shared,
    bucket: &str,
    limit: &QuotaLimit,
    ops: Vec<Increment>,
) -> Option<Vec<u64>> {
    let mut plan = limit.plan(ops);
    match shared.service.run_counters(&mut plan).await {
        Ok(totals) => Some(totals.into_vec()),
        Err(error) => {
            shared.stats.reserve_failed.add(1);
            tracing::warn!(%error, %bucket, "RLQS quota counter not updated");
            None
        }
    }
}
