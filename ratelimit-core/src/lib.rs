#![doc = include_str!("../README.md")]
//!
//! For a remote counter store, [`Limiter::plan`] lists the counters a request adds to
//! ([`Plan::increments`]); run them in one round trip and pass the totals to
//! [`Plan::decide`].
//!
//! The folders are its parts: `model` (the request, the response and its headers),
//! `rules` (the YAML configuration, the compiled rule tree, units and wildcards),
//! `counting` (what a limit's counters are: keys, windows, buckets, the over-limit
//! cache), `store` (the counter store seam and the in-memory store), `engine` (matching,
//! keys and the decision, one pass or planned), [`stats`] and [`grants`] (the Rate Limit
//! Quota Service's policy); [`Limiter`] is the facade.
#![warn(missing_docs)]

mod counting;
mod engine;
pub mod grants;
mod limiter;
mod model;
mod rules;
mod settings;
pub mod stats;
mod store;

pub use rules::config;

pub use config::{Algorithm, Config, ConfigError, ConfigErrorKind};
pub use counting::CounterOp;
pub use counting::counter_key::CounterKey;
pub use counting::gcra::Bucket;
pub use counting::lease::{Lease, LeaseSet, lease_id};
pub use counting::local_cache::OverLimitCache;
pub use engine::{
    Decision, DescriptorExplanation, Explanation, Increment, MatchedEntry, Outcome, Plan,
    PlanBuffers, PrepareError, PreparedCheck, QuotaLimit, QuotaRule,
};
pub use limiter::Limiter;
pub use model::headers::HeaderFormat;
pub use model::request::{Descriptor, Entry, LimitOverride, Request, RequestBounds, RequestError};
pub use model::response::{
    Code, CurrentLimit, DescriptorStatus, HeaderNames, Policy, RateLimitHeaders, Response, Retry,
    Statuses,
};
pub use model::time::{Decide, Planning, UnixMillis};
pub use rules::unit::{Unit, Window};
pub use rules::wildcard::Pattern;
pub use rules::{MatchKind, RuleView};
pub use settings::Settings;
pub use store::CounterStore;
pub use store::memory::{DEFAULT_MAX_BYTES, MemoryStore, MemoryUsage};
