//! The proxy-wasm filter's plugin configuration (JSON holding the YAML rules) on
//! arbitrary bytes; an accepted configuration then builds descriptors from fixed request
//! headers with its actions and decides them on the filter's own counter store
//! (`SlotCounters`) over an in-memory stand-in for Envoy's shared data.
//!
//! Invariants: nothing panics; an accepted configuration has rules for its domain (its
//! requests are decided, refused only for names past the limiter's bounds); built
//! descriptors are never empty; statuses are sane (`check_response`).
#![no_main]

use ratelimit_core::UnixMillis;
use libfuzzer_sys::fuzz_target;
use ratelimit_core::{Request, RequestError};
use ratelimit_fuzz::{EPOCH, check_response};
use ratelimit_wasm::actions;
use ratelimit_wasm::config::FilterConfig;
use ratelimit_wasm::slots::{MemoryShared, SlotCounters};

fn header(name: &str) -> Option<String> {
    match name {
        ":path" => Some("/api/v1/reports/x".into()),
        ":method" => Some("POST".into()),
        ":authority" => Some("example.com".into()),
        "x-forwarded-for" => Some("203.0.113.7, 10.0.0.1".into()),
        "x-absent" => None,
        name if name.starts_with("x-") => Some(format!("{name}-value")),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let config = match FilterConfig::parse(data) {
        Ok(config) => config,
        Err(message) => {
            assert!(!message.is_empty());
            return;
        }
    };
    assert!(config.limiter.has_config());
    assert!(
        !config.domain.is_empty(),
        "rules cannot define an empty domain"
    );
    let descriptors = actions::build(&config.descriptors, header, Some("192.0.2.1"));
    assert!(descriptors.len() <= config.descriptors.len());
    assert!(descriptors.iter().all(|d| !d.entries.is_empty()));
    if descriptors.is_empty() {
        return;
    }
    let request = Request::new(config.domain.clone(), descriptors);
    let shared = MemoryShared::default();
    let store = SlotCounters::new(&shared, config.shared_slots);
    for now in [EPOCH, EPOCH, EPOCH + 1] {
        match config.limiter.should_rate_limit(&request, &store, UnixMillis::from_secs(now)) {
            Ok(response) => check_response(&request, &response),
            // Names past the limiter's bounds are refused; nothing else may be.
            Err(
                error @ (RequestError::NoConfiguration
                | RequestError::EmptyDomain
                | RequestError::NoDescriptors),
            ) => {
                panic!("an accepted configuration refused its request: {error}")
            }
            Err(_) => {}
        }
    }
});
