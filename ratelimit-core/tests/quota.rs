//! Rate Limit Quota Service buckets on the ShouldRateLimit rules: a bucket id maps to the
//! descriptor its entries form when the rule tree is walked, with the same matching.

use ratelimit_core::{Entry, QuotaRule, Unit};

mod support;
use support::{fixture, limiter};

const NOW_MS: u64 = 1_700_000_010_500;

fn rule(bucket: &[(&str, &str)]) -> QuotaRule {
    let limiter = limiter(&fixture("quota"));
    let entries: Vec<Entry> = bucket
        .iter()
        .map(|(k, v)| Entry {
            key: (*k).to_owned(),
            value: (*v).to_owned(),
        })
        .collect();
    limiter.quota_rule("q", &entries, NOW_MS).unwrap()
}

fn limited(bucket: &[(&str, &str)]) -> (String, u32, Unit, String) {
    let QuotaRule::Limited(limit) = rule(bucket) else {
        panic!("{bucket:?} is not limited");
    };
    let entries: Vec<String> = limit
        .descriptor
        .entries
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect();
    (
        entries.join(","),
        limit.requests_per_unit,
        limit.window.unit(),
        limit.counter.key,
    )
}

#[test]
fn a_bucket_id_walks_the_rule_tree_whatever_the_order_of_its_entries() {
    let minute = NOW_MS / 1_000 / 60 * 60;
    assert_eq!(
        limited(&[("user", "bob"), ("tenant", "acme"), ("extra", "ignored")]),
        (
            "tenant=acme,user=bob".into(),
            20,
            Unit::Minute,
            format!("q_tenant_acme_user_bob_{minute}")
        ),
        "exact match, and ShouldRateLimit's counter key"
    );
    let (entries, per_unit, unit, _) = limited(&[("tenant", "other"), ("user", "bob")]);
    assert_eq!(
        (entries.as_str(), per_unit, unit),
        ("tenant=other,user=bob", 7, Unit::Hour)
    );
    let (entries, per_unit, _, _) = limited(&[("path", "/api/v1")]);
    assert_eq!(
        (entries.as_str(), per_unit),
        ("path=/api/v1", 3),
        "wildcard"
    );
}

#[test]
fn unlimited_denied_shadow_and_unknown_buckets() {
    assert!(matches!(rule(&[("internal", "x")]), QuotaRule::Unlimited));
    assert!(matches!(rule(&[("nobody", "x")]), QuotaRule::NotConfigured));
    assert!(
        matches!(rule(&[("tenant", "acme")]), QuotaRule::Unlimited),
        "a rule without a limit at that depth"
    );
    assert!(matches!(rule(&[("blocked", "x")]), QuotaRule::Denied));
    let QuotaRule::Limited(watched) = rule(&[("watched", "x")]) else {
        panic!("shadow mode counts, so it is limited");
    };
    assert!(watched.shadow);
}

#[test]
fn other_algorithms_hand_out_quota_per_window_on_a_counter_of_their_own() {
    let (_, per_unit, unit, key) = limited(&[("client", "c1")]);
    assert_eq!((per_unit, unit), (2, Unit::Second));
    assert_eq!(key, format!("q_client_c1_{}_rlqs", NOW_MS / 1_000));
}
