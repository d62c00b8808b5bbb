//! Upstream's main, line by line: how quota mode and unlimited rules decide the overall
//! code, which descriptor the `RateLimit-*` headers report, which rules contribute
//! metadata, and refunds (`is_negative_hits`) on every algorithm and path.

use ratelimit_core::UnixMillis;
use ratelimit_core::{
    Code, Config, Descriptor, Limiter, MemoryStore, RateLimitHeaders, Request, Response, Settings,
};

mod support;
use support::{NOW, fixture};

fn limiter_with(settings: Settings) -> Limiter {
    support::limiter_with(&fixture("parity"), settings)
}

fn limiter() -> Limiter {
    limiter_with(Settings::default())
}

fn d(key: &str, value: &str) -> Descriptor {
    Descriptor::new([(key, value)])
}

fn ask(limiter: &Limiter, store: &MemoryStore, descriptors: Vec<Descriptor>) -> Response {
    support::ask(limiter, store, "p", descriptors)
}

fn stat(limiter: &Limiter, name: &str) -> u64 {
    support::counter(limiter, &format!("ratelimit.service.rate_limit.p.{name}")).unwrap_or(0)
}

#[test]
fn an_unlimited_descriptor_is_neither_a_quota_descriptor_nor_a_passed_one() {
    for quota_mode in [false, true] {
        let l = limiter_with(Settings {
            quota_mode,
            ..Settings::default()
        });
        let s = MemoryStore::default();
        let both = || vec![d("quota", "a"), d("free", "x")];
        assert_eq!(ask(&l, &s, both()).overall_code, Code::Ok);
        let second = ask(&l, &s, both());
        assert_eq!(second.statuses[0].code, Code::OverLimit);
        assert_eq!(
            second.overall_code,
            Code::OverLimit,
            "every quota descriptor is over (QUOTA_MODE={quota_mode})"
        );
        assert_eq!(second.statuses[1].limit_remaining, u32::MAX);
        assert_eq!(second.statuses[1].metadata, None, "unlimited adds none");
    }
}

#[test]
fn with_global_quota_mode_an_unmatched_descriptor_is_a_passing_quota_descriptor() {
    let l = limiter_with(Settings {
        quota_mode: true,
        ..Settings::default()
    });
    let s = MemoryStore::default();
    let request = || vec![d("quota", "b"), d("nothing", "x")];
    ask(&l, &s, request());
    let second = ask(&l, &s, request());
    assert_eq!(second.statuses[0].code, Code::OverLimit);
    assert_eq!(second.overall_code, Code::Ok, "the unmatched one passes");
    // Without it, the only quota descriptor is over.
    let alone = ask(&l, &s, vec![d("quota", "b")]);
    assert_eq!(alone.overall_code, Code::OverLimit);
}

#[test]
fn a_failing_regular_descriptor_reports_the_headers_over_a_failing_quota_one() {
    let (l, s) = (limiter(), MemoryStore::default());
    // plain: 5 a minute, spent; quota: 1 a minute, spent.
    ask(&l, &s, vec![d("plain", "c").with_hits(5), d("quota", "c")]);
    let over = ask(&l, &s, vec![d("plain", "c"), d("quota", "c")]);
    assert_eq!(over.overall_code, Code::OverLimit);
    let headers = over.headers.unwrap();
    assert_eq!(
        (headers.limit, headers.remaining),
        (5, 0),
        "the regular one"
    );
    // In the other order too: a regular failure always wins.
    let reversed = ask(&l, &s, vec![d("quota", "c"), d("plain", "c")]);
    assert_eq!(reversed.headers.unwrap().limit, 5);
    // Among quota descriptors alone, the fewest remaining, the first of equals.
    let statuses = &over.statuses;
    let chosen = RateLimitHeaders::choose(statuses, |i| i == 1).unwrap();
    assert_eq!(chosen.limit, 5, "the last regular failure");
    let quota_only = RateLimitHeaders::choose(statuses, |_| true).unwrap();
    assert_eq!(quota_only.limit, 5, "both at 0 remaining: the first");
}

#[test]
fn only_passed_descriptors_carry_their_rules_metadata() {
    let (l, s) = (limiter(), MemoryStore::default());
    let first = ask(&l, &s, vec![d("tagged", "m"), d("free", "m")]);
    assert!(first.statuses[0].metadata.is_some());
    assert_eq!(first.statuses[1].metadata, None);
}

#[test]
fn a_refund_gives_back_hits_on_a_fixed_window_and_counts_only_as_negative_hits() {
    let (l, s) = (limiter(), MemoryStore::default());
    let spent = ask(&l, &s, vec![d("window", "r").with_hits(3)]);
    assert_eq!(spent.statuses[0].limit_remaining, 0);
    let refund = ask(&l, &s, vec![d("window", "r").with_hits(2).refunding()]);
    assert_eq!(refund.overall_code, Code::Ok);
    assert_eq!(refund.statuses[0].limit_remaining, 2);
    assert_eq!(
        refund.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        3
    );
    // Two more fit, the third does not.
    assert_eq!(
        ask(&l, &s, vec![d("window", "r").with_hits(2)]).overall_code,
        Code::Ok
    );
    assert_eq!(
        ask(&l, &s, vec![d("window", "r")]).overall_code,
        Code::OverLimit
    );
    assert_eq!(stat(&l, "window.total_hits"), 3 + 2 + 1);
    assert_eq!(stat(&l, "window.total_negative_hits"), 2);
    assert_eq!(stat(&l, "window.within_limit"), 5);
    assert_eq!(stat(&l, "window.over_limit"), 1);
    // A refund past zero stops at zero, and one over the limit is still OK.
    let big = ask(&l, &s, vec![d("window", "r").with_hits(100).refunding()]);
    assert_eq!(
        (big.overall_code, big.statuses[0].limit_remaining),
        (Code::Ok, 3)
    );
    let nobody = ask(&l, &s, vec![d("window", "nobody").refunding()]);
    assert_eq!(nobody.statuses[0].limit_remaining, 3, "nothing to refund");
}

#[test]
fn a_refund_lowers_the_current_sliding_window_and_refills_a_bucket_up_to_its_burst() {
    let (l, s) = (limiter(), MemoryStore::default());
    // A window counts the refused hit (as upstream does); a bucket spends no token on it.
    for (key, refused) in [("sliding", 1), ("bucket", 0)] {
        ask(&l, &s, vec![d(key, "r").with_hits(3)]);
        assert_eq!(
            ask(&l, &s, vec![d(key, "r")]).overall_code,
            Code::OverLimit,
            "{key}"
        );
        let refund = ask(&l, &s, vec![d(key, "r").with_hits(1 + refused).refunding()]);
        assert_eq!(refund.statuses[0].limit_remaining, 1, "{key}");
        assert_eq!(
            ask(&l, &s, vec![d(key, "r")]).overall_code,
            Code::Ok,
            "{key}"
        );
        let all = ask(&l, &s, vec![d(key, "r").with_hits(10).refunding()]);
        assert_eq!(
            all.statuses[0].limit_remaining, 3,
            "{key}: never past the limit"
        );
    }
}

#[test]
fn a_remote_refund_is_never_held_back_and_clears_the_local_cache() {
    let settings = Settings {
        local_cache_size_in_bytes: 1 << 20,
        stop_cache_key_increment_when_overlimit: true,
        ..Settings::default()
    };
    let l = limiter_with(settings);
    let charge = Request::new("p", vec![d("window", "lc")]);
    let r = l
        .plan(&charge, UnixMillis::from_secs(NOW))
        .unwrap()
        .decide(&[4]);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(l.local_cache().unwrap().usage().0, 1, "remembered as over");

    let refund = Request::new("p", vec![d("window", "lc").with_hits(2).refunding()]);
    let mut plan = l.plan(&refund, UnixMillis::from_secs(NOW + 1)).unwrap();
    assert!(plan.needs_current_counts());
    plan.apply_current(&[4]);
    let increments = plan.increments();
    assert_eq!(
        (increments.len(), increments[0].hits),
        (1, 2),
        "not held back"
    );
    assert!(increments[0].op.is_refund());
    assert_eq!(increments[0].after(4), 2);
    let r = plan.decide(&[2]);
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok, 1)
    );
    assert_eq!(l.local_cache().unwrap().usage().0, 0, "forgotten");
    // The store is asked again about the next charge.
    let next = l.plan(&charge, UnixMillis::from_secs(NOW + 2)).unwrap();
    assert_eq!(next.increments().len(), 1);
}

#[test]
fn every_rule_has_gauges_of_its_configured_limit_that_follow_reloads() {
    let l = limiter();
    let snapshot = l.stats().snapshot();
    let gauge = |snapshot: &ratelimit_core::stats::Snapshot, name: &str| {
        let name = format!("ratelimit.service.rate_limit.p.{name}");
        snapshot
            .samples
            .iter()
            .find_map(|s| (s.name.to_string() == name).then_some(s.value.clone()))
    };
    use ratelimit_core::stats::Value::Gauge;
    assert_eq!(gauge(&snapshot, "plain.limit"), Some(Gauge(5)));
    assert_eq!(gauge(&snapshot, "plain.window_seconds"), Some(Gauge(60)));
    assert_eq!(gauge(&snapshot, "free.limit"), None, "unlimited has none");
    let yaml = "domain: p\ndescriptors:\n  - {key: plain, rate_limit: {unit: hour, requests_per_unit: 7}}\n";
    l.set_config(&Config::from_yaml("p.yaml", yaml).unwrap());
    let snapshot = l.stats().snapshot();
    assert_eq!(gauge(&snapshot, "plain.limit"), Some(Gauge(7)));
    assert_eq!(gauge(&snapshot, "plain.window_seconds"), Some(Gauge(3600)));
    assert_eq!(
        gauge(&snapshot, "window.limit"),
        None,
        "removed with its rule"
    );
}

proptest::proptest! {
    /// Charges and refunds on a fixed window against a model: the counter goes up by a
    /// charge, down by a refund but never below 0, a charge is admitted while the
    /// counter stays within the limit, and a refund is always `Ok` with what is left.
    #[test]
    fn charges_and_refunds_match_a_saturating_model(
        steps in proptest::collection::vec((proptest::bool::ANY, 0u64..5), 1..60),
    ) {
        let (l, s) = (limiter(), MemoryStore::default());
        let mut count: u64 = 0;
        for (refund, hits) in steps {
            let descriptor = d("window", "model").with_hits(hits);
            let descriptor = if refund { descriptor.refunding() } else { descriptor };
            let response = ask(&l, &s, vec![descriptor]);
            count = if refund { count.saturating_sub(hits) } else { count + hits };
            let expected = if refund || count <= 3 { Code::Ok } else { Code::OverLimit };
            proptest::prop_assert_eq!(response.overall_code, expected);
            let left = u32::try_from(3u64.saturating_sub(count)).unwrap();
            proptest::prop_assert_eq!(response.statuses[0].limit_remaining, left);
        }
    }
}
