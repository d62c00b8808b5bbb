//! The live dashboard on the debug server's `/` (for browsers): one HTML page with no
//! external assets, which polls `/dashboard.json` and draws the rates itself.

use ratelimit_core::stats::{Name, RuleStat, Value as Stat};
use serde_json::{Map, Value, json};

use ratelimit_service_kit::clock::unix_now;

use crate::decider::Decider;

/// The page.
pub const PAGE: &str = include_str!("dashboard.html");

/// Rule keys sent per poll at most (the busiest): the page stays light however many
/// statistic keys there are.
const RULE_KEYS_SHOWN: usize = 200;

/// Rules sent per poll at most (the first, depth first), with the total: a file of 50 000
/// rules made every poll 7.8 MB.
pub const RULES_SHOWN: usize = 1_000;

/// Domains of the last load named per poll at most, with the total.
const DOMAINS_SHOWN: usize = 100;

/// What the page shows, as JSON: health, the last load, the rules as a tree (depth
/// first), per-rule counters and the counters nearest their limits.
pub fn data(service: &Decider) -> String {
    let now = unix_now();
    let last_load = service
        .last_load
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    let last_load = last_load.map(|load| match load.outcome {
        Ok(domains) => json!({"at": load.at, "ok": true,
            "domainsTotal": domains.len(),
            "domains": domains.iter().take(DOMAINS_SHOWN).collect::<Vec<_>>()}),
        Err(error) => json!({"at": load.at, "ok": false, "error": error}),
    });
    let all_rules = service.limiter.rules();
    let rules_total = all_rules.len();
    let rules: Vec<Value> = all_rules
        .into_iter()
        .take(RULES_SHOWN)
        .map(|rule| {
            json!({
                "domain": rule.domain, "depth": rule.depth, "path": rule.yaml_path,
                "key": rule.key, "value": rule.value, "limit": rule.limit,
                "shadow": rule.shadow, "statsKey": rule.stats_key,
            })
        })
        .collect();
    let nearest: Vec<Value> = service
        .limiter
        .stats()
        .nearest()
        .read(now)
        .into_iter()
        .map(|near| {
            json!({"key": near.key, "count": near.count, "limit": near.limit,
                   "resetIn": near.window_end.saturating_sub(now)})
        })
        .collect();
    let body = json!({
        "now": now,
        "health": service.health.failing().unwrap_or("ok"),
        "backend": service.backend.name(),
        "lastLoad": last_load,
        "rules": rules,
        "rulesTotal": rules_total,
        "stats": rule_stats(service),
        "nearest": nearest,
    });
    body.to_string()
}

/// `{rule key: {total_hits, over_limit, near_limit}}` for the busiest rule keys.
fn rule_stats(service: &Decider) -> Map<String, Value> {
    let mut keys: Vec<(String, [u64; 3])> = Vec::new();
    for sample in service.limiter.stats().snapshot().samples {
        let (Name::Rule { key, stat }, Stat::Counter(value)) = (&sample.name, &sample.value) else {
            continue;
        };
        let slot = match stat {
            RuleStat::TotalHits => 0,
            RuleStat::OverLimit => 1,
            RuleStat::NearLimit => 2,
            _ => continue,
        };
        // Samples come sorted by name, so a key's statistics are adjacent.
        match keys.last_mut() {
            Some((last, values)) if last.as_str() == key.as_ref() => values[slot] = *value,
            _ => {
                let mut values = [0; 3];
                values[slot] = *value;
                keys.push((key.to_string(), values));
            }
        }
    }
    keys.sort_by(|a, b| b.1[0].cmp(&a.1[0]));
    keys.truncate(RULE_KEYS_SHOWN);
    keys.into_iter()
        .map(|(key, [total, over, near])| {
            (
                key,
                json!({"total_hits": total, "over_limit": over, "near_limit": near}),
            )
        })
        .collect()
}
