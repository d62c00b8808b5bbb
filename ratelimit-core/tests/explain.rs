//! Explanations: which rule each descriptor meets and how, its counter, and the answer
//! the current counts would give, without counting anything.

use ratelimit_core::UnixMillis;
use ratelimit_core::{Code, MatchKind, MemoryStore, Outcome, Request};

mod support;
use support::{NOW, d, fixture};
#[test]
fn explanations_name_the_rule_and_count_nothing() {
    let limiter = support::limiter(&fixture("explain"));
    let store = MemoryStore::default();
    let user = Request::new("x", vec![d(&[("user", "a")])]);
    limiter
        .should_rate_limit(&user, &store, UnixMillis::from_secs(NOW))
        .unwrap();
    let stats_before = limiter.stats().snapshot().counters();

    let request = Request::new(
        "x",
        vec![
            d(&[("user", "a")]),
            d(&[("user", "a"), ("path", "/api/v1")]),
            d(&[("open", "1")]),
            d(&[("free", "1")]),
            d(&[("old", "1")]),
            d(&[("new", "1")]),
            d(&[("nothing", "1")]),
        ],
    );
    let explanation = limiter
        .explain(&request, UnixMillis::from_secs(NOW))
        .unwrap();
    let found = explanation.descriptors();
    let outcomes: Vec<Outcome> = found.iter().map(|e| e.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Limited,
            Outcome::Limited,
            Outcome::Whitelisted,
            Outcome::Unlimited,
            Outcome::Replaced,
            Outcome::Limited,
            Outcome::NoRule
        ]
    );
    assert_eq!(found[0].rule.as_deref(), Some("descriptors[0]"));
    assert_eq!(
        found[1].rule.as_deref(),
        Some("descriptors[0].descriptors[0]")
    );
    let hows: Vec<MatchKind> = found[1].matched.iter().map(|m| m.how).collect();
    assert_eq!(hows, [MatchKind::Default, MatchKind::Wildcard]);
    assert!(found[1].shadow && !found[0].shadow);
    assert_eq!(found[5].rule.as_deref(), Some("descriptors[4]"));
    assert!(found[6].rule.is_none() && found[6].matched.is_empty());

    // The cache key is the counter the decision used; reading it gives its count.
    let first = &explanation.increments()[0];
    assert_eq!(found[0].cache_key.as_deref(), Some(first.key.as_str()));
    assert_eq!(store.current(first), 1);
    let current: Vec<u64> = explanation
        .increments()
        .iter()
        .map(|i| store.current(i))
        .collect();
    let answer = explanation.answer(&current);
    assert_eq!(answer.statuses[0].code, Code::Ok);
    assert_eq!(
        answer.statuses[0].limit_remaining, 0,
        "1 counted + 1 asked of 2"
    );
    assert_eq!(answer.statuses[1].code, Code::Ok, "shadow mode answers OK");
    assert_eq!(answer.overall_code, Code::Ok);

    // Nothing was counted: the counter and every statistic are as they were.
    assert_eq!(store.current(first), 1);
    assert_eq!(limiter.stats().snapshot().counters(), stats_before);

    // Over the limit, the answer says so.
    limiter
        .should_rate_limit(&user, &store, UnixMillis::from_secs(NOW))
        .unwrap();
    let current: Vec<u64> = explanation
        .increments()
        .iter()
        .map(|i| store.current(i))
        .collect();
    assert_eq!(explanation.answer(&current).overall_code, Code::OverLimit);
}

#[test]
fn an_unknown_domain_is_explained_without_a_statistic() {
    let limiter = support::limiter(&fixture("explain"));
    let explanation = limiter
        .explain(
            &Request::new("nowhere", vec![d(&[("user", "a")])]),
            UnixMillis::from_secs(NOW),
        )
        .unwrap();
    assert_eq!(explanation.descriptors()[0].outcome, Outcome::UnknownDomain);
    assert!(
        !limiter
            .stats()
            .snapshot()
            .counters()
            .iter()
            .any(|(name, _)| name.contains("nowhere")),
        "explaining creates no statistic name"
    );
}
