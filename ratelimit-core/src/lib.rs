//! A rate-limit engine that reads envoyproxy/ratelimit's YAML rules and decides requests
//! the way that service does, without doing any I/O.
//!
//! Time is passed in as a moment in unix milliseconds ([`UnixMillis`]); nothing here
//! reads a clock, opens a file or a socket, or spawns a task, so the same engine runs in a server, in a proxy-wasm filter
//! and inside any Rust program.
//!
//! ```
//! use ratelimit_core::{
//!     Code, Config, Descriptor, Limiter, MemoryStore, Request, Settings, UnixMillis,
//! };
//!
//! let config = Config::from_yaml(
//!     "api.yaml",
//!     "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
//! )?;
//! let limiter = Limiter::new(&config, Settings::default());
//! let store = MemoryStore::default();
//! let request = Request::new("api", vec![Descriptor::new([("user", "alice")])]);
//!
//! let now = UnixMillis::from_secs(1_700_000_000);
//! let decide = || limiter.should_rate_limit(&request, &store, now).unwrap().overall_code;
//! let codes: Vec<Code> = (0..3).map(|_| decide()).collect();
//! assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
//!
//! // A minute later the window has rolled over.
//! let later = limiter.should_rate_limit(&request, &store, UnixMillis(now.0 + 60_000))?;
//! assert_eq!(later.statuses[0].limit_remaining, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
