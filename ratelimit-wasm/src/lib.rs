//! A proxy-wasm filter that decides local rate limits inside Envoy with
//! [`ratelimit_core`]: descriptors built like Envoy's route actions, counters in Envoy's
//! shared data (shared by all worker threads), a local 429 with `RateLimit-*` headers.
//!
//! The configuration and descriptor modules are plain Rust and tested natively; the
//! filter itself is built for `wasm32-unknown-unknown` only.

pub mod actions;
pub mod config;
#[cfg(target_arch = "wasm32")]
mod filter;
pub mod fleet;
pub mod metrics;
pub mod slots;
