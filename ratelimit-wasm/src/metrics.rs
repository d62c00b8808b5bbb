//! Names of the filter's proxy-wasm metrics.

use ratelimit_core::stats::{Name, RuleStat};

/// The statistics exported as proxy-wasm counters.
const EXPORTED: [RuleStat; 4] = [
    RuleStat::TotalHits,
    RuleStat::OverLimit,
    RuleStat::NearLimit,
    RuleStat::WithinLimit,
];

/// The metric for a core statistic: `ratelimit.service.rate_limit.<domain>.<key>.<stat>`
/// becomes `ratelimit_wasm.<domain>.<key>.<stat>`; other statistics are not exported.
pub fn metric_name(statistic: &Name) -> Option<String> {
    match statistic {
        Name::Rule { key, stat } if EXPORTED.contains(stat) => {
            Some(format!("ratelimit_wasm.{key}.{}", stat.as_str()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(stat: RuleStat) -> Name {
        Name::Rule {
            key: "edge.user".into(),
            stat,
        }
    }

    #[test]
    fn rule_statistics_map_to_filter_metrics() {
        assert_eq!(
            metric_name(&rule(RuleStat::TotalHits)).as_deref(),
            Some("ratelimit_wasm.edge.user.total_hits")
        );
        assert_eq!(metric_name(&rule(RuleStat::ShadowMode)), None);
        assert_eq!(
            metric_name(&Name::Plain("ratelimit.service.global_shadow_mode".into())),
            None
        );
    }
}
