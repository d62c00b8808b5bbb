//! Envoy's RLS v3 `RateLimitRequest`, protobuf-decoded from arbitrary bytes (as the gRPC
//! service receives it), converted to the core's request and decided against the fixed
//! rules (rules/*.yaml) with a memory store, twice in a window and once in the next.
//!
//! Invariants: nothing panics; statuses are sane (see `check_response`); a refused
//! request is refused for what it holds, never for want of a configuration.
#![no_main]

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use ratelimit_core::{Limiter, MemoryStore, RequestError, Settings};
use ratelimit_fuzz::{DECISION_CONFIG, EPOCH, check_response};
use ratelimit_proto::envoy::request_from_pb;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    let Ok(request) = request_from_pb(request) else {
        return;
    };
    // Fresh each time: statistics and counters of one input never leak into the next.
    let limiter = Limiter::new(&DECISION_CONFIG, Settings::default());
    let store = MemoryStore::new(1024);
    for now in [EPOCH, EPOCH, EPOCH + 60] {
        match limiter.should_rate_limit(&request, &store, now) {
            Ok(response) => check_response(&request, &response),
            // Requests the limiter refuses (no domain, no descriptor, past its bounds)
            // are the caller's problem, not a failure.
            Err(RequestError::NoConfiguration) => panic!("the fixed rules are loaded"),
            Err(_) => {}
        }
    }
});
