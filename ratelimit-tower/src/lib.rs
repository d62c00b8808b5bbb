//! A [tower] layer that rate-limits `http` requests with `ratelimit-core`: any service
//! built on `http` types (axum, tonic, hyper) gets the engine's rules, counters,
//! statistics and headers.
//!
//! A closure turns each request into descriptors (from a header, the path, the method,
//! the peer address in the request's extensions); the limiter decides them against a
//! counter store ([`MemoryStore`] unless given another [`CounterStore`]) at the time an
//! injected clock gives. A request within its limits goes on to the service, and its
//! response gets the rate-limit headers; one over them is answered `429 Too Many
//! Requests` with the headers and `Retry-After`, without reaching the service.
//!
//! ```
//! use std::sync::Arc;
//! use ratelimit_core::config::{Domain, RateLimit, Rule};
//! use ratelimit_core::{Descriptor, Limiter, Settings, Unit};
//! use ratelimit_tower::RateLimitLayer;
//!
//! let rules = Domain::new("api").rule(Rule::key("api_key").limit(RateLimit::per(Unit::Minute, 100)));
//! let limiter = Arc::new(Limiter::new(&rules.build()?, Settings::default()));
//! let layer = RateLimitLayer::new(limiter, "api", |request: &http::request::Parts| {
//!     match request.headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
//!         Some(key) => vec![Descriptor::new([("api_key", key)])],
//!         None => Vec::new(), // not limited
//!     }
//! });
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [tower]: https://docs.rs/tower
#![warn(missing_docs)]

mod answer;
mod layer;
mod service;

pub use layer::{Clock, LayerError, RateLimitLayer};
pub use service::{RateLimitService, ResponseFuture};

pub use ratelimit_core::{CounterStore, HeaderFormat, HeaderNames, MemoryStore};
