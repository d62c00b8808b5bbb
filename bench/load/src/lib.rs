//! Load benchmark helpers: see `run.sh`, `instructions.sh` and `src/bin/`: the load generator (`rls-load`), the floor (`rls-floor`) and tonic's do-nothing server (`rls-tonic`).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The request the benchmark sends: domain `bench`, one descriptor `client=<value>`.
pub fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "client".into(),
                value: value.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}
