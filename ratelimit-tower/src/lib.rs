#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod answer;
mod layer;
mod service;

pub use layer::{Clock, LayerError, RateLimitLayer};
pub use service::{RateLimitService, ResponseFuture};

/// The Rust blocks of the repository's `docs/library.md`, compiled (and most run) as doc
/// tests, so that every snippet a user copies builds as shown.
#[cfg(doctest)]
#[doc = include_str!("../../docs/library.md")]
struct LibraryPage;

pub use ratelimit_core::{CounterStore, HeaderFormat, HeaderNames, MemoryStore};
