//! The prepared keyed check answers, counts and keeps statistics as the full decision of
//! the same one-descriptor request does.

use ratelimit_core::UnixMillis;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use ratelimit_core::config::{Domain, RateLimit, Rule};
use ratelimit_core::{
    Bucket, Code, Config, CounterKey, CounterStore, Descriptor, Lease, Limiter, MemoryStore,
    PrepareError, Request, RequestBounds, RequestError, Settings, Unit,
};

/// A memory store that also writes down the text of every counter it changes, in order:
/// the keys a remote store would be sent. (Reads are left out: with
/// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT the full decision reads the counter of a lone
/// limit first, which a prepared check knows it need not.)
#[derive(Default)]
struct Recording {
    store: MemoryStore,
    keys: Mutex<Vec<String>>,
}

impl Recording {
    fn note(&self, key: &CounterKey<'_>) {
        key.with_text(|text| self.keys.lock().unwrap().push(text.to_owned()));
    }
}

impl CounterStore for Recording {
    fn increment(&self, key: &CounterKey<'_>, hits: u64, expires: u64, now: u64) -> u64 {
        self.note(key);
        self.store.increment(key, hits, expires, now)
    }
    fn get(&self, key: &CounterKey<'_>, now: u64) -> u64 {
        self.store.get(key, now)
    }
    fn decrement(&self, key: &CounterKey<'_>, hits: u64, expires: u64, now: u64) -> u64 {
        self.note(key);
        self.store.decrement(key, hits, expires, now)
    }
    fn gcra_refund(&self, key: &CounterKey<'_>, bucket: Bucket, cost: u64, now_ms: u64) -> u64 {
        self.note(key);
        self.store.gcra_refund(key, bucket, cost, now_ms)
    }
    fn gcra(&self, key: &CounterKey<'_>, bucket: Bucket, cost: u64, now_ms: u64) -> u64 {
        self.note(key);
        self.store.gcra(key, bucket, cost, now_ms)
    }
    fn acquire(&self, key: &CounterKey<'_>, lease: Lease, hits: u64, now_ms: u64) -> u64 {
        self.note(key);
        self.store.acquire(key, lease, hits, now_ms)
    }
    fn release(&self, key: &CounterKey<'_>, lease: Lease, now_ms: u64) -> u64 {
        self.note(key);
        self.store.release(key, lease, now_ms)
    }
}

const START_MS: u64 = 1_700_000_000_000;

fn request(keys: &[&str], values: &[&str], hits: u64) -> Request {
    let entries = keys.iter().copied().zip(values.iter().copied());
    Request::new("p", vec![Descriptor::new(entries).with_hits(hits)])
}

fn limit() -> impl Strategy<Value = RateLimit> {
    (0usize..3, 0u32..4, 1u32..3, 0usize..3, 0u32..4).prop_map(
        |(unit, rpu, multiplier, algorithm, burst)| {
            let limit = RateLimit::per([Unit::Second, Unit::Minute, Unit::Hour][unit], rpu)
                .unit_multiplier(multiplier);
            match algorithm {
                0 => limit,
                1 => limit.sliding_window(),
                _ => limit.token_bucket().burst(burst),
            }
        },
    )
}

/// A key-only rule of `key`: one limit, two named limits (one maybe replacing the other),
/// unlimited or none, in shadow or quota mode or not, and a child rule of key `c`.
fn rule(key: &'static str) -> impl Strategy<Value = Rule> {
    let limits = prop_oneof![
        3 => limit().prop_map(|l| vec![l]),
        2 => (limit(), limit(), any::<bool>()).prop_map(|(a, b, replace)| {
            let b = if replace { b.replaces("first") } else { b };
            vec![a.name("first"), b.name("second")]
        }),
        1 => Just(vec![RateLimit::unlimited()]),
        1 => Just(vec![]),
    ];
    (
        limits,
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(limit()),
    )
        .prop_map(move |(limits, shadow, quota, child)| {
            let mut rule = Rule::key(key);
            rule = match limits.len() {
                1 => rule.limit(limits.into_iter().next().unwrap()),
                _ => rule.limits(limits),
            };
            if shadow {
                rule = rule.shadow_mode();
            }
            if quota {
                rule = rule.quota_mode();
            }
            match child {
                Some(limit) => rule.child(Rule::key("c").limit(limit)),
                None => rule,
            }
        })
}

fn settings() -> impl Strategy<Value = Settings> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(shadow, quota, stop)| Settings {
        shadow_mode: shadow,
        quota_mode: quota,
        stop_cache_key_increment_when_overlimit: stop,
        ..Settings::default()
    })
}

proptest! {
    /// On random key-only rules, settings and calls, a limiter answering some calls
    /// through a prepared check and the others in full gives every answer a limiter
    /// answering all of them in full gives, sends the same counter keys to its store in
    /// the same order, and ends with the same statistics.
    #[test]
    fn prepared_and_full_decisions_agree(
        a in rule("a"),
        b in rule("b"),
        settings in settings(),
        keys in prop_oneof![Just(vec!["a"]), Just(vec!["b"]), Just(vec!["a", "c"]), Just(vec!["b", "c"])],
        calls in proptest::collection::vec((0usize..3, 0usize..2, 0u64..3, 0u64..1_500, any::<bool>()), 1..60),
    ) {
        let config = Domain::new("p").rule(a).rule(b).build().unwrap();
        let full = Limiter::new(&config, settings.clone());
        let mixed = Arc::new(Limiter::new(&config, settings));
        let check = match mixed.prepare("p", &keys) {
            Ok(check) => check,
            Err(error) => {
                // Only a path without a rule is refused here; it limits nothing.
                prop_assert!(matches!(error, PrepareError::NoRule { .. }), "{error}");
                let response = full.should_rate_limit(&request(&keys, &["x"; 2][..keys.len()], 1), &MemoryStore::default(), UnixMillis::from_secs(0)).unwrap();
                prop_assert_eq!(response.statuses[0].current_limit.clone(), None);
                return Ok(());
            }
        };
        let (full_store, mixed_store) = (Recording::default(), Recording::default());
        let mut now_ms = START_MS;
        for (first, second, hits, step, prepared) in calls {
            now_ms += step;
            let names = ["v0", "v1", "v2"];
            let values = [names[first], names[second]];
            let values = &values[..keys.len()];
            let expected = full
                .should_rate_limit(&request(&keys, values, hits), &full_store, UnixMillis(now_ms))
                .unwrap();
            let (allowed, headers) = if prepared {
                let decision = check.decide_hits(values, hits, &mixed_store, UnixMillis(now_ms)).unwrap();
                (decision.allowed, decision.headers)
            } else {
                let response = mixed
                    .should_rate_limit(&request(&keys, values, hits), &mixed_store, UnixMillis(now_ms))
                    .unwrap();
                (response.overall_code == Code::Ok, response.headers)
            };
            prop_assert_eq!(allowed, expected.overall_code == Code::Ok);
            prop_assert_eq!(headers, expected.headers);
        }
        prop_assert_eq!(&*mixed_store.keys.lock().unwrap(), &*full_store.keys.lock().unwrap());
        prop_assert_eq!(mixed.stats().snapshot().counters(), full.stats().snapshot().counters());
    }
}

fn rules(domain: Domain) -> Arc<Limiter> {
    Arc::new(Limiter::new(&domain.build().unwrap(), Settings::default()))
}

#[test]
fn rules_that_depend_on_values_cannot_be_prepared() {
    let per_minute = || RateLimit::per(Unit::Minute, 5);
    let limiter = rules(
        Domain::new("p")
            .rule(Rule::key("user").limit(per_minute()))
            .rule(Rule::key("user").value("admin").limit(per_minute()))
            .rule(Rule::key("path").value("/v1/*").limit(per_minute()))
            .rule(Rule::key("tenant").value_to_metric().limit(per_minute()))
            .rule(Rule::key("plan").limit(per_minute()).detailed_metric())
            .rule(Rule::key("free")),
    );
    let error = limiter.prepare("p", &["user"]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the rule at p: descriptors[1] matches key 'user' by its value; a prepared check needs key-only rules"
    );
    assert!(matches!(
        limiter.prepare("p", &["path"]),
        Err(PrepareError::DependsOnValues { .. })
    ));
    for key in ["tenant", "plan"] {
        let error = limiter.prepare("p", &[key]).unwrap_err();
        assert!(
            matches!(error, PrepareError::PerValueStatistics { .. }),
            "{error}"
        );
    }
    assert_eq!(
        limiter.prepare("q", &["user"]).unwrap_err(),
        PrepareError::UnknownDomain("q".into())
    );
    assert!(matches!(
        limiter.prepare("p", &["free", "x"]),
        Err(PrepareError::NoRule { .. })
    ));
    // A whitelist prepares, and allows everything without headers.
    let free = limiter.prepare("p", &["free"]).unwrap();
    let decision = free
        .decide(&["anyone"], &MemoryStore::default(), UnixMillis(START_MS))
        .unwrap();
    assert!(decision.allowed && decision.headers.is_none());
}

#[test]
fn calls_are_held_to_the_request_bounds() {
    let bounds = RequestBounds {
        max_value_bytes: 4,
        max_hits_addend: 10,
        ..RequestBounds::default()
    };
    let config = Domain::new("p")
        .rule(Rule::key("user").limit(RateLimit::per(Unit::Minute, 5)))
        .build()
        .unwrap();
    let limiter = Arc::new(Limiter::new(
        &config,
        Settings {
            bounds,
            ..Settings::default()
        },
    ));
    let check = limiter.prepare("p", &["user"]).unwrap();
    let store = MemoryStore::default();
    let error = check
        .decide(&["alice"], &store, UnixMillis(START_MS))
        .unwrap_err();
    let expected = limiter
        .should_rate_limit(
            &request(&["user"], &["alice"], 1),
            &store,
            UnixMillis(START_MS),
        )
        .unwrap_err();
    assert_eq!(error, PrepareError::Request(expected));
    assert!(matches!(
        check.decide_hits(&["bob"], 11, &store, UnixMillis(START_MS)),
        Err(PrepareError::Request(
            RequestError::HitsAddendTooLarge { .. }
        ))
    ));
    assert_eq!(
        check.decide(&["bob", "x"], &store, UnixMillis(START_MS)),
        Err(PrepareError::WrongValueCount {
            expected: 1,
            given: 2
        })
    );
    assert!(
        check
            .decide(&["bob"], &store, UnixMillis(START_MS))
            .unwrap()
            .allowed
    );
}

#[test]
fn a_prepared_check_decides_with_reloaded_rules() {
    let limit = |n| Domain::new("p").rule(Rule::key("user").limit(RateLimit::per(Unit::Minute, n)));
    let limiter = rules(limit(1));
    let mut check = limiter.prepare("p", &["user"]).unwrap();
    let store = MemoryStore::default();
    assert!(
        check
            .decide(&["alice"], &store, UnixMillis(START_MS))
            .unwrap()
            .allowed
    );
    assert!(
        !check
            .decide(&["alice"], &store, UnixMillis(START_MS))
            .unwrap()
            .allowed
    );

    limiter.set_config(&limit(5).build().unwrap());
    assert!(!check.is_current());
    let decision = check
        .decide(&["alice"], &store, UnixMillis(START_MS))
        .unwrap();
    assert_eq!((decision.allowed, decision.remaining()), (true, Some(2)));
    check.refresh().unwrap();
    assert!(check.is_current());
    assert_eq!(
        check
            .decide(&["alice"], &store, UnixMillis(START_MS))
            .unwrap()
            .remaining(),
        Some(1)
    );

    let valued = limit(5).rule(Rule::key("user").value("admin"));
    limiter.set_config(&valued.build().unwrap());
    assert!(matches!(
        check.decide(&["alice"], &store, UnixMillis(START_MS)),
        Err(PrepareError::DependsOnValues { .. })
    ));
    assert!(check.refresh().is_err());
    let empty = Config::default();
    limiter.set_config(&empty);
    assert_eq!(
        check.decide(&["alice"], &store, UnixMillis(START_MS)),
        Err(PrepareError::UnknownDomain("p".into()))
    );
}

#[test]
fn a_refused_call_says_when_to_retry() {
    let limiter = rules(
        Domain::new("p")
            .rule(Rule::key("user").limit(RateLimit::per(Unit::Second, 2).token_bucket())),
    );
    let check = limiter.prepare("p", &["user"]).unwrap();
    let store = MemoryStore::default();
    for _ in 0..2 {
        assert_eq!(
            check
                .decide(&["a"], &store, UnixMillis(START_MS))
                .unwrap()
                .retry_after(),
            None
        );
    }
    let refused = check.decide(&["a"], &store, UnixMillis(START_MS)).unwrap();
    assert!(!refused.allowed);
    assert_eq!(
        (refused.remaining(), refused.retry_after()),
        (Some(0), Some(1))
    );
    assert!(
        check
            .decide(&["a"], &store, UnixMillis(START_MS + 500))
            .unwrap()
            .allowed
    );
}
