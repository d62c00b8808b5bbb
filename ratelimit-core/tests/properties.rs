//! Properties that must hold for any input.

use ratelimit_core::UnixMillis;
use std::collections::HashMap;

use proptest::prelude::*;
use ratelimit_core::{
    Code, Config, Descriptor, Limiter, MemoryStore, PlanBuffers, Request, Response, Settings,
};

mod support;
use support::fixture;

/// A limiter on `fixtures/rules/properties.yaml`.
fn limiter() -> Limiter {
    support::limiter(&fixture("properties"))
}

/// A plan made in the buffers of a decided one writes over its counters, reusing their key
/// strings, and lists the same counters as a plan made anew, larger or smaller.
#[test]
fn a_plan_made_in_a_decided_plans_buffers_reuses_its_strings() {
    let limiter = limiter();
    let user = |v: &str| Descriptor::new([("user", v.to_owned())]);
    let one = Request::new("p", vec![user("first-user")]);
    let two = Request::new("p", vec![user("second"), user("third")]);
    let plan = limiter.plan(&one, UnixMillis(5_000)).unwrap();
    let first = plan.increments()[0].key.as_ptr();
    let (_, buffers) = plan.decide_keeping_buffers(&[1]);
    assert!(
        buffers.held() >= "p_user_first-user_0".len(),
        "{}",
        buffers.held()
    );
    let plan = limiter
        .plan(&two, UnixMillis(5_000).reusing(buffers))
        .unwrap();
    assert_eq!(plan.increments()[0].key.as_ptr(), first, "written over");
    assert_eq!(
        plan.increments(),
        limiter.plan(&two, UnixMillis(5_000)).unwrap().increments()
    );
    let (_, buffers) = plan.decide_keeping_buffers(&[1, 1]);
    let plan = limiter
        .plan(&one, UnixMillis(5_000).reusing(buffers))
        .unwrap();
    assert_eq!(
        plan.increments()[0].key.as_ptr(),
        first,
        "written over again"
    );
    assert_eq!(
        plan.increments(),
        limiter.plan(&one, UnixMillis(5_000)).unwrap().increments()
    );
}

proptest! {
    /// Two different values of a key-only rule never share a counter.
    #[test]
    fn key_only_rule_never_shares_a_counter(a in "[a-z0-9_.]{0,12}", b in "[a-z0-9_.]{0,12}", now in 0u64..10_000_000) {
        prop_assume!(a != b);
        let limiter = limiter();
        let store = MemoryStore::default();
        let for_value = |v: &str| Request::new("p", vec![Descriptor::new([("user", v)])]);
        let key_a = limiter.plan(&for_value(&a), UnixMillis::from_secs(now)).unwrap().increments()[0].key.clone();
        let key_b = limiter.plan(&for_value(&b), UnixMillis::from_secs(now)).unwrap().increments()[0].key.clone();
        prop_assert_ne!(&key_a, &key_b);
        for _ in 0..7 {
            limiter.should_rate_limit(&for_value(&a), &store, UnixMillis::from_secs(now)).unwrap();
        }
        let other = limiter.should_rate_limit(&for_value(&b), &store, UnixMillis::from_secs(now)).unwrap();
        prop_assert_eq!(other.statuses[0].limit_remaining, 6);
    }

    /// Whatever the interleaving of clients, times and hit counts, the hits answered OK
    /// within one window never exceed the limit.
    #[test]
    fn a_window_never_admits_more_than_the_limit(
        calls in proptest::collection::vec((0usize..3, 0u64..200, 0u64..4), 1..300)
    ) {
        let limiter = limiter();
        let store = MemoryStore::default();
        let mut calls = calls;
        calls.sort_by_key(|c| c.1); // time moves forward
        let mut admitted: HashMap<(usize, u64), u64> = HashMap::new();
        for (client, t, hits) in calls {
            let now = 1_000_000 + t;
            let request = Request::new("p", vec![Descriptor::new([("user", format!("u{client}"))]).with_hits(hits)]);
            let response = limiter.should_rate_limit(&request, &store, UnixMillis::from_secs(now)).unwrap();
            if response.overall_code == Code::Ok {
                *admitted.entry((client, now / 60)).or_default() += hits;
            }
        }
        for (window, hits) in admitted {
            prop_assert!(hits <= 7, "{window:?} admitted {hits}");
        }
    }

    /// Through the whole engine, a wildcard rule limits exactly the values a naive
    /// matcher accepts.
    #[test]
    fn wildcard_rules_match_like_a_naive_matcher(value in "(/a/|/b/|/a)[ab/]{0,6}") {
        let limiter = limiter();
        let request = Request::new("p", vec![Descriptor::new([("path", value.as_str())])]);
        let planned = !limiter.plan(&request, UnixMillis::from_secs(0)).unwrap().increments().is_empty();
        let naive = value.starts_with("/a/") && value[3..].contains("/b");
        prop_assert_eq!(planned, naive, "{}", value);
    }
}

#[test]
fn concurrent_clients_never_exceed_the_limit() {
    let limiter = limiter();
    let store = MemoryStore::default();
    let admitted = std::sync::atomic::AtomicU64::new(0);
    let request = Request::new("p", vec![Descriptor::new([("user", "hot")])]);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..1_000 {
                    let r = limiter
                        .should_rate_limit(&request, &store, UnixMillis::from_secs(600))
                        .unwrap();
                    if r.overall_code == Code::Ok {
                        admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.into_inner(), 7);
}

/// A remote store's exchange, played against a memory store: current counts when the
/// plan needs them, then the increments, then the decision.
fn through_a_plan(limiter: &Limiter, store: &MemoryStore, request: &Request, now: u64) -> Response {
    let mut plan = limiter.plan(request, UnixMillis::from_secs(now)).unwrap();
    if plan.needs_current_counts() {
        let current: Vec<u64> = plan.increments().iter().map(|i| store.current(i)).collect();
        plan.apply_current(&current);
    }
    let counts: Vec<u64> = plan.increments().iter().map(|i| store.apply(i)).collect();
    plan.decide(&counts)
}

proptest! {
    /// The in-process decision and the remote one (plan, counts, decide) answer every
    /// request of any sequence alike, with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT on or
    /// off, and leave the same counters behind.
    #[test]
    fn in_process_and_planned_decisions_agree(
        stop in any::<bool>(),
        calls in proptest::collection::vec(
            (0usize..3, proptest::option::of("/a/[xy]/b[z]{0,2}"), 0u64..130, 0u64..4),
            1..120,
        ),
    ) {
        let settings = Settings { stop_cache_key_increment_when_overlimit: stop, ..Settings::default() };
        let config = Config::from_yaml("p.yaml", &fixture("properties")).unwrap();
        let (direct, planned) = (Limiter::new(&config, settings.clone()), Limiter::new(&config, settings));
        let (a, b) = (MemoryStore::default(), MemoryStore::default());
        let mut calls = calls;
        calls.sort_by_key(|c| c.2);
        for (client, path, t, hits) in calls {
            let now = 1_000_000 + t;
            let mut descriptors = vec![Descriptor::new([("user", format!("u{client}"))]).with_hits(hits)];
            if let Some(path) = path {
                descriptors.push(Descriptor::new([("path", path)]));
            }
            let request = Request::new("p", descriptors);
            let expected = direct.should_rate_limit(&request, &a, UnixMillis::from_secs(now)).unwrap();
            let got = through_a_plan(&planned, &b, &request, now);
            prop_assert_eq!(&got, &expected, "{:?} at {}", request, now);
        }
    }
}

proptest! {
    /// A plan's counters are the ones the in-process decision counts in, for every kind
    /// of limit (fixed, shared across a wildcard, overridden, sliding, bucket): decisions
    /// made either way on one store answer as if all were made in process.
    #[test]
    fn planned_and_in_process_decisions_count_in_the_same_counters(
        calls in proptest::collection::vec((0usize..5, 0u8..3, 0u64..200, any::<bool>()), 1..150),
    ) {
        let config = Config::from_yaml("m.yaml", &fixture("every_kind")).unwrap();
        let limiter = Limiter::new(&config, Settings::default());
        let (mixed, reference) = (MemoryStore::default(), MemoryStore::default());
        let mut calls = calls;
        calls.sort_by_key(|c| c.2);
        for (kind, value, t, planned) in calls {
            let now = 1_000_000 + t;
            let descriptor = match kind {
                0 => Descriptor::new([("user", format!("u{value}"))]),
                1 => Descriptor::new([("path", format!("/a/{value}"))]),
                2 => Descriptor::new([("slide", format!("s{value}"))]),
                3 => Descriptor::new([("bucket", format!("b{value}"))]),
                _ => Descriptor::new([("user", format!("u{value}"))])
                    .with_limit(6, ratelimit_core::Unit::Minute),
            };
            let request = Request::new("m", vec![descriptor]);
            let expected = limiter.should_rate_limit(&request, &reference, UnixMillis::from_secs(now)).unwrap();
            let got = if planned {
                through_a_plan(&limiter, &mixed, &request, now)
            } else {
                limiter.should_rate_limit(&request, &mixed, UnixMillis::from_secs(now)).unwrap()
            };
            prop_assert_eq!(&got, &expected, "{:?} at {}", request, now);
        }
    }
}

/// One descriptor of `fixtures/rules/one_pass_and_planned.yaml`'s domain, by `kind`, with a value from `value`.
fn any_rule(kind: usize, value: u8) -> Descriptor {
    let v = format!("v{value}");
    let single = |key: &str| Descriptor::new([(key.to_owned(), v.clone())]);
    match kind {
        0 => single("user"),
        1 => Descriptor::new([("route", "/api".to_owned()), ("user", v)]),
        2 => single("shadow"),
        3 => single("slide"),
        4 => single("bucket"),
        5 => single("ten"),
        6 => single("free"),
        7 => single("unmatched"),
        8 => single("both"),
        9 => single("vip"),
        10 => Descriptor::new([("path", format!("/a/{v}"))]),
        11 => single("detail"),
        _ => single("user").with_limit(3, ratelimit_core::Unit::Minute),
    }
}

/// A limiter on `fixtures/rules/one_pass_and_planned.yaml`.
fn one_pass_and_planned(settings: Settings) -> Limiter {
    let config = Config::from_yaml("o.yaml", &fixture("one_pass_and_planned")).unwrap();
    Limiter::new(&config, settings)
}

/// Settings with global shadow mode, quota mode, both or neither.
fn any_modes() -> impl Strategy<Value = Settings> {
    (any::<bool>(), any::<bool>()).prop_map(|(shadow_mode, quota_mode)| Settings {
        shadow_mode,
        quota_mode,
        ..Settings::default()
    })
}

/// Up to 80 requests of `fixtures/rules/one_pass_and_planned.yaml`'s domain, each of 1 to
/// 3 descriptors of any rule ([`any_rule`]) and maybe its own hits, with their times
/// (unix milliseconds, in order, within 40 s).
fn any_calls() -> impl Strategy<Value = Vec<(Request, u64)>> {
    let descriptor =
        (0usize..13, 0u8..3, proptest::option::of(0u64..4)).prop_map(|(kind, value, hits)| {
            match hits {
                Some(hits) => any_rule(kind, value).with_hits(hits),
                None => any_rule(kind, value),
            }
        });
    let request = proptest::collection::vec(descriptor, 1..4)
        .prop_map(|descriptors| Request::new("o", descriptors));
    proptest::collection::vec((request, 0u64..40_000), 1..80).prop_map(|mut calls| {
        calls.sort_by_key(|call| call.1);
        calls
            .into_iter()
            .map(|(request, t)| (request, 1_000_000_000 + t))
            .collect()
    })
}

proptest! {
    /// Whatever the rules a request's descriptors match, with global shadow or quota mode
    /// on or off: deciding in process (in one pass where the rules allow it) and through a
    /// plan give the same answers, leave the same counters and count the same statistics.
    /// Each plan is made in the buffers the one before left, and lists the same counters as
    /// a plan made anew.
    #[test]
    fn one_pass_and_planned_decisions_agree_with_their_statistics(
        settings in any_modes(),
        calls in any_calls(),
    ) {
        let limiter = || one_pass_and_planned(settings.clone());
        let (in_process, planned, fresh) = (limiter(), limiter(), limiter());
        let (a, b) = (MemoryStore::default(), MemoryStore::default());
        let mut buffers = PlanBuffers::default();
        for (request, now_ms) in calls {
            let expected = in_process.should_rate_limit(&request, &a, UnixMillis(now_ms)).unwrap();
            // Each plan in the buffers the one before left: the same counters as a new plan's.
            let plan = planned.plan(&request, UnixMillis(now_ms).reusing(buffers)).unwrap();
            let new = fresh.plan(&request, UnixMillis(now_ms)).unwrap();
            prop_assert_eq!(plan.increments(), new.increments());
            let counts: Vec<u64> = plan.increments().iter().map(|i| b.apply(i)).collect();
            let got;
            (got, buffers) = plan.decide_keeping_buffers(&counts);
            prop_assert_eq!(&got, &expected, "{:?} at {}", request, now_ms);
        }
        prop_assert_eq!(
            planned.stats().snapshot().counters(),
            in_process.stats().snapshot().counters()
        );
    }
}

proptest! {
    /// A plan made in one pass (each descriptor matching at most one plain limit) and the
    /// whole plan (which reporting policies always takes) list the same counters and
    /// decide alike, with the same statistics, whatever the rules matched, with global
    /// shadow or quota mode on or off; only the policies differ.
    #[test]
    fn plans_made_in_one_pass_decide_as_whole_plans(
        settings in any_modes(),
        calls in any_calls(),
    ) {
        let whole = Settings { report_policies: true, ..settings.clone() };
        let (one_pass, planned) = (one_pass_and_planned(settings), one_pass_and_planned(whole));
        let (a, b) = (MemoryStore::default(), MemoryStore::default());
        for (request, now_ms) in calls {
            let (fast, slow) = (
                one_pass.plan(&request, UnixMillis(now_ms)).unwrap(),
                planned.plan(&request, UnixMillis(now_ms)).unwrap(),
            );
            prop_assert_eq!(fast.increments(), slow.increments());
            let counts: Vec<u64> = fast.increments().iter().map(|i| a.apply(i)).collect();
            let expected: Vec<u64> = slow.increments().iter().map(|i| b.apply(i)).collect();
            let got = fast.decide(&counts);
            let mut expected = slow.decide(&expected);
            prop_assert!(got.policies.is_empty());
            expected.policies.clear();
            prop_assert_eq!(&got, &expected, "{:?} at {}", request, now_ms);
        }
        prop_assert_eq!(
            one_pass.stats().snapshot().counters(),
            planned.stats().snapshot().counters()
        );
    }
}
