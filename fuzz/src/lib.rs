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
    assert_eq!(
        response.statuses.len(),
        request.descriptors.len(),
        "one status per descriptor"
    );
    for (i, status) in response.statuses.iter().enumerate() {
        match &status.current_limit {
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
