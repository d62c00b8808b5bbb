//! Request bounds: caller-chosen names and addends can neither grow memory without bound
//! nor wrap a counter back under its limit.

use ratelimit_core::UnixMillis;
use ratelimit_core::{
    Code, Config, Descriptor, Limiter, MemoryStore, Request, RequestBounds, RequestError, Settings,
};

const NOW: u64 = 1_700_000_000;
const RULES: &str =
    "domain: b\ndescriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 100}}]\n";

fn limiter(bounds: RequestBounds) -> Limiter {
    let settings = Settings {
        bounds,
        ..Settings::default()
    };
    Limiter::new(&Config::from_yaml("b.yaml", RULES).unwrap(), settings)
}

/// A limiter whose bounds allow addends up to `max`, and an empty store.
fn with_max_addend(max: u64) -> (Limiter, MemoryStore) {
    let bounds = RequestBounds {
        max_hits_addend: max,
        ..RequestBounds::default()
    };
    (limiter(bounds), MemoryStore::default())
}

fn user(hits: u64) -> Request {
    Request::new(
        "b",
        vec![Descriptor::new([("user", "mallory")]).with_hits(hits)],
    )
}

#[test]
fn a_huge_addend_is_over_the_limit_and_cannot_reset_a_counter() {
    let (limiter, store) = (limiter(RequestBounds::default()), MemoryStore::default());
    let over = limiter
        .should_rate_limit(&user(151), &store, UnixMillis::from_secs(NOW))
        .unwrap();
    assert_eq!(over.overall_code, Code::OverLimit);

    // 2^64 - 151 would wrap the counter to 0 if it were added: it saturates instead.
    let huge = limiter
        .should_rate_limit(&user(u64::MAX - 150), &store, UnixMillis::from_secs(NOW))
        .unwrap();
    assert_eq!(huge.overall_code, Code::OverLimit);
    let after = limiter
        .should_rate_limit(&user(1), &store, UnixMillis::from_secs(NOW))
        .unwrap();
    assert_eq!(after.overall_code, Code::OverLimit);
}

#[test]
fn an_operator_bound_on_addends_is_refused_with_the_field() {
    let (limiter, store) = with_max_addend(1_000);
    let error = limiter
        .should_rate_limit(&user(5_000), &store, UnixMillis::from_secs(NOW))
        .unwrap_err();
    assert_eq!(
        error,
        RequestError::HitsAddendTooLarge {
            field: "descriptors[0].hits_addend".into(),
            value: 5_000,
            max: 1_000,
        }
    );
    assert!(error.is_invalid_argument());
    assert_eq!(
        error.to_string(),
        "descriptors[0].hits_addend is 5000; at most 1000 is allowed"
    );
    // The refused request counted nothing.
    let after = limiter
        .should_rate_limit(&user(100), &store, UnixMillis::from_secs(NOW))
        .unwrap();
    assert_eq!(after.overall_code, Code::Ok);
}

#[test]
fn addends_at_the_bound_saturate_the_counter_instead_of_wrapping() {
    let (limiter, store) = with_max_addend(1 << 63);
    for _ in 0..3 {
        let response = limiter
            .should_rate_limit(&user(1 << 63), &store, UnixMillis::from_secs(NOW))
            .unwrap();
        assert_eq!(response.overall_code, Code::OverLimit);
        assert_eq!(response.statuses[0].limit_remaining, 0);
    }
    // The same on the remote path: the plan decides a saturated total as over the limit.
    let plan = limiter
        .plan(&user(1 << 63), UnixMillis::from_secs(NOW))
        .unwrap();
    assert_eq!(plan.decide(&[u64::MAX]).overall_code, Code::OverLimit);
}

#[test]
fn names_past_their_bound_are_refused_with_the_field() {
    let limiter = limiter(RequestBounds::default());
    let store = MemoryStore::default();
    let long = |n: usize| "x".repeat(n);
    let cases = [
        (
            Request::new(long(257), vec![Descriptor::new([("user", "a")])]),
            "domain is 257 bytes long; at most 256 are allowed",
        ),
        (
            Request::new(
                "b",
                vec![
                    Descriptor::new([("user", "a")]),
                    Descriptor::new([(long(300), "a".to_owned())]),
                ],
            ),
            "descriptors[1].entries[0].key is 300 bytes long; at most 256 are allowed",
        ),
        (
            Request::new(
                "b",
                vec![Descriptor::new([("user".to_owned(), long(65_537))])],
            ),
            "descriptors[0].entries[0].value is 65537 bytes long; at most 65536 are allowed",
        ),
    ];
    for (request, message) in cases {
        let error = limiter
            .should_rate_limit(&request, &store, UnixMillis::from_secs(NOW))
            .unwrap_err();
        assert!(error.is_invalid_argument());
        assert_eq!(error.to_string(), message);
        assert_eq!(
            limiter
                .plan(&request, UnixMillis::from_secs(NOW))
                .unwrap_err()
                .to_string(),
            message
        );
    }
    assert_eq!(store.usage().counters, 0, "nothing was counted");
    // At the bound exactly, the request is decided.
    let at_bound = Request::new(
        "b",
        vec![Descriptor::new([("user".to_owned(), long(65_536))])],
    );
    assert!(
        limiter
            .should_rate_limit(&at_bound, &store, UnixMillis::from_secs(NOW))
            .is_ok()
    );
}

#[test]
fn a_request_wide_addend_past_the_bound_is_refused() {
    let (limiter, store) = with_max_addend(10);
    let mut request = Request::new("b", vec![Descriptor::new([("user", "mallory")])]);
    request.hits_addend = 11;
    assert_eq!(
        limiter
            .should_rate_limit(&request, &store, UnixMillis::from_secs(NOW))
            .unwrap_err(),
        RequestError::HitsAddendTooLarge {
            field: "hits_addend".into(),
            value: 11,
            max: 10,
        }
    );
    assert_eq!(store.usage().counters, 0, "nothing was counted");
    request.hits_addend = 10;
    let response = limiter
        .should_rate_limit(&request, &store, UnixMillis::from_secs(NOW))
        .unwrap();
    assert_eq!(response.statuses[0].limit_remaining, 90);
}
