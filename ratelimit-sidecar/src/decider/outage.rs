//! What the service answers while its remote store is unavailable
//! (`BACKEND_FAILURE_MODE`), and the bound on requests decided at once
//! (`MAX_INFLIGHT_REQUESTS`).

use ratelimit_core::UnixMillis;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use ratelimit_core::stats::names::{FALLBACK_ALLOWED, FALLBACK_LOCAL, INFLIGHT_REJECTED};
use ratelimit_core::stats::{Counter, StatsRegistry};
use ratelimit_core::{Limiter, MemoryStore, Request, Response};

use crate::backend::BackendError;
use crate::settings::{FailureMode, OutageSettings};

/// Counters of the `local` fallback: at most this many (a bounded store).
const LOCAL_COUNTERS: usize = 1 << 16;

/// The failure mode and the bound on work in flight.
#[derive(Debug)]
pub struct Outage {
    mode: FailureMode,
    replicas: u32,
    /// The `local` mode's counters, replaced by an empty store once the remote one
    /// answers again.
    local: ArcSwap<MemoryStore>,
    local_used: AtomicBool,
    allowed: Arc<Counter>,
    decided_locally: Arc<Counter>,
    /// Requests being decided now.
    inflight: AtomicUsize,
    max_inflight: usize,
    rejected: Arc<Counter>,
}

/// A request's place among those being decided, given back when it is dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a request was not decided.
#[derive(Debug, thiserror::Error)]
#[error("{0} requests are being decided (MAX_INFLIGHT_REQUESTS); try again")]
pub struct Overloaded(pub usize);

impl Outage {
    /// From the settings; `max_inflight` is MAX_INFLIGHT_REQUESTS resolved (never 0).
    pub fn new(settings: &OutageSettings, max_inflight: usize, stats: &StatsRegistry) -> Outage {
        Outage {
            mode: settings.backend_failure_mode,
            replicas: settings.backend_fallback_replicas,
            local: ArcSwap::from_pointee(MemoryStore::new(LOCAL_COUNTERS)),
            local_used: AtomicBool::new(false),
            allowed: stats.counter(FALLBACK_ALLOWED),
            decided_locally: stats.counter(FALLBACK_LOCAL),
            inflight: AtomicUsize::new(0),
            max_inflight: max_inflight.max(1),
            rejected: stats.counter(INFLIGHT_REJECTED),
        }
    }

    /// BACKEND_FALLBACK_REPLICAS: the sidecar replicas that share the backend.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// A place among the requests being decided, or `Overloaded` at once.
    pub fn enter(&self) -> Result<InFlight<'_>, Overloaded> {
        // Nobody waits for a place, so a count is all it takes; it only goes up below the
        // bound, so a refused request never holds a place another could have had.
        let taken = self
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_inflight).then_some(n + 1)
            });
        if taken.is_err() {
            self.rejected.add(1);
            return Err(Overloaded(self.max_inflight));
        }
        Ok(InFlight(&self.inflight))
    }

    /// The answer to `request` when the store failed with `error`. A call its caller's
    /// own deadline ended ([`BackendError::CallerDeadline`]) is not the store's failure:
    /// it is never allowed outright (a caller could skip its limit by choosing a short
    /// deadline), only decided locally under `local`.
    pub fn answer(
        &self,
        limiter: &Limiter,
        request: &Request,
        now_ms: u64,
        error: BackendError,
    ) -> Result<Response, BackendError> {
        let caller_late = matches!(error, BackendError::CallerDeadline(_));
        match self.mode {
            FailureMode::Error => Err(error),
            FailureMode::Allow if caller_late => Err(error),
            FailureMode::Allow => {
                self.allowed.add(1);
                Ok(Response::allowed_without_limits(request))
            }
            FailureMode::Local => {
                self.decided_locally.add(1);
                self.local_used.store(true, Ordering::Release);
                let store = self.local.load();
                limiter
                    .should_rate_limit(
                        request,
                        &**store,
                        UnixMillis(now_ms).shared_by(self.replicas),
                    )
                    .map_err(|e| BackendError::Unavailable(e.to_string()))
            }
        }
    }

    /// The store answered: counts made locally during an outage are dropped.
    pub fn recovered(&self) {
        if self.local_used.load(Ordering::Acquire) && self.local_used.swap(false, Ordering::AcqRel)
        {
            self.local.store(Arc::new(MemoryStore::new(LOCAL_COUNTERS)));
            tracing::warn!("the backend answers again: local fallback counts dropped");
        }
    }
}
