//! The modes that change what is counted and answered: `replaces`, shadow mode, quota
//! mode, stopping increments once over the limit, the local cache, and reloads.

use ratelimit_core::UnixMillis;
use ratelimit_core::{Code, Config, Limiter, MemoryStore, Request, Response, Settings};

use crate::support::{NOW, ask, counter, d, engine, first, fixture, limiter, limiter_with, rules};

/// A limiter that stops incrementing once a request goes over
/// (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
fn stopping(yaml: &str) -> Limiter {
    let settings = Settings {
        stop_cache_key_increment_when_overlimit: true,
        ..Settings::default()
    };
    limiter_with(yaml, settings)
}

/// Domain `re`: key `k` at `n` a minute.
fn per_minute(n: u32) -> String {
    let limit = format!("rate_limit: {{unit: minute, requests_per_unit: {n}}}");
    rules("re", &[("k", &limit)])
}

/// Domain `stop`: `minute` at 20 a minute, `hour` at 10 an hour.
fn stop_rules(minute: &str, hour: &str) -> String {
    rules(
        "stop",
        &[
            (minute, "rate_limit: {unit: minute, requests_per_unit: 20}"),
            (hour, "rate_limit: {unit: hour, requests_per_unit: 10}"),
        ],
    )
}

#[test]
fn replaces_drops_the_named_limit_without_counting_it() {
    let (l, s) = engine(&fixture("replaces"));
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

#[test]
fn rule_shadow_mode_answers_ok_and_counts_the_override() {
    let (l, s) = engine(&fixture("shadow"));
    let shadowed = d(&[("user", "shadowed")]);
    ask(&l, &s, "s", vec![shadowed.clone()]);
    let r = ask(&l, &s, "s", vec![shadowed]);
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(first(&r), (Code::Ok, Some(1), 0));
    let shadowed = |stat: &str| {
        counter(
            &l,
            &format!("ratelimit.service.rate_limit.s.user_shadowed.{stat}"),
        )
    };
    assert_eq!(shadowed("shadow_mode"), Some(1));
    assert_eq!(shadowed("over_limit"), Some(1));
}

#[test]
fn global_shadow_mode_flips_only_the_overall_code() {
    let settings = Settings {
        shadow_mode: true,
        ..Settings::default()
    };
    let (l, s) = (
        limiter_with(&fixture("shadow"), settings),
        MemoryStore::default(),
    );
    let user = d(&[("user", "u")]);
    ask(&l, &s, "s", vec![user.clone()]);
    let r = ask(&l, &s, "s", vec![user]);
    assert_eq!(r.overall_code, Code::Ok);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(counter(&l, "ratelimit.service.global_shadow_mode"), Some(1));
}

#[test]
fn quota_mode_is_over_only_when_every_quota_descriptor_is() {
    let yaml = rules(
        "q",
        &[
            (
                "service",
                "value: one, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}",
            ),
            (
                "service",
                "value: two, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}",
            ),
        ],
    );
    let (l, s) = engine(&yaml);
    let both = || vec![d(&[("service", "one")]), d(&[("service", "two")])];
    assert_eq!(ask(&l, &s, "q", both()).overall_code, Code::Ok);
    let second = ask(&l, &s, "q", both());
    assert_eq!(second.statuses[0].code, Code::OverLimit);
    assert_eq!(second.overall_code, Code::Ok, "service two still has quota");
    assert_eq!(ask(&l, &s, "q", both()).overall_code, Code::OverLimit);
}

#[test]
fn stop_increment_when_over_limit_leaves_the_other_counters_alone() {
    let (l, s) = (
        stopping(&stop_rules("key2", "key3")),
        MemoryStore::default(),
    );
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
        .plan(
            &Request::new("stop", vec![d(&[("key2", "a")])]),
            UnixMillis::from_secs(NOW),
        )
        .unwrap();
    assert_eq!(s.current(&key2.increments()[0]), 10);
}

#[test]
fn reload_swaps_rules_and_keeps_counters_and_statistics() {
    let (l, s) = engine(&per_minute(5));
    let request = Request::new("re", vec![d(&[("k", "v")])]);
    l.should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
        .unwrap();
    let planned_before = l.plan(&request, UnixMillis::from_secs(NOW)).unwrap();
    l.set_config(&Config::from_yaml("v2.yaml", &per_minute(2)).unwrap());
    // A plan made before the reload answers with the old rules.
    assert_eq!(first(&planned_before.decide(&[2])), (Code::Ok, Some(5), 3));
    let r = l
        .should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
        .unwrap();
    assert_eq!(first(&r), (Code::Ok, Some(2), 0));
    assert_eq!(
        counter(&l, "ratelimit.service.rate_limit.re.k.total_hits"),
        Some(3)
    );
    assert_eq!(
        l.describe(),
        "re.k: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"
    );
}

#[test]
fn limiters_deciding_in_turn_on_one_thread_each_use_their_own_rules() {
    let (five, two, s) = (
        limiter(&per_minute(5)),
        limiter(&per_minute(2)),
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
        assert_eq!(
            limit(
                five.should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
                    .unwrap()
            ),
            5
        );
        assert_eq!(
            limit(
                two.should_rate_limit(&request, &s, UnixMillis::from_secs(NOW))
                    .unwrap()
            ),
            2
        );
    }
}

#[test]
fn a_remote_plan_with_the_stop_flag_increments_only_what_would_go_over() {
    let yaml = stop_rules("a", "b");
    let l = stopping(&yaml);
    let request = Request::new("stop", vec![d(&[("a", "1")]), d(&[("b", "1")])]);
    let mut plan = l.plan(&request, UnixMillis::from_secs(NOW)).unwrap();
    assert!(plan.needs_current_counts());
    plan.apply_current(&[3, 4]);
    let hits: Vec<u64> = plan.increments().iter().map(|i| i.hits).collect();
    assert_eq!(hits, [1, 1], "nothing would go over: everything counts");
    let mut plan = l.plan(&request, UnixMillis::from_secs(NOW)).unwrap();
    plan.apply_current(&[3, 10]);
    let hits: Vec<u64> = plan.increments().iter().map(|i| i.hits).collect();
    assert_eq!(hits, [0, 1]);
    let r = plan.decide(&[3, 11]);
    assert_eq!(r.overall_code, Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 17);
    let without_flag = limiter(&yaml)
        .plan(&request, UnixMillis::from_secs(NOW))
        .unwrap();
    assert!(!without_flag.needs_current_counts());
}

#[test]
fn the_local_cache_answers_known_over_limit_counters_without_the_store() {
    let yaml = rules(
        "lc",
        &[
            ("a", "rate_limit: {unit: minute, requests_per_unit: 1}"),
            ("b", "rate_limit: {unit: minute, requests_per_unit: 10}"),
        ],
    );
    let settings = Settings {
        local_cache_size_in_bytes: 1 << 20,
        ..Settings::default()
    };
    let l = limiter_with(&yaml, settings);
    let request = Request::new("lc", vec![d(&[("a", "1")]), d(&[("b", "1")])]);
    // The store says `a` went over (2 > 1): the key is remembered.
    let r = l
        .plan(&request, UnixMillis::from_secs(NOW))
        .unwrap()
        .decide(&[2, 2]);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    // Next time only `b` is sent to the store, and `a` is over from the cache.
    let plan = l.plan(&request, UnixMillis::from_secs(NOW + 1)).unwrap();
    let keys: Vec<&str> = plan.increments().iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["lc_b_1_1699999980"]);
    let r = plan.decide(&[3]);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        (r.statuses[1].code, r.statuses[1].limit_remaining),
        (Code::Ok, 7)
    );
    assert_eq!(
        counter(
            &l,
            "ratelimit.service.rate_limit.lc.a.over_limit_with_local_cache"
        ),
        Some(1)
    );
    assert_eq!(counter(&l, "ratelimit.localcache.hitCount"), Some(1));
    // A new window asks the store again.
    assert_eq!(
        l.plan(&request, UnixMillis::from_secs(NOW + 60))
            .unwrap()
            .increments()
            .len(),
        2
    );
    assert_eq!(l.local_cache().unwrap().usage().0, 1);
}
