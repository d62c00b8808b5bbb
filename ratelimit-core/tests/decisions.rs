//! Matching and decisions, end to end through the public API.

use ratelimit_core::{
    Code, Config, Descriptor, Limiter, MemoryStore, RateLimitHeaders, Request, RequestError,
    Response, Settings, Unit,
};

const NOW: u64 = 1_700_000_000; // 20 seconds into a minute: 1_699_999_980 starts it.

const MATCHING: &str = "
domain: m
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 4}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value3
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: nobacktrack
    descriptors:
      - key: sub
        rate_limit: {unit: minute, requests_per_unit: 6}
  - key: nobacktrack
    value: special
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 8}
  - key: files
    value: shared/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: files
    value: own/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
";

fn limiter_with(yaml: &str, settings: Settings) -> Limiter {
    Limiter::new(&Config::from_yaml("test.yaml", yaml).unwrap(), settings)
}

fn limiter(yaml: &str) -> Limiter {
    limiter_with(yaml, Settings::default())
}

fn d(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor::new(entries.iter().copied())
}

fn ask(
    limiter: &Limiter,
    store: &MemoryStore,
    domain: &str,
    descriptors: Vec<Descriptor>,
) -> Response {
    limiter
        .should_rate_limit(&Request::new(domain, descriptors), store, NOW)
        .unwrap()
}

/// `(code, requests_per_unit, remaining)` of the first status; requests_per_unit is `None`
/// when no limit applied.
fn first(response: &Response) -> (Code, Option<u32>, u32) {
    let s = &response.statuses[0];
    (
        s.code,
        s.current_limit.as_ref().map(|l| l.requests_per_unit),
        s.limit_remaining,
    )
}

#[test]
fn key_only_rule_counts_each_value_separately() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    let a = [("remote_address", "10.0.0.1")];
    let codes: Vec<_> = (0..4)
        .map(|_| first(&ask(&l, &s, "m", vec![d(&a)])).0)
        .collect();
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    let other = ask(&l, &s, "m", vec![d(&[("remote_address", "10.0.0.2")])]);
    assert_eq!(first(&other), (Code::Ok, Some(3), 2));
}

#[test]
fn specific_value_beats_key_only_and_zero_blocks() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    let r = ask(&l, &s, "m", vec![d(&[("remote_address", "50.0.0.5")])]);
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(first(&r), (Code::OverLimit, Some(0), 0));
}

#[test]
fn nested_and_top_level_rules_are_independent() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    let nested = [("message_type", "marketing"), ("to_number", "206")];
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&nested)])),
        (Code::Ok, Some(2), 1)
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&nested)])),
        (Code::Ok, Some(2), 0)
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("to_number", "206")])])),
        (Code::Ok, Some(4), 3)
    );
}

#[test]
fn a_limit_applies_only_at_exactly_the_request_depth() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    let no_limit = (Code::Ok, None, 0);
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("message_type", "marketing")])])),
        no_limit
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("key2", "x"), ("sub", "y")])])),
        no_limit
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("key5", "value5")])])).1,
        Some(15)
    );
    let deep = [("key5", "value5"), ("subkey5", "subvalue5")];
    assert_eq!(first(&ask(&l, &s, "m", vec![d(&deep)])).1, Some(25));
    let other = [("key5", "value5"), ("subkey5", "other")];
    assert_eq!(first(&ask(&l, &s, "m", vec![d(&other)])), no_limit);
}

#[test]
fn a_value_without_limit_or_children_is_whitelisted() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("key2", "value3")])])),
        (Code::Ok, None, 0)
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("key2", "value4")])])).1,
        Some(20)
    );
}

#[test]
fn no_backtracking_once_a_value_matched() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    let other = [("nobacktrack", "x"), ("sub", "y")];
    assert_eq!(first(&ask(&l, &s, "m", vec![d(&other)])).1, Some(6));
    let special = [("nobacktrack", "special"), ("sub", "y")];
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&special)])),
        (Code::Ok, None, 0)
    );
}

#[test]
fn empty_value_falls_back_to_the_key_only_rule() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("remote_address", "")])])).1,
        Some(3)
    );
}

#[test]
fn wildcards_are_tried_in_file_order_and_count_per_value() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("path", "/api/1/action")])])).1,
        Some(7)
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("path", "/api/1/other")])])).1,
        Some(8)
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("path", "/web")])])),
        (Code::Ok, None, 0)
    );
    // Without share_threshold each value has its own counter.
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("files", "own/a")])])).2,
        1
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("files", "own/b")])])).2,
        1
    );
}

#[test]
fn share_threshold_shares_one_counter_across_matching_values() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("files", "shared/a.pdf")])])).2,
        1
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("files", "shared/b.csv")])])).2,
        0
    );
    assert_eq!(
        first(&ask(&l, &s, "m", vec![d(&[("files", "shared/c")])])).0,
        Code::OverLimit
    );
    let plan = l
        .plan(&Request::new("m", vec![d(&[("files", "shared/zzz")])]), NOW)
        .unwrap();
    assert_eq!(plan.increments()[0].key, "m_files_shared/*_1699999200");
}

#[test]
fn unlimited_rules_never_count() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    let request = Request {
        hits_addend: 1_000,
        ..Request::new("m", vec![d(&[("free", "x")])])
    };
    let plan = l.plan(&request, NOW).unwrap();
    assert!(plan.increments().is_empty());
    let r = l.should_rate_limit(&request, &s, NOW).unwrap();
    assert_eq!(first(&r), (Code::Ok, None, u32::MAX));
    assert_eq!(r.statuses[0].duration_until_reset, None);
    assert_eq!(s.usage().counters, 0);
}

#[test]
fn unknown_domain_is_ok_and_counted() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    let r = ask(
        &l,
        &s,
        "nope",
        vec![d(&[("remote_address", "1")]).with_limit(1, Unit::Second)],
    );
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(first(&r), (Code::Ok, None, 0));
    let stats = l.stats().snapshot().counters();
    assert!(stats.contains(&(
        "ratelimit.service.rate_limit.nope.domain_not_found".into(),
        1
    )));
}

#[test]
fn invalid_requests_are_errors() {
    let l = limiter(MATCHING);
    let s = MemoryStore::default();
    let empty_domain = Request::new("", vec![d(&[("a", "b")])]);
    assert_eq!(
        l.should_rate_limit(&empty_domain, &s, NOW),
        Err(RequestError::EmptyDomain)
    );
    assert_eq!(
        l.should_rate_limit(&Request::new("m", vec![]), &s, NOW),
        Err(RequestError::NoDescriptors)
    );
    let unloaded = Limiter::without_config(Settings::default());
    assert_eq!(
        unloaded.should_rate_limit(&Request::new("m", vec![d(&[("a", "b")])]), &s, NOW),
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
    let l = limiter_with(MATCHING, settings);
    let request = Request::new(
        "m",
        vec![
            d(&[("message_type", "marketing"), ("to_number", "206")]),
            d(&[("remote_address", "10.0.0.1")]),
            d(&[("nothing", "x")]),
        ],
    );
    let plan = l.plan(&request, NOW).unwrap();
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
    let l = limiter(
        "domain: h\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    );
    let s = MemoryStore::default();
    let mut request = Request::new("h", vec![d(&[("k", "a")])]);
    request.hits_addend = 3;
    assert_eq!(first(&l.should_rate_limit(&request, &s, NOW).unwrap()).2, 2);
    request.descriptors[0].hits_addend = Some(2);
    assert_eq!(first(&l.should_rate_limit(&request, &s, NOW).unwrap()).2, 0);
    // Exactly at the limit, a check-only request is still OK.
    request.descriptors[0].hits_addend = Some(0);
    assert_eq!(
        first(&l.should_rate_limit(&request, &s, NOW).unwrap()),
        (Code::Ok, Some(5), 0)
    );
    request.descriptors[0].hits_addend = Some(1);
    assert_eq!(
        first(&l.should_rate_limit(&request, &s, NOW).unwrap()).0,
        Code::OverLimit
    );
    // Rejected hits still count: the window is now past the limit.
    request.descriptors[0].hits_addend = Some(0);
    assert_eq!(
        first(&l.should_rate_limit(&request, &s, NOW).unwrap()).0,
        Code::OverLimit
    );
    assert!(l.plan(&request, NOW).unwrap().increments()[0].per_second());
}

#[test]
fn a_request_limit_override_applies_even_without_a_matching_rule() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
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
    let stats = l.stats().snapshot().counters();
    assert!(stats.contains(&(
        "ratelimit.service.rate_limit.m.anything_v.empty.total_hits".into(),
        2
    )));
}

#[test]
fn overall_code_is_the_or_of_statuses_in_request_order() {
    let (l, s) = (limiter(MATCHING), MemoryStore::default());
    let r = ask(
        &l,
        &s,
        "m",
        vec![
            d(&[("to_number", "1")]),
            d(&[("remote_address", "50.0.0.5")]),
            d(&[("zz", "z")]),
        ],
    );
    assert_eq!(r.overall_code, Code::OverLimit);
    let codes: Vec<Code> = r.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [Code::Ok, Code::OverLimit, Code::Ok]);
}

const REPLACES: &str = "
domain: r
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit: {name: specific, requests_per_unit: 2, unit: minute}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit: {replaces: [{name: specific}], requests_per_unit: 3, unit: minute}
";

#[test]
fn replaces_drops_the_named_limit_without_counting_it() {
    let (l, s) = (limiter(REPLACES), MemoryStore::default());
    let one = d(&[("key_1", "value_1"), ("user", "u")]);
    let two = d(&[("key_2", "value_2"), ("user", "u")]);
    for remaining in [2, 1, 0] {
        let r = ask(&l, &s, "r", vec![one.clone(), two.clone()]);
        assert_eq!(first(&r), (Code::Ok, None, 0));
        assert_eq!(r.statuses[1].limit_remaining, remaining);
    }
    assert_eq!(
        ask(&l, &s, "r", vec![one.clone(), two]).overall_code,
        Code::OverLimit
    );
    let alone = ask(&l, &s, "r", vec![one]);
    assert_eq!(first(&alone), (Code::Ok, Some(2), 1));
    assert_eq!(
        alone.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .name
            .as_deref(),
        Some("specific")
    );
}

const SHADOW: &str = "
domain: s
descriptors:
  - key: user
    value: shadowed
    shadow_mode: true
    rate_limit: {requests_per_unit: 1, unit: minute}
  - key: user
    rate_limit: {requests_per_unit: 1, unit: minute}
";

#[test]
fn rule_shadow_mode_answers_ok_and_counts_the_override() {
    let (l, s) = (limiter(SHADOW), MemoryStore::default());
    let shadowed = d(&[("user", "shadowed")]);
    ask(&l, &s, "s", vec![shadowed.clone()]);
    let r = ask(&l, &s, "s", vec![shadowed]);
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(first(&r), (Code::Ok, Some(1), 0));
    let stats = l.stats().snapshot().counters();
    assert!(stats.contains(&(
        "ratelimit.service.rate_limit.s.user_shadowed.shadow_mode".into(),
        1
    )));
    assert!(stats.contains(&(
        "ratelimit.service.rate_limit.s.user_shadowed.over_limit".into(),
        1
    )));
}

#[test]
fn global_shadow_mode_flips_only_the_overall_code() {
    let settings = Settings {
        shadow_mode: true,
        ..Settings::default()
    };
    let (l, s) = (limiter_with(SHADOW, settings), MemoryStore::default());
    let user = d(&[("user", "u")]);
    ask(&l, &s, "s", vec![user.clone()]);
    let r = ask(&l, &s, "s", vec![user]);
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert!(
        l.stats()
            .snapshot()
            .counters()
            .contains(&("ratelimit.service.global_shadow_mode".into(), 1))
    );
}

#[test]
fn quota_mode_is_over_only_when_every_quota_descriptor_is() {
    let yaml = "
domain: q
descriptors:
  - key: service
    value: one
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: two
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let (l, s) = (limiter(yaml), MemoryStore::default());
    let both = || vec![d(&[("service", "one")]), d(&[("service", "two")])];
    assert_eq!(ask(&l, &s, "q", both()).overall_code, Code::Ok);
    let second = ask(&l, &s, "q", both());
    assert_eq!(second.statuses[0].code, Code::OverLimit);
    assert_eq!(second.overall_code, Code::Ok, "service two still has quota");
    assert_eq!(ask(&l, &s, "q", both()).overall_code, Code::OverLimit);
}

#[test]
fn stop_increment_when_over_limit_leaves_the_other_counters_alone() {
    let yaml = "
domain: stop
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
";
    let settings = Settings {
        stop_cache_key_increment_when_overlimit: true,
        ..Settings::default()
    };
    let (l, s) = (limiter_with(yaml, settings), MemoryStore::default());
    let mut last = None;
    for _ in 0..15 {
        last = Some(ask(
            &l,
            &s,
            "stop",
            vec![d(&[("key2", "a")]), d(&[("key3", "b")])],
        ));
    }
    let r = last.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[1].code, Code::OverLimit);
    // key2 stopped counting once key3 went over: 10 counted, 10 remaining.
    assert_eq!(r.statuses[0].limit_remaining, 10);
    let key2 = l
        .plan(&Request::new("stop", vec![d(&[("key2", "a")])]), NOW)
        .unwrap();
    assert_eq!(s.current(&key2.increments()[0]), 10);
}

#[test]
fn headers_follow_the_most_restrictive_descriptor_and_over_limit_wins() {
    let yaml = "
domain: hd
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
";
    let (l, s) = (limiter(yaml), MemoryStore::default());
    let r = ask(
        &l,
        &s,
        "hd",
        vec![d(&[("a", "1")]), d(&[("b", "1")]), d(&[("free", "1")])],
    );
    assert_eq!(
        r.headers,
        Some(RateLimitHeaders {
            limit: 3,
            remaining: 2,
            reset: 3_600 - NOW % 3_600
        })
    );
    let r = ask(&l, &s, "hd", vec![d(&[("c", "1")]), d(&[("b", "1")])]);
    assert_eq!(
        r.headers.map(|h| (h.limit, h.remaining, h.reset)),
        Some((0, 0, 1))
    );
    let r = ask(&l, &s, "hd", vec![d(&[("free", "1")])]);
    assert_eq!(r.headers, None);
}

#[test]
fn duration_until_reset_is_epoch_aligned_per_unit() {
    let yaml = "domain: u\ndescriptors:\n".to_owned()
        + &Unit::ALL
            .iter()
            .map(|u| format!("  - key: {u}\n    rate_limit: {{unit: {u}, requests_per_unit: 5}}\n"))
            .collect::<String>();
    let (l, s) = (limiter(&yaml), MemoryStore::default());
    for unit in Unit::ALL {
        let r = ask(&l, &s, "u", vec![d(&[(unit.as_upper_str(), "x")])]);
        let status = &r.statuses[0];
        assert_eq!(status.current_limit.as_ref().unwrap().unit, unit);
        assert_eq!(
            status.duration_until_reset,
            Some(unit.seconds() - NOW % unit.seconds())
        );
    }
}

/// Hits straddling the limit are split between `near_limit` and `over_limit` exactly as
/// in envoyproxy/ratelimit's own table of cases (limit, counter before, counter after).
#[test]
fn near_and_over_limit_statistics_follow_the_reference_arithmetic() {
    let cases: [(u32, u64, u64, [u64; 3]); 9] = [
        // limit, before, after, [within, near, over]
        (15, 10, 11, [1, 0, 0]),
        (15, 12, 13, [1, 1, 0]),
        (15, 15, 16, [0, 0, 1]),
        (20, 2, 5, [3, 0, 0]),
        (8, 5, 7, [2, 1, 0]),
        (20, 16, 19, [3, 3, 0]),
        (20, 19, 22, [0, 1, 2]),
        (20, 15, 22, [0, 4, 2]),
        (10, 27, 30, [0, 0, 3]),
    ];
    for (i, (limit, before, after, [within, near, over])) in cases.into_iter().enumerate() {
        let yaml = format!(
            "domain: n{i}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
        );
        let l = limiter(&yaml);
        let request = Request::new(
            format!("n{i}"),
            vec![d(&[("k", "v")]).with_hits(after - before)],
        );
        l.plan(&request, NOW).unwrap().decide(&[after]);
        let stats = l.stats().snapshot().counters();
        let get = |stat: &str| {
            let name = format!("ratelimit.service.rate_limit.n{i}.k.{stat}");
            stats
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .unwrap()
        };
        let got = [get("within_limit"), get("near_limit"), get("over_limit")];
        assert_eq!(
            got,
            [within, near, over],
            "case {i}: {limit} {before}->{after}"
        );
        assert_eq!(get("total_hits"), after - before);
    }
}

#[test]
fn statistics_keys_follow_detailed_metric_and_value_to_metric() {
    let yaml = "
domain: st
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        descriptors:
          - key: subject
            rate_limit: {unit: minute, requests_per_unit: 9}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 9}
  - key: wild
    value: api/*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 9}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 9}
";
    let (l, s) = (limiter(yaml), MemoryStore::default());
    ask(
        &l,
        &s,
        "st",
        vec![d(&[
            ("route", "api"),
            ("method", "GET"),
            ("subject", "alice"),
        ])],
    );
    ask(&l, &s, "st", vec![d(&[("detailed", "x:1")])]);
    ask(&l, &s, "st", vec![d(&[("wild", "api/v1")])]);
    ask(&l, &s, "st", vec![d(&[("plain", "hidden")])]);
    let names: Vec<String> = l
        .stats()
        .snapshot()
        .counters()
        .into_iter()
        .filter(|(n, v)| n.ends_with(".total_hits") && *v == 1)
        .map(|(n, _)| n)
        .collect();
    for expected in [
        "ratelimit.service.rate_limit.st.route_api.method_GET.subject.total_hits",
        "ratelimit.service.rate_limit.st.detailed_x_1.total_hits",
        "ratelimit.service.rate_limit.st.wild_api/*.total_hits",
        "ratelimit.service.rate_limit.st.plain.total_hits",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not in {names:?}"
        );
    }
}

#[test]
fn reload_swaps_rules_and_keeps_counters_and_statistics() {
    let v1 = "domain: re\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let v2 = "domain: re\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let (l, s) = (limiter(v1), MemoryStore::default());
    let request = Request::new("re", vec![d(&[("k", "v")])]);
    l.should_rate_limit(&request, &s, NOW).unwrap();
    let planned_before = l.plan(&request, NOW).unwrap();
    l.set_config(&Config::from_yaml("v2.yaml", v2).unwrap());
    // A plan made before the reload answers with the old rules.
    assert_eq!(first(&planned_before.decide(&[2])), (Code::Ok, Some(5), 3));
    let r = l.should_rate_limit(&request, &s, NOW).unwrap();
    assert_eq!(first(&r), (Code::Ok, Some(2), 0));
    assert!(
        l.stats()
            .snapshot()
            .counters()
            .contains(&("ratelimit.service.rate_limit.re.k.total_hits".into(), 3))
    );
    assert_eq!(
        l.describe(),
        "re.k: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"
    );
}

#[test]
fn limiters_deciding_in_turn_on_one_thread_each_use_their_own_rules() {
    let rules = |n: u32| {
        format!(
            "domain: re\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n"
        )
    };
    let (five, two, s) = (
        limiter(&rules(5)),
        limiter(&rules(2)),
        MemoryStore::default(),
    );
    let request = Request::new("re", vec![d(&[("k", "v")])]);
    for _ in 0..2 {
        let limit = |r: Response| {
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit
        };
        assert_eq!(limit(five.should_rate_limit(&request, &s, NOW).unwrap()), 5);
        assert_eq!(limit(two.should_rate_limit(&request, &s, NOW).unwrap()), 2);
    }
}

#[test]
fn a_remote_plan_with_the_stop_flag_increments_only_what_would_go_over() {
    let yaml = "
domain: stop
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 10}
";
    let settings = Settings {
        stop_cache_key_increment_when_overlimit: true,
        ..Settings::default()
    };
    let l = limiter_with(yaml, settings);
    let request = Request::new("stop", vec![d(&[("a", "1")]), d(&[("b", "1")])]);
    let mut plan = l.plan(&request, NOW).unwrap();
    assert!(plan.needs_current_counts());
    plan.apply_current(&[3, 4]);
    let hits: Vec<u64> = plan.increments().iter().map(|i| i.hits).collect();
    assert_eq!(hits, [1, 1], "nothing would go over: everything counts");
    let mut plan = l.plan(&request, NOW).unwrap();
    plan.apply_current(&[3, 10]);
    let hits: Vec<u64> = plan.increments().iter().map(|i| i.hits).collect();
    assert_eq!(hits, [0, 1]);
    let r = plan.decide(&[3, 11]);
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 17);
    let without_flag = limiter(yaml).plan(&request, NOW).unwrap();
    assert!(!without_flag.needs_current_counts());
}

#[test]
fn the_local_cache_answers_known_over_limit_counters_without_the_store() {
    let yaml = "
domain: lc
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 10}
";
    let settings = Settings {
        local_cache_size_in_bytes: 1 << 20,
        ..Settings::default()
    };
    let l = limiter_with(yaml, settings);
    let request = Request::new("lc", vec![d(&[("a", "1")]), d(&[("b", "1")])]);
    // The store says `a` went over (2 > 1): the key is remembered.
    let r = l.plan(&request, NOW).unwrap().decide(&[2, 2]);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    // Next time only `b` is sent to the store, and `a` is over from the cache.
    let plan = l.plan(&request, NOW + 1).unwrap();
    let keys: Vec<&str> = plan.increments().iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["lc_b_1_1699999980"]);
    let r = plan.decide(&[3]);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        (r.statuses[1].code, r.statuses[1].limit_remaining),
        (Code::Ok, 7)
    );
    let stats = l.stats().snapshot().counters();
    assert!(stats.contains(&(
        "ratelimit.service.rate_limit.lc.a.over_limit_with_local_cache".into(),
        1
    )));
    assert!(stats.contains(&("ratelimit.localcache.hitCount".into(), 1)));
    // A new window asks the store again.
    assert_eq!(l.plan(&request, NOW + 60).unwrap().increments().len(), 2);
    assert_eq!(l.local_cache().unwrap().usage().0, 1);
}
