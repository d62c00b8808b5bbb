//! What one Envoy is assigned for one bucket, and the actions that tell it.
//!
//! A limited bucket's window quota is reserved in the rule's counter (in the backend, so
//! that every replica sharing it agrees): each Envoy is granted its share of the limit
//! (by recent demand), and what the counter cannot give any more is not granted. Envoy
//! enforces a grant as a token bucket that holds exactly the unused part and does not
//! refill by itself; the service refills it at each window and when it grants more.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use ratelimit_core::grants::{self, Holding};

/// How an Envoy's bucket is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// Every request allowed, or every request denied.
    Blanket(BlanketRule),
    /// At most this many more requests, until the service says otherwise.
    Tokens(u32),
}

/// One Envoy's state for one bucket.
#[derive(Debug, Default)]
pub struct Grant {
    /// The window the grant is for (unix milliseconds at which it ends).
    pub window_end_ms: u64,
    /// Quota reserved for this Envoy in the window, and what it reported used.
    pub holding: Holding,
    /// Requests (allowed and denied) it reported in the window, since `since_ms`.
    pub requested: u64,
    pub since_ms: u64,
    /// Its last report of the bucket (unix milliseconds), and that report's requests
    /// (allowed and denied) and the time they took.
    pub reported_ms: u64,
    pub last_rate: (u64, u64),
    /// The limit the grant was made under.
    pub requests_per_unit: Option<u32>,
    /// The assignment last sent.
    pub sent: Option<Assignment>,
    /// It started short of its even share: the others are asked to give back.
    pub short: bool,
}

impl Grant {
    /// Starts the window ending at `window_end_ms` at `now_ms` when it is not the current
    /// one; `true` when it started.
    pub fn enter_window(&mut self, window_end_ms: u64, now_ms: u64) -> bool {
        if self.window_end_ms == window_end_ms {
            return false;
        }
        self.window_end_ms = window_end_ms;
        self.holding = Holding::default();
        self.requested = 0;
        self.since_ms = now_ms;
        true
    }

    /// Counts a report of `allowed` and `denied` requests over `elapsed_ms` at `now_ms`.
    pub fn report(&mut self, allowed: u64, denied: u64, elapsed_ms: u64, now_ms: u64) {
        self.holding.used = self.holding.used.saturating_add(allowed);
        self.requested = self
            .requested
            .saturating_add(allowed)
            .saturating_add(denied);
        self.reported_ms = now_ms;
        self.last_rate = (allowed.saturating_add(denied), elapsed_ms);
    }

    /// Demand over the rest of the window at `now_ms`: the rate of the last report
    /// (`requests` in `elapsed_ms`) or of the window so far, whichever is higher.
    pub fn need(&self, requests: u64, elapsed_ms: u64, now_ms: u64) -> u64 {
        let left = self.window_end_ms.saturating_sub(now_ms);
        let window = now_ms.saturating_sub(self.since_ms).max(elapsed_ms);
        grants::need(requests, elapsed_ms, left).max(grants::need(self.requested, window, left))
    }

    /// What its Envoy is projected to have admitted in the window from its last report to
    /// `at_ms`: the last report's rate (requests allowed and denied over the time they
    /// took) over that time. A bucket's first report has no rate (Envoy says 0 s; it is
    /// taken as one request in 5 s), so what an Envoy admits in its first seconds on a
    /// bucket is projected as next to nothing.
    pub fn spent(&self, at_ms: u64) -> u64 {
        let since = at_ms.saturating_sub(self.reported_ms.max(self.since_ms));
        grants::need(self.last_rate.0, self.last_rate.1, since)
    }

    /// What is surely unspent at `at_ms` (now, or when its assignment expires): the grant
    /// less what was reported used, less what it is projected to have admitted since.
    pub fn unspent(&self, at_ms: u64) -> u64 {
        self.holding
            .granted
            .saturating_sub(self.holding.used)
            .saturating_sub(self.spent(at_ms))
    }
}

/// The actions that make `bucket` hold `assignment` for `ttl`: `fresh` starts a new
/// token bucket full (Envoy keeps an identical one as it is, so a refill goes through a
/// blanket rule first, in the same response).
pub fn actions(
    bucket: &BucketId,
    assignment: Assignment,
    fresh: bool,
    ttl: Duration,
) -> Vec<BucketAction> {
    let assign = |strategy| BucketAction {
        bucket_id: Some(bucket.clone()),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(duration(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    };
    match assignment {
        Assignment::Blanket(rule) => vec![assign(Strategy::BlanketRule(rule as i32))],
        Assignment::Tokens(tokens) => {
            let bucket = Strategy::TokenBucket(TokenBucket {
                max_tokens: tokens,
                // Envoy's bucket refills continuously; one token a day is as close to
                // never as its configuration allows.
                tokens_per_fill: Some(UInt32Value { value: 1 }),
                fill_interval: Some(duration(Duration::from_secs(86_400))),
            });
            let mut out = Vec::with_capacity(2);
            if fresh {
                out.push(assign(Strategy::BlanketRule(BlanketRule::DenyAll as i32)));
            }
            out.push(assign(bucket));
            out
        }
    }
}

/// The action that tells Envoy a bucket is no longer configured.
pub fn abandon(bucket: &BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket.clone()),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

fn duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_window_starts_a_grant_afresh() {
        let mut grant = Grant::default();
        assert!(grant.enter_window(60_000, 0));
        assert!(!grant.enter_window(60_000, 1));
        grant.holding.granted = 10;
        grant.report(4, 2, 5_000, 10_000);
        assert_eq!(grant.requested, 6);
        assert!(grant.enter_window(120_000, 60_000));
        assert_eq!((grant.holding, grant.requested), (Holding::default(), 0));
    }

    #[test]
    fn demand_is_the_higher_of_the_last_report_and_the_window_rates() {
        let mut grant = Grant::default();
        grant.enter_window(60_000, 0);
        grant.report(10, 0, 5_000, 10_000);
        // 10 in 10 s of window; the last report's 10 in 5 s is twice that: 2/s for 50 s.
        assert_eq!(grant.need(10, 5_000, 10_000), 100);
        assert_eq!(grant.need(0, 5_000, 10_000), 50);
        grant.holding.granted = 30;
        // Reported 10 used; at the last report's 2/s, 10 more spent in the 5 s since.
        assert_eq!(grant.spent(15_000), 10);
        assert_eq!(grant.unspent(15_000), 10);
        // And 20 more by 25 s: nothing is surely left then.
        assert_eq!(grant.unspent(25_000), 0);
    }

    #[test]
    fn spending_is_projected_from_the_last_report_within_the_window() {
        let mut grant = Grant::default();
        grant.enter_window(60_000, 0);
        grant.report(10, 0, 5_000, 50_000);
        // The next window started at 60 s, before any report in it: what was admitted
        // before it is not this window's.
        assert!(grant.enter_window(120_000, 60_000));
        assert_eq!(grant.spent(61_000), 2);
        // A bucket's first report: one request, its time taken as 5 s.
        let mut first = Grant::default();
        first.enter_window(60_000, 0);
        first.report(1, 0, 5_000, 0);
        assert_eq!(first.spent(1_000), 0);
    }

    #[test]
    fn a_fresh_bucket_goes_through_a_blanket_rule_in_the_same_response() {
        let id = BucketId::default();
        let ttl = Duration::from_secs(15);
        let strategies = |actions: Vec<BucketAction>| -> Vec<Strategy> {
            actions
                .into_iter()
                .map(|a| match a.bucket_action {
                    Some(Action::QuotaAssignmentAction(q)) => {
                        assert_eq!(q.assignment_time_to_live.unwrap().seconds, 15);
                        q.rate_limit_strategy.unwrap().strategy.unwrap()
                    }
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let fresh = strategies(actions(&id, Assignment::Tokens(7), true, ttl));
        assert_eq!(fresh.len(), 2);
        assert_eq!(fresh[0], Strategy::BlanketRule(BlanketRule::DenyAll as i32));
        let Strategy::TokenBucket(bucket) = &fresh[1] else {
            panic!("{fresh:?}")
        };
        assert_eq!(bucket.max_tokens, 7);
        assert_eq!(
            strategies(actions(&id, Assignment::Tokens(7), false, ttl)).len(),
            1
        );
        assert_eq!(
            strategies(actions(
                &id,
                Assignment::Blanket(BlanketRule::AllowAll),
                true,
                ttl
            )),
            [Strategy::BlanketRule(BlanketRule::AllowAll as i32)]
        );
    }
}
