//! The decision service shared by the gRPC and HTTP front ends.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratelimit_core::stats::{Counter, Timer, names};
use ratelimit_core::{CounterStore, Explanation, HeaderNames, Limiter, RequestError, Response};
use ratelimit_proto::envoy::{InvalidRequest, request_from_pb, response_to_pb};

use crate::backend::{Backend, BackendError};
use crate::health::Health;
use crate::metadata::dynamic_metadata;

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The request is malformed beyond what envoyproxy/ratelimit reports (a bad override).
    #[error("{0}")]
    Invalid(#[from] InvalidRequest),
    /// Empty domain, no descriptors, or no configuration loaded.
    #[error("{0}")]
    Request(#[from] RequestError),
    /// The counter store failed or did not answer in time.
    #[error("{0}")]
    Backend(#[from] BackendError),
}

/// What the last configuration load did.
#[derive(Clone, Debug)]
pub struct LoadResult {
    /// Unix seconds.
    pub at: u64,
    /// The domains loaded, or the error that kept the previous rules.
    pub outcome: Result<Vec<String>, String>,
}

/// The gRPC method whose statistics the service keeps, as envoyproxy/ratelimit names it.
const METHOD: &str = "ShouldRateLimit";

/// The running service: rules, counters, health and statistics.
#[derive(Debug)]
pub struct Service {
    /// The rules and the engine.
    pub limiter: Limiter,
    /// The counter store.
    pub backend: Backend,
    /// Health components.
    pub health: Health,
    /// Header names when LIMIT_RESPONSE_HEADERS_ENABLED is on.
    pub headers: Option<HeaderNames>,
    /// RESPONSE_DYNAMIC_METADATA.
    pub dynamic_metadata: bool,
    /// The result of the last configuration load.
    pub last_load: std::sync::Mutex<Option<LoadResult>>,
    response_time: Arc<Timer>,
    total_requests: Arc<Counter>,
    service_errors: Arc<Counter>,
}

impl Service {
    /// A service around `limiter` and `backend`.
    pub fn new(
        limiter: Limiter,
        backend: Backend,
        health: Health,
        headers: Option<HeaderNames>,
        dynamic_metadata: bool,
    ) -> Service {
        let stats = limiter.stats();
        Service {
            total_requests: stats.counter(&names::total_requests(METHOD)),
            service_errors: stats.counter(names::SERVICE_ERROR),
            response_time: stats.timer(&names::response_time(METHOD)),
            limiter,
            backend,
            health,
            headers,
            dynamic_metadata,
            last_load: std::sync::Mutex::new(None),
        }
    }

    /// Decides one request from gRPC, counted in `ratelimit_server.ShouldRateLimit.*`
    /// as upstream's gRPC interceptor counts every call.
    pub async fn should_rate_limit_grpc(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, ServiceError> {
        let started = std::time::Instant::now();
        self.total_requests.add(1);
        let result = self.should_rate_limit(request).await;
        self.response_time.record(started.elapsed());
        result
    }

    /// Decides one request (`/json` comes here directly, not counted as a gRPC call, as
    /// upstream's handler does).
    pub async fn should_rate_limit(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, ServiceError> {
        let result = self.decide(request).await;
        if matches!(
            result,
            Err(ServiceError::Invalid(_) | ServiceError::Request(_))
        ) {
            self.service_errors.add(1);
        }
        result
    }

    async fn decide(&self, request: RateLimitRequest) -> Result<RateLimitResponse, ServiceError> {
        let request = request_from_pb(request)?;
        let now = unix_now();
        let response = match &self.backend {
            Backend::Memory(store) => self.limiter.should_rate_limit(&request, &**store, now)?,
            Backend::Remote(remote) => {
                let mut plan = self.limiter.plan(&request, now)?;
                let counts = remote.run(&mut plan).await?;
                plan.decide(&counts)
            }
        };
        let mut answer = response_to_pb(&response, self.headers.as_ref());
        if self.dynamic_metadata {
            answer.dynamic_metadata = Some(dynamic_metadata(&request, &response));
        }
        Ok(answer)
    }
}

impl Service {
    /// Why `request` would get its answer, the counters' current values, and that
    /// answer, without counting anything.
    pub async fn explain(
        &self,
        request: RateLimitRequest,
    ) -> Result<(Explanation, Vec<u64>, Response), ServiceError> {
        let request = request_from_pb(request)?;
        let now = unix_now();
        let explanation = self.limiter.explain(&request, now)?;
        let current = match &self.backend {
            Backend::Memory(store) => explanation
                .increments()
                .iter()
                .map(|increment| store.get(&increment.key, now))
                .collect(),
            Backend::Remote(remote) => remote.current(explanation.increments()).await?,
        };
        let answer = explanation.answer(&current);
        Ok((explanation, current, answer))
    }
}

/// The current unix time in seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
