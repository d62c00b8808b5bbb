//! What a caller asks: the core's own form of Envoy's `RateLimitRequest`.

use crate::rules::unit::Unit;

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

impl Request {
    /// Each descriptor with the hits it adds: its own `hits_addend`, else the request's,
    /// where 0 means 1. The one place a descriptor's hits are worked out.
    #[inline]
    pub fn descriptor_hits(&self) -> impl Iterator<Item = (&Descriptor, u64)> {
        let default = u64::from(self.hits_addend.max(1));
        (self.descriptors.iter()).map(move |d| (d, d.hits_addend.unwrap_or(default)))
    }
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
    /// The hits are a refund (Envoy's `is_negative_hits`): they are taken off the
    /// descriptor's counters instead of added, giving back what an earlier request was
    /// charged.
    pub negative_hits: bool,
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
            negative_hits: false,
        }
    }

    /// The same descriptor as a refund of its hits (Envoy's `is_negative_hits`).
    pub fn refunding(mut self) -> Descriptor {
        self.negative_hits = true;
        self
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

/// Bounds on what a request may carry, so that no caller-chosen name or number makes the
/// service keep unbounded memory or wrap a counter. envoyproxy/ratelimit has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestBounds {
    /// Longest domain, in bytes.
    pub max_domain_bytes: usize,
    /// Longest descriptor entry key, in bytes.
    pub max_key_bytes: usize,
    /// Longest descriptor entry value, in bytes.
    pub max_value_bytes: usize,
    /// Largest hits addend, for the request and for each descriptor.
    pub max_hits_addend: u64,
    /// Most descriptors in one request.
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
}

impl Default for RequestBounds {
    /// 256-byte domains and keys (they come from Envoy's configuration), 64 KiB values
    /// (more than Envoy's default 60 KiB for all request headers, so no value taken from
    /// a header Envoy accepts is refused), addends in the whole range of Envoy's
    /// `uint64` (counters saturate; they never wrap), and 256 descriptors of 64 entries
    /// (Envoy sends one descriptor per matching `rate_limits` entry of a route, and one
    /// entry per action).
    fn default() -> RequestBounds {
        RequestBounds::DEFAULT
    }
}

impl RequestBounds {
    /// The default bounds ([`RequestBounds::default`]).
    pub const DEFAULT: RequestBounds = RequestBounds {
        max_domain_bytes: 256,
        max_key_bytes: 256,
        max_value_bytes: 65_536,
        max_hits_addend: u64::MAX,
        max_descriptors: 256,
        max_entries: 64,
    };

    /// Checks `request` against the bounds; the error names the first field past one.
    pub fn check(&self, request: &Request) -> Result<(), RequestError> {
        if self.within(request) {
            return Ok(());
        }
        self.first_past(request)
    }

    /// Whether every field of `request` is within the bounds: one pass of comparisons,
    /// without the error's bookkeeping (this runs on every request).
    #[inline]
    fn within(&self, request: &Request) -> bool {
        let mut within = request.domain.len() <= self.max_domain_bytes
            && u64::from(request.hits_addend) <= self.max_hits_addend
            && request.descriptors.len() <= self.max_descriptors;
        for descriptor in &request.descriptors {
            within &= descriptor
                .hits_addend
                .is_none_or(|value| value <= self.max_hits_addend)
                && descriptor.entries.len() <= self.max_entries;
            for entry in &descriptor.entries {
                within &= entry.key.len() <= self.max_key_bytes
                    && entry.value.len() <= self.max_value_bytes;
            }
        }
        within
    }

    /// The error naming the first field of `request` past a bound.
    #[cold]
    fn first_past(&self, request: &Request) -> Result<(), RequestError> {
        let too_long = |field: &dyn Fn() -> String, len: usize, max: usize| {
            if len > max {
                Err(RequestError::TooLong {
                    field: field(),
                    len,
                    max,
                })
            } else {
                Ok(())
            }
        };
        let addend = |field: &dyn Fn() -> String, value: u64| {
            if value > self.max_hits_addend {
                Err(RequestError::HitsAddendTooLarge {
                    field: field(),
                    value,
                    max: self.max_hits_addend,
                })
            } else {
                Ok(())
            }
        };
        too_long(
            &|| "domain".to_owned(),
            request.domain.len(),
            self.max_domain_bytes,
        )?;
        addend(&|| "hits_addend".to_owned(), request.hits_addend.into())?;
        let count = request.descriptors.len();
        Self::count("descriptors", count, self.max_descriptors)?;
        for (d, descriptor) in request.descriptors.iter().enumerate() {
            let entries = descriptor.entries.len();
            Self::count(
                &format!("descriptors[{d}].entries"),
                entries,
                self.max_entries,
            )?;
            for (e, entry) in descriptor.entries.iter().enumerate() {
                let at = |part: &str| format!("descriptors[{d}].entries[{e}].{part}");
                too_long(&|| at("key"), entry.key.len(), self.max_key_bytes)?;
                too_long(&|| at("value"), entry.value.len(), self.max_value_bytes)?;
            }
            if let Some(value) = descriptor.hits_addend {
                addend(&|| format!("descriptors[{d}].hits_addend"), value)?;
            }
        }
        Ok(())
    }

    /// `TooMany` when `count` of `field` is past `max` (a decoder that stops reading a
    /// list at its bound says so with this).
    pub fn count(field: &str, count: usize, max: usize) -> Result<(), RequestError> {
        if count <= max {
            return Ok(());
        }
        Err(RequestError::TooMany {
            field: field.to_owned(),
            max,
        })
    }
}

/// Why a request cannot be evaluated. The first three messages are envoyproxy/ratelimit's;
/// the others are the caller's mistakes that it does not check ([`RequestError::is_invalid_argument`]).
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
    /// A name is longer than [`RequestBounds`] allows.
    #[error("{field} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which name: `domain` or `descriptors[i].entries[j].key|value`.
        field: String,
        /// Its length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A list is longer than [`RequestBounds`] allows.
    #[error("{field} has more than {max} items; at most {max} are allowed")]
    TooMany {
        /// Which list: `descriptors` or `descriptors[i].entries`.
        field: String,
        /// The bound.
        max: usize,
    },
    /// A hits addend is larger than [`RequestBounds`] allows.
    #[error("{field} is {value}; at most {max} is allowed")]
    HitsAddendTooLarge {
        /// `hits_addend` or `descriptors[i].hits_addend`.
        field: String,
        /// The value sent.
        value: u64,
        /// The bound.
        max: u64,
    },
}

impl RequestError {
    /// Whether the caller sent something invalid (gRPC `INVALID_ARGUMENT`, HTTP 400), as
    /// opposed to the errors envoyproxy/ratelimit itself reports.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            RequestError::TooLong { .. }
                | RequestError::TooMany { .. }
                | RequestError::HitsAddendTooLarge { .. }
        )
    }
}
