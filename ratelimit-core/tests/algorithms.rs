//! Limits beyond upstream's fixed window: `unit_multiplier`, `algorithm`, `burst` and
//! `rate_limits`, checked against plain reference models on a test clock.

use ratelimit_core::UnixMillis;
use std::collections::HashMap;

use proptest::prelude::*;
use ratelimit_core::{Code, Config, Descriptor, Limiter, MemoryStore, Request};

mod support;
use support::{limiter, rules};

/// A limiter on domain `d` with one descriptor `k` of `fields`.
fn on_k(fields: &str) -> Limiter {
    limiter(&rules("d", &[("k", fields)]))
}

fn one(key: &str, hits: u64) -> Request {
    Request::new("d", vec![Descriptor::new([(key, "v")]).with_hits(hits)])
}

#[test]
fn each_new_field_is_checked_and_errors_name_file_path_and_problem() {
    let cases = [
        (
            "rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}",
            "r.yaml: descriptors[0].rate_limit.algorithm: unknown rate limit algorithm 'leaky'",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1, burst: 5}",
            "r.yaml: descriptors[0].rate_limit.burst: burst only applies to algorithm: token_bucket",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}",
            "r.yaml: descriptors[0].rate_limit.unit_multiplier: unit_multiplier must be at least 1",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: day, requests_per_unit: 9}]",
            "r.yaml: descriptors[0].rate_limits: a descriptor takes rate_limit or rate_limits, not both",
        ),
        (
            "rate_limits: [{unit: day, requests_per_unit: 9}, {unlimited: true}]",
            "r.yaml: descriptors[0].rate_limits[1].unlimited: unlimited does not go in rate_limits",
        ),
        (
            "rate_limits: [{name: a, unit: day, requests_per_unit: 9}, {name: a, unit: hour, requests_per_unit: 1}]",
            "r.yaml: descriptors[0].rate_limits[1].name: two limits in rate_limits are named 'a'",
        ),
        (
            "rate_limits: [{unit: fortnight, requests_per_unit: 9}]",
            "r.yaml: descriptors[0].rate_limits[0].unit: invalid rate limit unit 'fortnight'",
        ),
    ];
    for (rule, expected) in cases {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    {rule}\n");
        let error = Config::from_yaml("r.yaml", &text).unwrap_err().to_string();
        assert!(error.starts_with(expected), "{rule}\n{error}");
    }
}

#[test]
fn plain_rules_keep_upstream_keys_and_new_limits_get_keys_of_their_own() {
    let limiter = limiter(&rules(
        "d",
        &[
            ("plain", "rate_limit: {unit: minute, requests_per_unit: 5}"),
            (
                "ten",
                "rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 5}",
            ),
            (
                "many",
                "rate_limits: [
                    {unit: minute, requests_per_unit: 5},
                    {unit: minute, requests_per_unit: 50, algorithm: sliding_window},
                    {unit: second, requests_per_unit: 1, algorithm: token_bucket}]",
            ),
        ],
    ));
    let keys = |key: &str| -> Vec<String> {
        let plan = limiter
            .plan(&one(key, 1), UnixMillis::from_secs(1_000_030))
            .unwrap();
        plan.increments().iter().map(|i| i.key.clone()).collect()
    };
    assert_eq!(keys("plain"), ["d_plain_v_1000020"]);
    assert_eq!(keys("ten"), ["d_ten_v_999600_fw600"]);
    assert_eq!(
        keys("many"),
        [
            "d_many_v_1000020_fw60_0",
            "d_many_v_1000020_sw60_1",
            "d_many_v_999960_sw60_1",
            "d_many_v_tb1_2",
        ]
    );
}

#[test]
fn every_window_limit_counts_every_hit_and_the_status_reports_the_one_that_decided() {
    let limiter = on_k(
        "rate_limits: [
                {name: burst, unit: second, requests_per_unit: 2},
                {name: daily, unit: day, requests_per_unit: 3}]",
    );
    let store = MemoryStore::default();
    let at = |ms: u64| {
        let response = limiter
            .should_rate_limit(&one("k", 1), &store, UnixMillis(86_400_000 * 20_000 + ms))
            .unwrap();
        let status = &response.statuses[0];
        let name = status.current_limit.as_ref().and_then(|l| l.name.clone());
        (
            response.overall_code,
            name.as_deref().map(str::to_owned),
            status.limit_remaining,
        )
    };
    let burst = Some("burst".to_owned());
    let daily = Some("daily".to_owned());
    assert_eq!(
        at(0),
        (Code::Ok, burst.clone(), 1),
        "fewest remaining: burst 1, daily 2"
    );
    assert_eq!(at(1), (Code::Ok, burst.clone(), 0));
    assert_eq!(
        at(2),
        (Code::OverLimit, burst, 0),
        "the burst limit refuses"
    );
    // The refused hit counted against the daily limit too: 4 of 3 in the next second.
    assert_eq!(at(1_000), (Code::OverLimit, daily, 0));
}

#[test]
fn a_token_bucket_in_a_list_spends_only_what_it_admits() {
    let limiter = on_k("rate_limits: [
                {name: window, unit: minute, requests_per_unit: 100},
                {name: bucket, unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 2}]");
    let store = MemoryStore::default();
    let code = |ms: u64| {
        limiter
            .should_rate_limit(&one("k", 1), &store, UnixMillis(60_000_000 + ms))
            .unwrap()
            .overall_code
    };
    assert_eq!(
        [code(0), code(0), code(0), code(0)],
        [Code::Ok, Code::Ok, Code::OverLimit, Code::OverLimit]
    );
    // Refused requests spent nothing: one token a second later.
    assert_eq!([code(1_000), code(1_000)], [Code::Ok, Code::OverLimit]);
}

#[test]
fn unit_multiplier_windows_report_their_unit_and_the_real_reset() {
    let limiter = on_k("rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 2}");
    let store = MemoryStore::default();
    let now = 1_200 * 1_000 + 30; // 30 s past a 10-minute boundary
    for _ in 0..2 {
        limiter
            .should_rate_limit(&one("k", 1), &store, UnixMillis::from_secs(now))
            .unwrap();
    }
    let over = limiter
        .should_rate_limit(&one("k", 1), &store, UnixMillis::from_secs(now))
        .unwrap();
    assert_eq!(over.overall_code, Code::OverLimit);
    let status = &over.statuses[0];
    assert_eq!(
        status.current_limit.as_ref().unwrap().unit,
        ratelimit_core::Unit::Minute
    );
    assert_eq!(status.duration_until_reset, Some(570));
    let later = limiter
        .should_rate_limit(&one("k", 1), &store, UnixMillis::from_secs(now + 569))
        .unwrap();
    assert_eq!(
        later.overall_code,
        Code::OverLimit,
        "still the same 10-minute window"
    );
    let next = limiter
        .should_rate_limit(&one("k", 1), &store, UnixMillis::from_secs(now + 570))
        .unwrap();
    assert_eq!(next.overall_code, Code::Ok);
}

/// A reference model of an algorithm: whether it admits `hits` at `now_ms`.
trait Model {
    fn admit(&mut self, now_ms: u64, hits: u64) -> bool;
}

/// A sliding window as its definition reads: every hit is counted in its window, and a
/// request is admitted when the current count plus the previous window's count weighted
/// by what is left of the current window, plus its hits, stays within the limit.
struct SlidingModel {
    limit: u64,
    length_ms: u64,
    counts: HashMap<u64, u64>,
}

impl Model for SlidingModel {
    fn admit(&mut self, now_ms: u64, hits: u64) -> bool {
        let window = now_ms / self.length_ms;
        let current = self.counts.get(&window).copied().unwrap_or(0) + hits;
        let previous = window
            .checked_sub(1)
            .and_then(|w| self.counts.get(&w))
            .copied()
            .unwrap_or(0);
        let left = self.length_ms - now_ms % self.length_ms;
        // Exact: no fraction of a previous hit is forgiven.
        let estimate = current + (previous * left).div_ceil(self.length_ms);
        self.counts.insert(window, current);
        estimate <= self.limit
    }
}

/// GCRA as textbooks give it: a request of `cost` conforms when the theoretical arrival
/// time, moved forward by its cost, is at most `burst` intervals ahead of now.
struct BucketModel {
    interval_ms: u64,
    burst: u64,
    tat: u64,
}

impl Model for BucketModel {
    fn admit(&mut self, now_ms: u64, cost: u64) -> bool {
        let start = self.tat.max(now_ms);
        let admitted = start + cost * self.interval_ms - now_ms <= self.burst * self.interval_ms;
        if admitted {
            self.tat = start + cost * self.interval_ms;
        }
        admitted
    }
}

/// Plays `steps` (time since the last step, hits) on descriptor `k` of `limiter` and on
/// `model`: the `(time, hits)` admitted, or a failure at the first step they disagree on.
fn play(
    limiter: &Limiter,
    model: &mut dyn Model,
    steps: Vec<(u64, u64)>,
) -> Result<Vec<(u64, u64)>, TestCaseError> {
    let store = MemoryStore::default();
    let mut admitted = Vec::new();
    for (now, hits) in times(steps) {
        let response = limiter.should_rate_limit(&one("k", hits), &store, UnixMillis(now));
        let ok = response.unwrap().overall_code == Code::Ok;
        prop_assert_eq!(ok, model.admit(now, hits), "at {} with {} hits", now, hits);
        if ok {
            admitted.push((now, hits));
        }
    }
    Ok(admitted)
}

fn times(steps: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut now = 1_700_000_000_000;
    steps
        .into_iter()
        .map(|(step, hits)| {
            now += step;
            (now, hits)
        })
        .collect()
}

proptest! {
    /// The sliding window decides as its reference model does, never admits more than the
    /// limit in one aligned window, and in any window-long interval admits less than
    /// twice the limit (the two-window estimate assumes the previous window's hits were
    /// spread evenly; hits bunched at its end can be followed by up to one more limit's
    /// worth before it has slid past them).
    #[test]
    fn sliding_window_matches_its_model(steps in proptest::collection::vec((0u64..400, 1u64..3), 1..300)) {
        let limiter = on_k("rate_limit: {unit: second, requests_per_unit: 6, algorithm: sliding_window}");
        let mut model = SlidingModel { limit: 6, length_ms: 1_000, counts: HashMap::new() };
        let admitted = play(&limiter, &mut model, steps)?;
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        for &(now, hits) in &admitted {
            *per_window.entry(now / 1_000).or_default() += hits;
        }
        prop_assert!(per_window.values().all(|&n| n <= 6), "{:?}", per_window);
        for &(start, _) in &admitted {
            let within: u64 = admitted.iter().filter(|(t, _)| (start..start + 1_000).contains(t)).map(|(_, h)| h).sum();
            prop_assert!(within < 12, "{} hits in the second from {}", within, start);
        }
    }

    /// The token bucket decides as textbook GCRA does, and never admits more than
    /// `burst + t / interval` tokens in any interval of length t.
    #[test]
    fn token_bucket_matches_gcra(steps in proptest::collection::vec((0u64..150, 1u64..3), 1..300)) {
        let limiter = on_k("rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 4}");
        let mut model = BucketModel { interval_ms: 100, burst: 4, tat: 0 };
        let admitted = play(&limiter, &mut model, steps)?;
        for (i, &(from, _)) in admitted.iter().enumerate() {
            for &(to, _) in &admitted[i..] {
                let tokens: u64 = admitted.iter().filter(|(t, _)| (from..=to).contains(t)).map(|(_, c)| c).sum();
                prop_assert!(tokens <= 4 + (to - from) / 100, "{} tokens from {} to {}", tokens, from, to);
            }
        }
    }
}
