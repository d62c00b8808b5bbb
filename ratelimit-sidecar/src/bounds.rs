//! Settings that bound what callers can make the service hold (our additions; upstream
//! has none): name lengths and addends in requests, the memory backend's bytes, and the
//! HTTP listeners' connections.

use std::time::Duration;

use clap::Args;
use ratelimit_core::RequestBounds;

use crate::serve::{ConnectionLimits, ConnectionSlots};
use crate::settings::go_duration;

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

/// Connection limits of an HTTP listener (the intake uses them too).
#[derive(Clone, Debug, Args)]
pub struct HttpLimitsSettings {
    /// Time a client has to send a request's headers, from the connection's start or
    /// its previous response (so also how long a keep-alive connection may sit idle).
    #[arg(long, env, default_value = "10s", value_parser = go_duration)]
    pub http_header_read_timeout: Duration,
    /// A connection that moves no byte for this long is closed (a stalled body).
    #[arg(long, env, default_value = "60s", value_parser = go_duration)]
    pub http_idle_timeout: Duration,
    /// Open connections per listener at most (every worker's HTTP listener counts as one
    /// listener); more wait in the listen backlog.
    #[arg(long, env, default_value_t = 1024)]
    pub http_max_connections: usize,
}

impl HttpLimitsSettings {
    /// The limits for [`crate::serve::serve`].
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: self.http_header_read_timeout,
            idle_timeout: self.http_idle_timeout,
        }
    }

    /// A new connection cap of HTTP_MAX_CONNECTIONS, for one listener.
    pub fn connection_slots(&self) -> ConnectionSlots {
        ConnectionSlots::new(self.http_max_connections)
    }
}

impl BoundsSettings {
    /// The core's request bounds.
    pub fn request_bounds(&self) -> RequestBounds {
        RequestBounds {
            max_domain_bytes: self.max_domain_bytes,
            max_key_bytes: self.max_descriptor_key_bytes,
            max_value_bytes: self.max_descriptor_value_bytes,
            max_hits_addend: self.max_hits_addend,
        }
    }
}
