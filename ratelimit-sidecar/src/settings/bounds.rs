//! Settings that bound what callers can make the service hold (our additions; upstream
//! has none): name lengths and addends in requests, the memory backend's bytes, and the
//! HTTP listeners' connections.

use clap::Args;
use ratelimit_core::RequestBounds;

use ratelimit_service_kit::serve::HttpLimitsSettings;

/// Bounds on requests, memory and connections.
#[derive(Clone, Debug, Args)]
pub struct BoundsSettings {
    /// Longest domain accepted, in bytes; a longer one is INVALID_ARGUMENT / 400.
    #[arg(long, env, default_value_t = 256)]
    pub max_domain_bytes: usize,
    /// Longest descriptor entry key accepted, in bytes.
    #[arg(long, env, default_value_t = 256)]
    pub max_descriptor_key_bytes: usize,
    /// Longest descriptor entry value accepted, in bytes (above Envoy's 60 KiB default
    /// for all request headers, so no header Envoy accepts is refused).
    #[arg(long, env, default_value_t = 65_536)]
    pub max_descriptor_value_bytes: usize,
    /// Largest hits_addend accepted, for the request and for each descriptor (by default
    /// the whole uint64 range, as upstream; counters saturate, they never wrap).
    #[arg(long, env, default_value_t = u64::MAX, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_hits_addend: u64,
    /// Most descriptors in one request; a request with more is INVALID_ARGUMENT / 400,
    /// and a gRPC message is decoded no further than the bound.
    #[arg(long, env, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_descriptors: u64,
    /// Most entries in one descriptor, likewise.
    #[arg(long, env, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_descriptor_entries: u64,
    /// Distinct statistic names built from request data (unknown domains,
    /// detailed_metric, value_to_metric, limit overrides); later ones fold into one
    /// `_overflow` name per rule and count ratelimit.service.stats_overflow.
    #[arg(long, env, default_value_t = ratelimit_core::stats::DEFAULT_MAX_STAT_KEYS)]
    pub max_stat_keys: usize,
    /// Bytes the memory backend's counters and keys take at most.
    #[arg(long, env, default_value_t = ratelimit_core::DEFAULT_MAX_BYTES)]
    pub memory_max_bytes: usize,
    /// Connection limits of the HTTP and debug listeners.
    #[command(flatten)]
    pub http: HttpLimitsSettings,
}

impl BoundsSettings {
    /// The core's request bounds.
    pub fn request_bounds(&self) -> RequestBounds {
        RequestBounds {
            max_domain_bytes: self.max_domain_bytes,
            max_key_bytes: self.max_descriptor_key_bytes,
            max_value_bytes: self.max_descriptor_value_bytes,
            max_hits_addend: self.max_hits_addend,
            max_descriptors: usize::try_from(self.max_descriptors).unwrap_or(usize::MAX),
            max_entries: usize::try_from(self.max_descriptor_entries).unwrap_or(usize::MAX),
        }
    }
}
