//! What several fuzz targets share: the fixed rules and the invariants of a response.

use std::sync::LazyLock;

use ratelimit_core::{Code, Config, Request, Response};

/// The rules of the `edge` domain (`rules/decision.yaml`).
pub const EDGE_RULES: &str = include_str!("../rules/decision.yaml");
/// The rules of the `api` domain (`rules/api.yaml`).
pub const API_RULES: &str = include_str!("../rules/api.yaml");

/// Both rule files, loaded once.
pub static DECISION_CONFIG: LazyLock<Config> = LazyLock::new(|| {
    Config::from_files(
        [("decision.yaml", EDGE_RULES), ("api.yaml", API_RULES)],
        false,
    )
    .expect("the fixed rules of the fuzz targets load")
});

/// A unix time in 2023, where every window length has 10-digit starts.
pub const EPOCH: u64 = 1_700_000_000;

/// What holds for any response to `request`, whatever the rules, counters and settings.
pub fn check_response(request: &Request, response: &Response) {
    check_statuses(request, response, true);
}

/// [`check_response`] for rules that may use `unit_multiplier`, sliding windows and
/// token buckets: a bucket's remaining tokens go up to its burst, and a reset can be 0
/// (a bucket with tokens left) or span several units; the other invariants hold.
pub fn check_response_any_algorithm(request: &Request, response: &Response) {
    check_statuses(request, response, false);
}

fn check_statuses(request: &Request, response: &Response, fixed_windows: bool) {
    assert_eq!(
        response.statuses.len(),
        request.descriptors.len(),
        "one status per descriptor"
    );
    for (i, status) in response.statuses.iter().enumerate() {
        match &status.current_limit {
            Some(_) if !fixed_windows => {
                assert!(
                    status.duration_until_reset.is_some(),
                    "status {i}: no reset"
                );
            }
            Some(limit) => {
                assert!(
                    status.limit_remaining <= limit.requests_per_unit,
                    "status {i}: remaining {} > limit {}: {status:?}",
                    status.limit_remaining,
                    limit.requests_per_unit
                );
                let reset = status
                    .duration_until_reset
                    .expect("a limited status has a reset");
                assert!(
                    (1..=limit.unit.seconds()).contains(&reset),
                    "status {i}: reset {reset} outside one {} window",
                    limit.unit
                );
            }
            None => assert_eq!(
                status.code,
                Code::Ok,
                "status {i}: over limit without a limit"
            ),
        }
        if status.code == Code::OverLimit {
            assert_eq!(
                status.limit_remaining, 0,
                "status {i}: over limit with hits left"
            );
        }
    }
    if response.overall_code == Code::OverLimit {
        assert!(
            response.statuses.iter().any(|s| s.code == Code::OverLimit),
            "over limit overall with no descriptor over its limit"
        );
    }
    if let Some(headers) = response.headers {
        assert!(headers.remaining <= headers.limit, "{headers:?}");
        assert!(
            response.statuses.iter().any(|s| {
                s.current_limit
                    .as_ref()
                    .is_some_and(|l| l.requests_per_unit == headers.limit)
                    && s.limit_remaining == headers.remaining
                    && s.duration_until_reset == Some(headers.reset)
            }),
            "headers {headers:?} from no status"
        );
    } else {
        assert!(
            response
                .statuses
                .iter()
                .all(|s| s.current_limit.is_none() || s.duration_until_reset.is_none()),
            "a limited status but no headers"
        );
    }
}
