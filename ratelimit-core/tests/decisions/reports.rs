//! What an answer reports: the `RateLimit-*` headers, the time until a window resets,
//! and the statistics a decision counts, under the names upstream gives them.

use ratelimit_core::UnixMillis;
use ratelimit_core::{RateLimitHeaders, Request, Unit};

use crate::support::{NOW, ask, counter, d, engine, fixture, limiter, rules};

#[test]
fn headers_follow_the_most_restrictive_descriptor_and_over_limit_wins() {
    let (l, s) = engine(&rules(
        "hd",
        &[
            ("a", "rate_limit: {unit: minute, requests_per_unit: 10}"),
            ("b", "rate_limit: {unit: hour, requests_per_unit: 3}"),
            ("c", "rate_limit: {unit: second, requests_per_unit: 0}"),
            ("free", "rate_limit: {unlimited: true}"),
        ],
    ));
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
    let limits: Vec<(String, String)> = Unit::ALL
        .iter()
        .map(|u| {
            (
                u.to_string(),
                format!("rate_limit: {{unit: {u}, requests_per_unit: 5}}"),
            )
        })
        .collect();
    let descriptors: Vec<(&str, &str)> = limits
        .iter()
        .map(|(k, f)| (k.as_str(), f.as_str()))
        .collect();
    let (l, s) = engine(&rules("u", &descriptors));
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
        let hourly = format!("rate_limit: {{unit: hour, requests_per_unit: {limit}}}");
        let l = limiter(&rules(&format!("n{i}"), &[("k", &hourly)]));
        let request = Request::new(
            format!("n{i}"),
            vec![d(&[("k", "v")]).with_hits(after - before)],
        );
        l.plan(&request, UnixMillis::from_secs(NOW))
            .unwrap()
            .decide(&[after]);
        let get = |stat: &str| {
            counter(&l, &format!("ratelimit.service.rate_limit.n{i}.k.{stat}")).unwrap()
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
    let (l, s) = engine(&fixture("statistics"));
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
    for expected in [
        "ratelimit.service.rate_limit.st.route_api.method_GET.subject.total_hits",
        "ratelimit.service.rate_limit.st.detailed_x_1.total_hits",
        "ratelimit.service.rate_limit.st.wild_api/*.total_hits",
        "ratelimit.service.rate_limit.st.plain.total_hits",
    ] {
        let all = l.stats().snapshot().counters();
        assert_eq!(counter(&l, expected), Some(1), "{expected} in {all:?}");
    }
}
