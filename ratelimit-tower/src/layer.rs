//! The layer and what it is configured with.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::request::Parts;
use ratelimit_core::{CounterStore, Descriptor, HeaderFormat, HeaderNames, Limiter, MemoryStore};

/// The time decisions are made at, in unix milliseconds.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A layer configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayerError {
    /// [`HeaderFormat::IetfDraft11`] lists every limit that applied, which the limiter
    /// reports only when built with `Settings::report_policies`.
    #[error("the ietf-draft-11 header format needs a limiter built with report_policies: true")]
    PoliciesNotReported,
    /// A header name of [`HeaderNames`] that HTTP does not allow.
    #[error("'{0}' is not a valid HTTP header name")]
    InvalidHeaderName(String),
}

/// Rate-limits the requests of the service it wraps: see the crate's documentation.
pub struct RateLimitLayer<F, S = MemoryStore> {
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) domain: Arc<str>,
    pub(crate) descriptors: Arc<F>,
    pub(crate) store: Arc<S>,
    pub(crate) format: Arc<HeaderFormat>,
    pub(crate) clock: Clock,
}

impl<F> RateLimitLayer<F, MemoryStore>
where
    F: Fn(&Parts) -> Vec<Descriptor> + Send + Sync + 'static,
{
    /// A layer deciding the descriptors `descriptors` builds from each request (no
    /// descriptor: the request is not limited) in `domain`, against a [`MemoryStore`] of
    /// its own, with the `RateLimit-Limit`, `-Remaining` and `-Reset` headers and the
    /// system clock.
    pub fn new(limiter: Arc<Limiter>, domain: impl Into<Arc<str>>, descriptors: F) -> Self {
        RateLimitLayer {
            limiter,
            domain: domain.into(),
            descriptors: Arc::new(descriptors),
            store: Arc::new(MemoryStore::default()),
            format: Arc::new(HeaderFormat::RateLimit(HeaderNames::default())),
            clock: Arc::new(system_clock),
        }
    }
}

impl<F, S> RateLimitLayer<F, S> {
    /// The same layer counting in `store` (shared with other layers or services, or a
    /// store of your own).
    pub fn with_store<T: CounterStore + Send + Sync + 'static>(
        self,
        store: Arc<T>,
    ) -> RateLimitLayer<F, T> {
        RateLimitLayer {
            limiter: self.limiter,
            domain: self.domain,
            descriptors: self.descriptors,
            store,
            format: self.format,
            clock: self.clock,
        }
    }

    /// The same layer answering with headers in `format`.
    pub fn with_header_format(mut self, format: HeaderFormat) -> Result<Self, LayerError> {
        match &format {
            HeaderFormat::IetfDraft11 if !self.limiter.settings().report_policies => {
                return Err(LayerError::PoliciesNotReported);
            }
            HeaderFormat::RateLimit(names) => {
                for name in [&names.limit, &names.remaining, &names.reset] {
                    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                        return Err(LayerError::InvalidHeaderName(name.clone()));
                    }
                }
            }
            HeaderFormat::IetfDraft11 => {}
        }
        self.format = Arc::new(format);
        Ok(self)
    }

    /// The same layer deciding at the time `clock` gives (unix milliseconds).
    pub fn with_clock(mut self, clock: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }
}

/// Unix milliseconds from the system clock.
fn system_clock() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

impl<F, S> Clone for RateLimitLayer<F, S> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: Arc::clone(&self.limiter),
            domain: Arc::clone(&self.domain),
            descriptors: Arc::clone(&self.descriptors),
            store: Arc::clone(&self.store),
            format: Arc::clone(&self.format),
            clock: Arc::clone(&self.clock),
        }
    }
}

impl<F, S> fmt::Debug for RateLimitLayer<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("domain", &self.domain)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}
