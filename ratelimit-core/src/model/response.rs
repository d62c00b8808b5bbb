//! What the engine answers: the core's own form of Envoy's `RateLimitResponse`.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::model::request::Request;
use crate::rules::config::Metadata;
use crate::rules::unit::Unit;

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

    /// The status of a descriptor whose rule is `unlimited`: no limit, every hit left.
    pub const UNLIMITED: DescriptorStatus = DescriptorStatus {
        limit_remaining: u32::MAX,
        ..DescriptorStatus::NO_LIMIT
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
    /// The header values for a request's statuses read back from another rate-limit
    /// service, which does not say which descriptors were in quota mode: [`Self::choose`]
    /// with none in quota mode.
    pub fn for_statuses(statuses: &[DescriptorStatus]) -> Option<RateLimitHeaders> {
        Self::choose(statuses, |_| false)
    }

    /// The header values for a request's statuses, where `is_quota(i)` says whether
    /// descriptor `i` is in quota mode, as envoyproxy/ratelimit chooses them: the limited
    /// descriptor with the fewest hits left (the first of equals); but a descriptor not
    /// in quota mode that is over its limit always wins, the last of them. Quota
    /// descriptors compete only by what they have left. `None` when no limit applied.
    pub fn choose(
        statuses: &[DescriptorStatus],
        is_quota: impl Fn(usize) -> bool,
    ) -> Option<RateLimitHeaders> {
        let mut chosen: Option<RateLimitHeaders> = None;
        let mut least = u32::MAX;
        for (i, status) in statuses.iter().enumerate() {
            let (Some(limit), Some(reset)) = (&status.current_limit, status.duration_until_reset)
            else {
                continue;
            };
            let headers = RateLimitHeaders {
                limit: limit.requests_per_unit,
                remaining: status.limit_remaining,
                reset,
            };
            // The first limited status is a candidate even with 2^32 - 1 left (upstream
            // starts from that value with a strict comparison, and then sends no headers).
            if chosen.is_none() || status.limit_remaining < least {
                (chosen, least) = (Some(headers), status.limit_remaining);
            }
            if status.code == Code::OverLimit && !is_quota(i) {
                (chosen, least) = (Some(headers), 0);
            }
        }
        chosen
    }
}

/// One limit that applied to a request, for `RateLimit-Policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The limit's `name`, or its rule's statistics key.
    pub name: String,
    /// `requests_per_unit`.
    pub quota: u64,
    /// The window, in seconds.
    pub window: u64,
    /// Hits (or tokens) left.
    pub remaining: u64,
    /// Seconds until the count goes down or one more request fits.
    pub reset: u64,
    /// It was over its limit.
    pub over: bool,
}

impl Policy {
    /// One policy per limited status, for a response that only has statuses (one read
    /// back from another rate-limit service): each descriptor's deciding limit, named
    /// by its `name` or its position, with a window of one unit.
    pub fn from_statuses(statuses: &[DescriptorStatus]) -> Vec<Policy> {
        statuses
            .iter()
            .enumerate()
            .filter_map(|(i, status)| {
                let limit = status.current_limit.as_ref()?;
                Some(Policy {
                    name: limit
                        .name
                        .as_deref()
                        .map_or_else(|| format!("descriptor{i}"), str::to_owned),
                    quota: u64::from(limit.requests_per_unit),
                    window: limit.unit.seconds(),
                    remaining: u64::from(status.limit_remaining),
                    reset: status.duration_until_reset.unwrap_or(0),
                    over: status.code == Code::OverLimit,
                })
            })
            .collect()
    }
}

/// Names of the `RateLimit-*` headers (`LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`,
/// `LIMIT_RESET_HEADER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    /// The limit header.
    pub limit: String,
    /// The remaining header.
    pub remaining: String,
    /// The reset header.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> HeaderNames {
        HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

impl RateLimitHeaders {
    /// The three headers, named by `names`, in limit, remaining, reset order.
    pub fn pairs<'a>(&self, names: &'a HeaderNames) -> [(&'a str, String); 3] {
        [
            (names.limit.as_str(), self.limit.to_string()),
            (names.remaining.as_str(), self.remaining.to_string()),
            (names.reset.as_str(), self.reset.to_string()),
        ]
    }
}

/// When a request that was over its limit may be sent again, unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// After this many seconds, when every limit it went over has reset.
    After(u64),
    /// Never: it asks for more hits at once than some limit allows per window.
    Never,
}

impl Response {
    /// The answer to `request` when no limit could be checked and the caller's failure
    /// mode allows it (`allow`): `Ok`, with every descriptor `Ok` and no limit.
    pub fn allowed_without_limits(request: &Request) -> Response {
        Response {
            overall_code: Code::Ok,
            statuses: Statuses::from_elem(DescriptorStatus::NO_LIMIT, request.descriptors.len()),
            headers: None,
            policies: Vec::new(),
        }
    }

    /// `None` when `request` was allowed; otherwise when it may be retried (the
    /// `Retry-After` of an HTTP 429).
    pub fn retry(&self, request: &Request) -> Option<Retry> {
        if self.overall_code == Code::Ok {
            return None;
        }
        let mut after = 0;
        for (status, (_, hits)) in self.statuses.iter().zip(request.descriptor_hits()) {
            let (Code::OverLimit, Some(limit)) = (status.code, &status.current_limit) else {
                continue;
            };
            if hits > u64::from(limit.requests_per_unit) {
                return Some(Retry::Never);
            }
            after = after.max(status.duration_until_reset.unwrap_or(0));
        }
        Some(Retry::After(after))
    }
}

/// One status per descriptor of a request. The first is kept in the response itself,
/// since most requests carry one descriptor; more go to the heap.
pub type Statuses = SmallVec<[DescriptorStatus; 1]>;

/// The decision for a whole request.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// `OverLimit` when any descriptor is over its limit (unless global shadow mode is on).
    pub overall_code: Code,
    /// One status per request descriptor, in request order.
    pub statuses: Statuses,
    /// Header values, from the most restrictive limited descriptor; `None` when no limit
    /// applied.
    pub headers: Option<RateLimitHeaders>,
    /// Every limit that applied, when the limiter reports them
    /// ([`crate::Settings::report_policies`]); empty otherwise.
    pub policies: Vec<Policy>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::request::Descriptor;

    fn over(limit: u32, reset: u64) -> DescriptorStatus {
        DescriptorStatus {
            code: Code::OverLimit,
            current_limit: Some(CurrentLimit {
                requests_per_unit: limit,
                unit: Unit::Minute,
                name: None,
            }),
            limit_remaining: 0,
            duration_until_reset: Some(reset),
            metadata: None,
        }
    }

    #[test]
    fn a_limit_with_every_hit_left_still_reports_headers() {
        let full = DescriptorStatus {
            code: Code::Ok,
            limit_remaining: u32::MAX,
            ..over(u32::MAX, 30)
        };
        let headers = RateLimitHeaders::choose(&[full], |_| false).expect("headers");
        assert_eq!((headers.limit, headers.remaining), (u32::MAX, u32::MAX));
    }

    #[test]
    fn retry_waits_for_every_limit_or_never_comes() {
        let request = Request::new(
            "d",
            vec![
                Descriptor::new([("a", "1")]).with_hits(3),
                Descriptor::new([("b", "1")]).with_hits(3),
            ],
        );
        let mut response = Response {
            overall_code: Code::OverLimit,
            statuses: vec![over(5, 20), over(5, 45)].into(),
            headers: None,
            policies: Vec::new(),
        };
        assert_eq!(response.retry(&request), Some(Retry::After(45)));
        response.statuses[1] = over(2, 45);
        assert_eq!(
            response.retry(&request),
            Some(Retry::Never),
            "3 hits can never fit in 2"
        );
        response.overall_code = Code::Ok;
        assert_eq!(response.retry(&request), None);
        let names = HeaderNames::default();
        let pairs = RateLimitHeaders {
            limit: 5,
            remaining: 0,
            reset: 9,
        }
        .pairs(&names);
        assert_eq!(pairs[0], ("RateLimit-Limit", "5".to_owned()));
        assert_eq!(pairs[2], ("RateLimit-Reset", "9".to_owned()));
    }
}
