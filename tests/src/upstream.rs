//! What the comparisons with envoyproxy/ratelimit's own binary share
//! (`tests/examples/upstream_*.rs`, run by bench/upstream/run.sh): the rules, the calls
//! and how an answer is compared.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::sidecar::request;

/// Upstream's own features only, each on a key of its own, with limits small enough to
/// be passed within a run.
pub const RULES: &str = include_str!("upstream_rules.yaml");

/// The calls, in order: each a label and a request; the whole list is sent `ROUNDS` times.
pub fn calls() -> Vec<(&'static str, RateLimitRequest)> {
    let one = |key: &'static str, value: &'static str| request("fleet", &[&[(key, value)]]);
    let mut hits = one("hour", "h");
    hits.hits_addend = 2;
    let mut descriptor_hits = one("day", "d");
    descriptor_hits.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    let mut overridden = one("minute", "override");
    overridden.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: 2,
    });
    vec![
        ("second", one("second", "s")),
        ("minute", one("minute", "m")),
        ("hits_addend", hits),
        ("descriptor hits_addend", descriptor_hits),
        ("week", one("week", "w")),
        (
            "nested",
            request("fleet", &[&[("user", "alice"), ("method", "POST")]]),
        ),
        (
            "replaces",
            request("fleet", &[&[("user", "bob")], &[("plan", "premium")]]),
        ),
        (
            "wildcard",
            request("fleet", &[&[("path", "/api/a")], &[("path", "/api/b")]]),
        ),
        (
            "share_threshold",
            request("fleet", &[&[("tenant", "t1")], &[("tenant", "t2")]]),
        ),
        ("shadow_mode", one("shadow", "x")),
        ("quota_mode", one("quota", "x")),
        ("detailed_metric", one("detailed", "x")),
        ("limit override", overridden),
        (
            "unlimited and whitelisted",
            request("fleet", &[&[("unlimited", "u")], &[("whitelisted", "w")]]),
        ),
    ]
}

pub const ROUNDS: usize = 14;

/// An answer as compared: everything but what depends on the moment is exact; the
/// moment-dependent parts are compared only within one second.
#[derive(Debug, PartialEq)]
pub struct Answer {
    pub overall: i32,
    pub statuses: Vec<String>,
    pub headers: Vec<String>,
}

pub fn answer(response: &RateLimitResponse) -> Answer {
    let statuses = response
        .statuses
        .iter()
        .map(|s| {
            let limit = s
                .current_limit
                .as_ref()
                .map(|l| format!("{}/{} {:?}", l.requests_per_unit, l.unit, l.name));
            let reset = s.duration_until_reset.as_ref().map(|d| d.seconds);
            format!(
                "{} {limit:?} remaining {} reset {reset:?}",
                s.code, s.limit_remaining
            )
        })
        .collect();
    let mut headers: Vec<String> = response
        .response_headers_to_add
        .iter()
        .map(|h| format!("{}: {}", h.key, h.value))
        .collect();
    headers.sort();
    Answer {
        overall: response.overall_code,
        statuses,
        headers,
    }
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `UPSTREAM_RATELIMIT_BIN`, the upstream binary to compare with; None (saying so on
/// standard error) when it is not set.
pub fn upstream_binary() -> Option<PathBuf> {
    let binary = std::env::var_os("UPSTREAM_RATELIMIT_BIN").map(PathBuf::from);
    if binary.is_none() {
        eprintln!(
            "set UPSTREAM_RATELIMIT_BIN to envoyproxy/ratelimit's binary (bench/upstream/run.sh says how)"
        );
    }
    binary
}
