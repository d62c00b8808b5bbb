//! What a caller asks: the core's own form of Envoy's `RateLimitRequest`.

use crate::unit::Unit;

/// A rate-limit request: a domain and the descriptors to check, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The configuration domain to evaluate.
    pub domain: String,
    /// The descriptors; the response has one status per descriptor, in this order.
    pub descriptors: Vec<Descriptor>,
    /// Hits each descriptor adds unless it sets its own; 0 means 1.
    pub hits_addend: u32,
}

/// One descriptor: an ordered list of entries, matched level by level against the rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The entries, outermost first.
    pub entries: Vec<Entry>,
    /// A limit chosen by the caller instead of the configured one.
    pub limit: Option<LimitOverride>,
    /// Hits for this descriptor, winning over the request's; `Some(0)` only checks.
    pub hits_addend: Option<u64>,
}

/// A key/value pair of a descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
}

/// A per-request limit (Envoy's `RateLimitDescriptor.limit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    /// Hits allowed per window.
    pub requests_per_unit: u32,
    /// The window unit.
    pub unit: Unit,
}

impl Request {
    /// A request for `domain` with the given descriptors and the default addend.
    pub fn new(domain: impl Into<String>, descriptors: Vec<Descriptor>) -> Request {
        Request {
            domain: domain.into(),
            descriptors,
            hits_addend: 0,
        }
    }
}

impl Descriptor {
    /// A descriptor from `(key, value)` pairs.
    pub fn new<K: Into<String>, V: Into<String>>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Descriptor {
        Descriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry {
                    key: key.into(),
                    value: value.into(),
                })
                .collect(),
            limit: None,
            hits_addend: None,
        }
    }

    /// The same descriptor with its own hits addend.
    pub fn with_hits(mut self, hits: u64) -> Descriptor {
        self.hits_addend = Some(hits);
        self
    }

    /// The same descriptor with a caller-chosen limit.
    pub fn with_limit(mut self, requests_per_unit: u32, unit: Unit) -> Descriptor {
        self.limit = Some(LimitOverride {
            requests_per_unit,
            unit,
        });
        self
    }
}

/// Why a request cannot be evaluated. The messages are envoyproxy/ratelimit's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The request names no domain.
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// The request has no descriptors.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// No configuration was ever loaded successfully.
    #[error("no rate limit configuration loaded")]
    NoConfiguration,
}
