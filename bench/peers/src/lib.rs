//! The prepared keyed check of `ratelimit-core` next to governor's keyed check, on the same
//! workloads: what `benches/peers.rs` times and `src/bin/per-call.rs` runs under callgrind.

#[path = "../../../ratelimit-core/benches/support/scenarios.rs"]
#[allow(dead_code)] // shared with the core's own benchmark, which uses all of it
mod scenarios;

use ratelimit_core::UnixMillis;
use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ratelimit_core::{Descriptor, Limiter, MemoryStore, PreparedCheck, Request};

pub use scenarios::{DISTINCT, NOW};

/// One workload of the comparison: a limit's algorithm and how many keys the calls
/// cycle through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// `token_bucket_hot_key`, `fixed_window_10000_keys`, ...
    pub name: &'static str,
    /// The bench rules' key whose limit it counts: `bucket` or `user`.
    rule: &'static str,
    /// How many distinct values the calls cycle through.
    keys: usize,
}

/// Every workload: token bucket and fixed window, on one hot key and on 10 000 keys.
pub const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "token_bucket_hot_key",
        rule: "bucket",
        keys: 1,
    },
    Workload {
        name: "token_bucket_10000_keys",
        rule: "bucket",
        keys: DISTINCT,
    },
    Workload {
        name: "fixed_window_hot_key",
        rule: "user",
        keys: 1,
    },
    Workload {
        name: "fixed_window_10000_keys",
        rule: "user",
        keys: DISTINCT,
    },
];

impl Workload {
    /// The workload called `name`.
    pub fn named(name: &str) -> Option<Workload> {
        WORKLOADS.into_iter().find(|w| w.name == name)
    }

    /// The values the calls cycle through, one string each, for every engine.
    fn values(&self) -> Vec<String> {
        if self.keys == 1 {
            return vec!["alice".to_owned()];
        }
        scenarios::keys()
    }

    /// The prepared check's calls: each reads the next value and decides it at a fixed
    /// time (the caller's clock), returning whether it was allowed.
    pub fn prepared(&self) -> impl FnMut() -> bool + use<> {
        let (limiter, store) = scenarios::engine();
        let check: PreparedCheck = Arc::new(limiter)
            .prepare("bench", &[self.rule])
            .expect("the bench rules are key-only");
        let values = self.values();
        let mut at = 0;
        let now_ms = NOW * 1_000;
        move || {
            at = (at + 1) % values.len();
            let value = values[at].as_str();
            check
                .decide(&[value], &store, UnixMillis(now_ms))
                .expect("valid call")
                .allowed
        }
    }

    /// The full decision of the same one-descriptor request, reusing one request whose
    /// value is set before each call (as the `*_10000_keys` workloads of the peers
    /// benchmark do).
    pub fn full(&self) -> impl FnMut() -> bool + use<> {
        let (limiter, store): (Limiter, MemoryStore) = scenarios::engine();
        let mut request = Request::new("bench", vec![Descriptor::new([(self.rule, "")])]);
        let values = self.values();
        let mut at = 0;
        move || {
            at = (at + 1) % values.len();
            scenarios::set_value(&mut request, &values[at]);
            let response = limiter
                .should_rate_limit(&request, &store, UnixMillis::from_secs(NOW))
                .expect("valid request");
            response.overall_code == ratelimit_core::Code::Ok
        }
    }

    /// governor's keyed check of the same values, on a limit no workload reaches.
    pub fn governor(&self) -> impl FnMut() -> bool + use<> {
        let limiter: DefaultKeyedRateLimiter<String> =
            RateLimiter::keyed(Quota::per_minute(NonZeroU32::new(4_000_000_000).unwrap()));
        let values = self.values();
        let mut at = 0;
        move || {
            at = (at + 1) % values.len();
            limiter.check_key(&values[at]).is_ok()
        }
    }
}
