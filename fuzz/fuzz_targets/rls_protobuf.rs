//! Envoy's RLS v3 `RateLimitRequest`, protobuf-decoded from arbitrary bytes (as the gRPC
//! service receives it), converted to the core's request and decided against the fixed
//! rules (rules/*.yaml) with a memory store, twice in a window and once in the next.
//!
//! Invariants: nothing panics; the server's own decoder (`wire`) accepts exactly what
//! prost and the conversion accept, with the same request, also when it decodes into a
//! request that held the previous input; statuses are sane (see `check_response`); a
//! refused request is refused for what it holds, never for want of a configuration.
#![no_main]

use ratelimit_core::UnixMillis;
use std::cell::RefCell;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use ratelimit_core::{Limiter, MemoryStore, Request, RequestBounds, RequestError, Settings};
use ratelimit_fuzz::{DECISION_CONFIG, EPOCH, check_response};
use ratelimit_proto::envoy::request_from_pb;
use ratelimit_proto::wire;

thread_local! {
    /// The request the previous input was decoded into, as a server worker reuses one.
    static REUSED: RefCell<Request> = RefCell::default();
}

/// No bound on counts, so that what `wire` accepts is what prost accepts; the limiter
/// checks its own bounds on the decision below.
const UNBOUNDED: RequestBounds = RequestBounds {
    max_descriptors: usize::MAX,
    max_entries: usize::MAX,
    max_domain_bytes: usize::MAX,
    max_key_bytes: usize::MAX,
    max_value_bytes: usize::MAX,
    max_hits_addend: u64::MAX,
};

fuzz_target!(|data: &[u8]| {
    let ours = wire::decode_request(data, &UNBOUNDED);
    let reused = REUSED.with_borrow_mut(|r| {
        wire::decode_request_into(data, r, &UNBOUNDED).map(|()| r.clone())
    });
    assert_eq!(reused, ours, "a reused request decodes as a new one");
    let Ok(request) = RateLimitRequest::decode(data) else {
        assert!(ours.is_err(), "prost refuses what wire accepts: {ours:?}");
        return;
    };
    let Ok(request) = request_from_pb(request) else {
        assert!(
            ours.is_err(),
            "the conversion refuses what wire accepts: {ours:?}"
        );
        return;
    };
    assert_eq!(ours, Ok(request.clone()), "wire decodes as prost does");
    // Fresh each time: statistics and counters of one input never leak into the next.
    let limiter = Limiter::new(&DECISION_CONFIG, Settings::default());
    let store = MemoryStore::new(1024);
    for now in [EPOCH, EPOCH, EPOCH + 60] {
        match limiter.should_rate_limit(&request, &store, UnixMillis::from_secs(now)) {
            Ok(response) => check_response(&request, &response),
            // Requests the limiter refuses (no domain, no descriptor, past its bounds)
            // are the caller's problem, not a failure.
            Err(RequestError::NoConfiguration) => panic!("the fixed rules are loaded"),
            Err(_) => {}
        }
    }
});
