//! Names of the filter's proxy-wasm metrics.

use ratelimit_core::stats::RULE_STATS_PREFIX;

/// The statistics exported as proxy-wasm counters.
const EXPORTED: [&str; 4] = ["total_hits", "over_limit", "near_limit", "within_limit"];

/// The metric for a core statistic: `ratelimit.service.rate_limit.<domain>.<key>.<stat>`
/// becomes `ratelimit_wasm.<domain>.<key>.<stat>`; other statistics are not exported.
pub fn metric_name(statistic: &str) -> Option<String> {
    let rest = statistic.strip_prefix(RULE_STATS_PREFIX)?;
    let (_, stat) = rest.rsplit_once('.')?;
    EXPORTED
        .contains(&stat)
        .then(|| format!("ratelimit_wasm.{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_statistics_map_to_filter_metrics() {
        assert_eq!(
            metric_name("ratelimit.service.rate_limit.edge.user.total_hits").as_deref(),
            Some("ratelimit_wasm.edge.user.total_hits")
        );
        assert_eq!(
            metric_name("ratelimit.service.rate_limit.edge.user.shadow_mode"),
            None
        );
        assert_eq!(metric_name("ratelimit.service.global_shadow_mode"), None);
    }
}
