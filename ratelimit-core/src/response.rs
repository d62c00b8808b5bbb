//! What the engine answers: the core's own form of Envoy's `RateLimitResponse`.

use std::sync::Arc;

use crate::config::Metadata;
use crate::unit::Unit;

/// A decision code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    /// Within the limit (or not limited).
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The limit a descriptor was checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    /// Hits allowed per window.
    pub requests_per_unit: u32,
    /// The window unit.
    pub unit: Unit,
    /// The rule's `name`, when it has one.
    pub name: Option<Arc<str>>,
}

/// The decision for one descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct DescriptorStatus {
    /// `Ok` or `OverLimit` (shadow-mode rules always answer `Ok`).
    pub code: Code,
    /// The limit applied; `None` when nothing matched, the rule whitelists, is unlimited or
    /// was replaced.
    pub current_limit: Option<CurrentLimit>,
    /// Hits left in the window; `u32::MAX` for unlimited rules, 0 when nothing applies.
    pub limit_remaining: u32,
    /// Seconds until the window ends, when a limit applies.
    pub duration_until_reset: Option<u64>,
    /// The `metadata` of the rule that applied, if it has any.
    pub metadata: Option<Arc<Metadata>>,
}

impl DescriptorStatus {
    /// The status of a descriptor no limit applies to.
    pub const NO_LIMIT: DescriptorStatus = DescriptorStatus {
        code: Code::Ok,
        current_limit: None,
        limit_remaining: 0,
        duration_until_reset: None,
        metadata: None,
    };
}

/// Values for the `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitHeaders {
    /// `RateLimit-Limit`: the chosen descriptor's requests per unit.
    pub limit: u32,
    /// `RateLimit-Remaining`: its hits left.
    pub remaining: u32,
    /// `RateLimit-Reset`: seconds until its window ends.
    pub reset: u64,
}

impl RateLimitHeaders {
    /// The header values for a request's statuses, local or from a remote service: the
    /// last descriptor over its limit, else the limited one with the fewest hits left;
    /// `None` when no limit applied.
    pub fn for_statuses(statuses: &[DescriptorStatus]) -> Option<RateLimitHeaders> {
        let mut chosen: Option<RateLimitHeaders> = None;
        let mut over: Option<RateLimitHeaders> = None;
        for status in statuses {
            let (Some(limit), Some(reset)) = (&status.current_limit, status.duration_until_reset)
            else {
                continue;
            };
            let headers = RateLimitHeaders {
                limit: limit.requests_per_unit,
                remaining: status.limit_remaining,
                reset,
            };
            if status.code == Code::OverLimit {
                over = Some(headers);
            }
            if chosen.is_none_or(|c| headers.remaining < c.remaining) {
                chosen = Some(headers);
            }
        }
        over.or(chosen)
    }
}

/// The decision for a whole request.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// `OverLimit` when any descriptor is over its limit (unless global shadow mode is on).
    pub overall_code: Code,
    /// One status per request descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
    /// Header values, from the most restrictive limited descriptor; `None` when no limit
    /// applied.
    pub headers: Option<RateLimitHeaders>,
}
