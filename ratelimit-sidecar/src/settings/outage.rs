//! What the service does while a remote store is failing (ours; upstream has none).

use std::time::Duration;

use clap::Args;

use ratelimit_service_kit::values::go_duration;

/// Settings for surviving a backend outage and bounding work in flight.
#[derive(Clone, Debug, Args)]
pub struct OutageSettings {
    /// Failed or timed-out calls in a row to one backend node that open its circuit breaker.
    #[arg(long, env, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub backend_breaker_failures: u32,
    /// How long an open breaker keeps calls from its node before one probe.
    #[arg(long, env, default_value = "1s", value_parser = go_duration)]
    pub backend_breaker_open_duration: Duration,
    /// The answer while the backend is unavailable: error (UNAVAILABLE / 500), allow
    /// (OK), or local (decide in memory with every limit divided by
    /// BACKEND_FALLBACK_REPLICAS).
    #[arg(long, env, default_value = "error", value_enum)]
    pub backend_failure_mode: FailureMode,
    /// Sidecar replicas sharing the backend: in local mode each allows limit/N; the Rate
    /// Limit Quota Service takes each to serve as many Envoys as this one (even shares).
    #[arg(long, env, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub backend_fallback_replicas: u32,
    /// Requests decided at once; more get RESOURCE_EXHAUSTED / 503 at once (0: 1024 per
    /// worker).
    #[arg(long, env, default_value_t = 0)]
    pub max_inflight_requests: usize,
}

/// `BACKEND_FAILURE_MODE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailureMode {
    /// UNAVAILABLE (gRPC) or 500 (HTTP), so that Envoy's failure_mode_deny decides.
    Error,
    /// OK, counted in ratelimit.service.backend_fallback_allowed.
    Allow,
    /// Decided in process against limit/BACKEND_FALLBACK_REPLICAS.
    Local,
}
