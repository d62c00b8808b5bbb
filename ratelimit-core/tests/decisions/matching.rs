//! Which rule a descriptor meets: values before keys, depth, wildcards, whitelists,
//! unknown domains, request overrides, and the counters' keys.

use ratelimit_core::UnixMillis;
use ratelimit_core::{Code, Limiter, MemoryStore, Request, RequestError, Settings, Unit};

use crate::support::{NOW, ask, counter, d, engine, first, fixture, limiter_with, rules};

/// `(code, requests_per_unit, remaining)` of one descriptor of `entries` in domain `m`.
fn one(l: &Limiter, s: &MemoryStore, entries: &[(&str, &str)]) -> (Code, Option<u32>, u32) {
    first(&ask(l, s, "m", vec![d(entries)]))
}

#[test]
fn key_only_rule_counts_each_value_separately() {
    let (l, s) = engine(&fixture("matching"));
    let a = [("remote_address", "10.0.0.1")];
    let codes: Vec<_> = (0..4).map(|_| one(&l, &s, &a).0).collect();
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    let other = ask(&l, &s, "m", vec![d(&[("remote_address", "10.0.0.2")])]);
    assert_eq!(first(&other), (Code::Ok, Some(3), 2));
}

#[test]
fn specific_value_beats_key_only_and_zero_blocks() {
    let (l, s) = engine(&fixture("matching"));
    let r = ask(&l, &s, "m", vec![d(&[("remote_address", "50.0.0.5")])]);
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(first(&r), (Code::OverLimit, Some(0), 0));
}

#[test]
fn nested_and_top_level_rules_are_independent() {
    let (l, s) = engine(&fixture("matching"));
    let nested = [("message_type", "marketing"), ("to_number", "206")];
    assert_eq!(one(&l, &s, &nested), (Code::Ok, Some(2), 1));
    assert_eq!(one(&l, &s, &nested), (Code::Ok, Some(2), 0));
    assert_eq!(one(&l, &s, &[("to_number", "206")]), (Code::Ok, Some(4), 3));
}

#[test]
fn a_limit_applies_only_at_exactly_the_request_depth() {
    let (l, s) = engine(&fixture("matching"));
    let no_limit = (Code::Ok, None, 0);
    assert_eq!(one(&l, &s, &[("message_type", "marketing")]), no_limit);
    assert_eq!(one(&l, &s, &[("key2", "x"), ("sub", "y")]), no_limit);
    assert_eq!(one(&l, &s, &[("key5", "value5")]).1, Some(15));
    let deep = [("key5", "value5"), ("subkey5", "subvalue5")];
    assert_eq!(one(&l, &s, &deep).1, Some(25));
    let other = [("key5", "value5"), ("subkey5", "other")];
    assert_eq!(one(&l, &s, &other), no_limit);
}

#[test]
fn a_value_without_limit_or_children_is_whitelisted() {
    let (l, s) = engine(&fixture("matching"));
    assert_eq!(one(&l, &s, &[("key2", "value3")]), (Code::Ok, None, 0));
    assert_eq!(one(&l, &s, &[("key2", "value4")]).1, Some(20));
}

#[test]
fn no_backtracking_once_a_value_matched() {
    let (l, s) = engine(&fixture("matching"));
    let other = [("nobacktrack", "x"), ("sub", "y")];
    assert_eq!(one(&l, &s, &other).1, Some(6));
    let special = [("nobacktrack", "special"), ("sub", "y")];
    assert_eq!(one(&l, &s, &special), (Code::Ok, None, 0));
}

#[test]
fn empty_value_falls_back_to_the_key_only_rule() {
    let (l, s) = engine(&fixture("matching"));
    assert_eq!(one(&l, &s, &[("remote_address", "")]).1, Some(3));
}

#[test]
fn wildcards_are_tried_in_file_order_and_count_per_value() {
    let (l, s) = engine(&fixture("matching"));
    assert_eq!(one(&l, &s, &[("path", "/api/1/action")]).1, Some(7));
    assert_eq!(one(&l, &s, &[("path", "/api/1/other")]).1, Some(8));
    assert_eq!(one(&l, &s, &[("path", "/web")]), (Code::Ok, None, 0));
    // Without share_threshold each value has its own counter.
    assert_eq!(one(&l, &s, &[("files", "own/a")]).2, 1);
    assert_eq!(one(&l, &s, &[("files", "own/b")]).2, 1);
}

#[test]
fn share_threshold_shares_one_counter_across_matching_values() {
    let (l, s) = engine(&fixture("matching"));
    assert_eq!(one(&l, &s, &[("files", "shared/a.pdf")]).2, 1);
    assert_eq!(one(&l, &s, &[("files", "shared/b.csv")]).2, 0);
    assert_eq!(one(&l, &s, &[("files", "shared/c")]).0, Code::OverLimit);
    let plan = l
        .plan(
            &Request::new("m", vec![d(&[("files", "shared/zzz")])]),
            UnixMillis::from_secs(NOW),
        )
        .unwrap();
    assert_eq!(plan.increments()[0].key, "m_files_shared/*_1699999200");
}

#[test]
fn unlimited_rules_never_count() {
    let (l, s) = engine(&fixture("matching"));
    let request = Request {
        hits_addend: 1_000,
        ..Request::new("m", vec![d(&[("free", "x")])])
    };
    let plan = l.plan(&request, UnixMillis::from_secs(NOW)).unwrap();
    assert!(plan.increments().is_empty());
    let r = l
        .should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
        .unwrap();
    assert_eq!(first(&r), (Code::Ok, None, u32::MAX));
    assert_eq!(r.statuses[0].duration_until_reset, None);
    assert_eq!(s.usage().counters, 0);
}

#[test]
fn unknown_domain_is_ok_and_counted() {
    let (l, s) = engine(&fixture("matching"));
    let overridden = d(&[("remote_address", "1")]).with_limit(1, Unit::Second);
    let r = ask(&l, &s, "nope", vec![overridden]);
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(first(&r), (Code::Ok, None, 0));
    assert_eq!(
        counter(&l, "ratelimit.service.rate_limit.nope.domain_not_found"),
        Some(1)
    );
}

#[test]
fn invalid_requests_are_errors() {
    let (l, s) = engine(&fixture("matching"));
    let empty_domain = Request::new("", vec![d(&[("a", "b")])]);
    assert_eq!(
        l.should_rate_limit(&empty_domain, &s, UnixMillis::from_secs(NOW)),
        Err(RequestError::EmptyDomain)
    );
    assert_eq!(
        l.should_rate_limit(&Request::new("m", vec![]), &s, UnixMillis::from_secs(NOW)),
        Err(RequestError::NoDescriptors)
    );
    let unloaded = Limiter::without_config(Settings::default());
    assert_eq!(
        unloaded.should_rate_limit(
            &Request::new("m", vec![d(&[("a", "b")])]),
            &s,
            UnixMillis::from_secs(NOW)
        ),
        Err(RequestError::NoConfiguration)
    );
    assert_eq!(
        RequestError::NoConfiguration.to_string(),
        "no rate limit configuration loaded"
    );
}

#[test]
fn cache_keys_are_byte_for_byte_envoy_ratelimit_keys() {
    let settings = Settings {
        cache_key_prefix: "prefix:".into(),
        ..Settings::default()
    };
    let l = limiter_with(&fixture("matching"), settings);
    let request = Request::new(
        "m",
        vec![
            d(&[("message_type", "marketing"), ("to_number", "206")]),
            d(&[("remote_address", "10.0.0.1")]),
            d(&[("nothing", "x")]),
        ],
    );
    let plan = l.plan(&request, UnixMillis::from_secs(NOW)).unwrap();
    let keys: Vec<&str> = plan.increments().iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "prefix:m_message_type_marketing_to_number_206_1699920000",
            "prefix:m_remote_address_10.0.0.1_1699999980",
        ]
    );
    assert_eq!(plan.increments()[1].window_end, 1_700_000_040);
    assert_eq!(plan.increments()[1].expiry_seconds(7), 67);
    assert!(!plan.increments()[1].per_second());
}

#[test]
fn hits_addend_request_default_descriptor_wins_and_zero_only_checks() {
    let (l, s) = engine(&rules(
        "h",
        &[("k", "rate_limit: {unit: second, requests_per_unit: 5}")],
    ));
    let mut request = Request::new("h", vec![d(&[("k", "a")])]);
    request.hits_addend = 3;
    assert_eq!(
        first(
            &l.should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
                .unwrap()
        )
        .2,
        2
    );
    request.descriptors[0].hits_addend = Some(2);
    assert_eq!(
        first(
            &l.should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
                .unwrap()
        )
        .2,
        0
    );
    // Exactly at the limit, a check-only request is still OK.
    request.descriptors[0].hits_addend = Some(0);
    assert_eq!(
        first(
            &l.should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
                .unwrap()
        ),
        (Code::Ok, Some(5), 0)
    );
    request.descriptors[0].hits_addend = Some(1);
    assert_eq!(
        first(
            &l.should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
                .unwrap()
        )
        .0,
        Code::OverLimit
    );
    // Rejected hits still count: the window is now past the limit.
    request.descriptors[0].hits_addend = Some(0);
    assert_eq!(
        first(
            &l.should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
                .unwrap()
        )
        .0,
        Code::OverLimit
    );
    assert!(
        l.plan(&request, UnixMillis::from_secs(NOW))
            .unwrap()
            .increments()[0]
            .per_second()
    );
}

#[test]
fn a_request_limit_override_applies_even_without_a_matching_rule() {
    let (l, s) = engine(&fixture("matching"));
    let descriptor = d(&[("anything", "v"), ("empty", "")]).with_limit(1, Unit::Hour);
    let r = ask(&l, &s, "m", vec![descriptor.clone()]);
    assert_eq!(first(&r), (Code::Ok, Some(1), 0));
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit,
        Unit::Hour
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![descriptor])).0,
        Code::OverLimit
    );
    assert_eq!(
        counter(
            &l,
            "ratelimit.service.rate_limit.m.anything_v.empty.total_hits"
        ),
        Some(2)
    );
}

#[test]
fn overall_code_is_the_or_of_statuses_in_request_order() {
    let (l, s) = engine(&fixture("matching"));
    let descriptors = vec![
        d(&[("to_number", "1")]),
        d(&[("remote_address", "50.0.0.5")]),
        d(&[("zz", "z")]),
    ];
    let r = ask(&l, &s, "m", descriptors);
    assert_eq!(r.overall_code, Code::OverLimit);
    let codes: Vec<Code> = r.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [Code::Ok, Code::OverLimit, Code::Ok]);
}
