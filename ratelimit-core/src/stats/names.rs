//! Every statistic name, built here and nowhere else, as envoyproxy/ratelimit names them.

use std::borrow::Cow;

/// Prefix of every per-rule statistic: `ratelimit.service.rate_limit.<rule key>.<stat>`.
pub const RULE_PREFIX: &str = "ratelimit.service.rate_limit.";

/// A configuration load that succeeded.
pub const CONFIG_LOAD_SUCCESS: &str = "ratelimit.service.config_load_success";
/// A configuration load that failed.
pub const CONFIG_LOAD_ERROR: &str = "ratelimit.service.config_load_error";
/// Reads of the rule files (what upstream's runtime loader counts as `load_attempts`).
pub const RUNTIME_LOAD_ATTEMPTS: &str = "runtime.load_attempts";
/// Files the last read of the rule files found (the runtime loader's `num_values`).
pub const RUNTIME_NUM_VALUES: &str = "runtime.num_values";
/// Over-limit answers that `SHADOW_MODE` turned into `OK`.
pub const GLOBAL_SHADOW_MODE: &str = "ratelimit.service.global_shadow_mode";
/// Statistic keys folded into an `_overflow` key because `MAX_STAT_KEYS` was reached.
pub const STATS_OVERFLOW: &str = "ratelimit.service.stats_overflow";
/// Requests that failed because the counter store failed.
pub const REDIS_ERROR: &str = "ratelimit.service.call.should_rate_limit.redis_error";
/// A memcached call that failed, or a counter key memcached cannot hold.
pub const MEMCACHE_ERROR: &str = "ratelimit.service.call.should_rate_limit.memcache_error";
/// Requests that failed for any other reason.
pub const SERVICE_ERROR: &str = "ratelimit.service.call.should_rate_limit.service_error";
/// Over-limit keys answered from the local cache.
pub const LOCAL_CACHE_HITS: &str = "ratelimit.localcache.hitCount";
/// Keys the local cache did not hold.
pub const LOCAL_CACHE_MISSES: &str = "ratelimit.localcache.missCount";
/// Keys the local cache dropped to stay within its size.
pub const LOCAL_CACHE_EVICTIONS: &str = "ratelimit.localcache.evacuateCount";
/// Keys in the local cache now.
pub const LOCAL_CACHE_ENTRIES: &str = "ratelimit.localcache.entryCount";
/// Bytes the local cache holds now.
pub const LOCAL_CACHE_BYTES: &str = "ratelimit.localcache.bytes";
/// Counters the memory backend holds now.
pub const MEMORY_COUNTERS: &str = "ratelimit.memory.counters";
/// Bytes the memory backend's counters take now.
pub const MEMORY_BYTES: &str = "ratelimit.memory.bytes";
/// Counters the memory backend dropped to stay within its bound.
pub const MEMORY_EVICTIONS: &str = "ratelimit.memory.evictions";

/// Hits a write-behind replica has counted and not yet sent (a gauge, at each flush).
pub const WRITE_BEHIND_PENDING_HITS: &str = "ratelimit.write_behind.pending_hits";
/// Keys a write-behind replica holds (a gauge, at each flush).
pub const WRITE_BEHIND_KEYS: &str = "ratelimit.write_behind.keys";
/// Flushes that sent something.
pub const WRITE_BEHIND_FLUSHES: &str = "ratelimit.write_behind.flushes";
/// Flush calls the store failed; their hits go with the next flush.
pub const WRITE_BEHIND_FLUSH_ERRORS: &str = "ratelimit.write_behind.flush_errors";
/// Hits never sent: their window ended, or their key was evicted, first.
pub const WRITE_BEHIND_DROPPED_HITS: &str = "ratelimit.write_behind.dropped_hits";
/// How long flushes take.
pub const WRITE_BEHIND_FLUSH_TIME: &str = "ratelimit.write_behind.flush_time";

/// Requests answered OK because the store was unavailable (failure mode `allow`).
pub const FALLBACK_ALLOWED: &str = "ratelimit.service.backend_fallback_allowed";
/// Requests decided in process because the store was unavailable (failure mode `local`).
pub const FALLBACK_LOCAL: &str = "ratelimit.service.backend_fallback_local";
/// Requests refused because MAX_INFLIGHT_REQUESTS were being decided.
pub const INFLIGHT_REJECTED: &str = "ratelimit.service.inflight_rejected";

/// `ratelimit.<store>.breaker_<event>`: a node breaker of a store (`redis`, `memcache`)
/// `opened`, `closed` or `refused` a call.
pub fn breaker(store: &str, event: &str) -> String {
    format!("ratelimit.{store}.breaker_{event}")
}

/// `ratelimit.rlqs.<event>`: the Rate Limit Quota Service's counters (`streams`,
/// `usage_reports`, `assignments`, ...).
pub fn rlqs(event: &str) -> String {
    format!("ratelimit.rlqs.{event}")
}

/// The statistic of a rule key that counts what a rule decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleStat {
    /// Every hit evaluated against the rule.
    TotalHits,
    /// Hits beyond the limit.
    OverLimit,
    /// Hits above the near-limit ratio but within the limit.
    NearLimit,
    /// Hits answered within the limit.
    WithinLimit,
    /// Over-limit hits that shadow mode answered `OK`.
    ShadowMode,
    /// Over-limit hits answered from the local over-limit cache.
    OverLimitWithLocalCache,
    /// Hits given back by refunds (Envoy's `is_negative_hits`), never in `total_hits`.
    TotalNegativeHits,
}

impl RuleStat {
    /// Every rule statistic, in the order their names sort.
    pub const ALL: [RuleStat; 7] = [
        RuleStat::NearLimit,
        RuleStat::OverLimit,
        RuleStat::OverLimitWithLocalCache,
        RuleStat::ShadowMode,
        RuleStat::TotalHits,
        RuleStat::TotalNegativeHits,
        RuleStat::WithinLimit,
    ];

    /// The last segment of the statistic's name.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleStat::TotalHits => "total_hits",
            RuleStat::OverLimit => "over_limit",
            RuleStat::NearLimit => "near_limit",
            RuleStat::WithinLimit => "within_limit",
            RuleStat::ShadowMode => "shadow_mode",
            RuleStat::OverLimitWithLocalCache => "over_limit_with_local_cache",
            RuleStat::TotalNegativeHits => "total_negative_hits",
        }
    }
}

/// `ratelimit.service.rate_limit.<rule key>.limit`: the gauge of a rule's configured
/// `requests_per_unit`.
pub fn rule_limit(key: &str) -> String {
    format!("{RULE_PREFIX}{}.limit", sanitize(key))
}

/// `ratelimit.service.rate_limit.<rule key>.window_seconds`: the gauge of the length of
/// a rule's window.
pub fn rule_window_seconds(key: &str) -> String {
    format!("{RULE_PREFIX}{}.window_seconds", sanitize(key))
}

/// `ratelimit.service.rate_limit.<domain>.domain_not_found`.
pub fn domain_not_found(domain: &str) -> String {
    format!("{RULE_PREFIX}{domain}.domain_not_found")
}

/// Where statistics of unknown domains go once `MAX_STAT_KEYS` is reached.
pub fn domain_not_found_overflow() -> String {
    domain_not_found("_overflow")
}

/// `ratelimit_server.<method>.total_requests`.
pub fn total_requests(method: &str) -> String {
    format!("ratelimit_server.{method}.total_requests")
}

/// `ratelimit_server.<method>.response_time`.
pub fn response_time(method: &str) -> String {
    format!("ratelimit_server.{method}.response_time")
}

/// The rule key that statistics of `key` fold into once `MAX_STAT_KEYS` is reached.
pub fn overflow_key(key: &str) -> String {
    format!("{key}_overflow")
}

/// Appends one level of a rule key: `.key` or `.key_value`.
pub(crate) fn push_key_part(out: &mut String, key: &str, value: Option<&str>) {
    if !out.is_empty() {
        out.push('.');
    }
    out.push_str(key);
    if let Some(value) = value {
        out.push('_');
        out.push_str(value);
    }
}

/// A statistic name as envoyproxy/ratelimit sanitizes it: `:` and `|` become `_`, and so
/// do the dots of IPv4 addresses, so that a value never adds levels to the statistic
/// hierarchy by accident.
pub(crate) fn sanitize(name: &str) -> Cow<'_, str> {
    if !name.contains([':', '|']) && !has_ipv4(name) {
        return Cow::Borrowed(name);
    }
    let mut out: Vec<u8> = name
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let mut i = 0;
    while i < out.len() {
        match ipv4_at(&out, i) {
            Some(len) => {
                for b in &mut out[i..i + len] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                i += len;
            }
            None => i += 1,
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes.
    Cow::Owned(String::from_utf8(out).expect("still UTF-8"))
}

fn has_ipv4(part: &str) -> bool {
    let bytes = part.as_bytes();
    (0..bytes.len()).any(|i| ipv4_at(bytes, i).is_some())
}

/// Length of a dotted quad `d.d.d.d` (1–3 digits each) starting at `i` and not preceded by a
/// digit, if there is one.
fn ipv4_at(bytes: &[u8], i: usize) -> Option<usize> {
    if i > 0 && bytes[i - 1].is_ascii_digit() {
        return None;
    }
    let mut pos = i;
    for group in 0..4 {
        let digits = bytes[pos..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=3).contains(&digits) {
            return None;
        }
        pos += digits;
        if group < 3 {
            if bytes.get(pos) != Some(&b'.') {
                return None;
            }
            pos += 1;
        }
    }
    if bytes.get(pos).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    Some(pos - i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[(&str, Option<&str>)]) -> String {
        let mut out = String::from("domain");
        for (k, v) in parts {
            push_key_part(&mut out, k, *v);
        }
        sanitize(&out).into_owned()
    }

    #[test]
    fn names_are_sanitized_like_the_reference() {
        assert_eq!(key(&[("k", Some("v"))]), "domain.k_v");
        assert_eq!(
            key(&[("k", None), ("sub", Some("a:b|c"))]),
            "domain.k.sub_a_b_c"
        );
        assert_eq!(
            key(&[("remote_address", Some("10.0.0.1"))]),
            "domain.remote_address_10_0_0_1"
        );
        assert_eq!(key(&[("path", Some("/v1.2/x"))]), "domain.path_/v1.2/x");
    }

    #[test]
    fn rule_statistics_are_listed_in_name_order() {
        let names: Vec<&str> = RuleStat::ALL.iter().map(|s| s.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }
}
