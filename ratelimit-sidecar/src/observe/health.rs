//! Health components, reported on `/healthcheck` and gRPC `grpc.health.v1.Health`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::{Stream, StreamExt, stream};
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_check_response::ServingStatus::ServiceUnknown;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse, health_server};
use tonic_health::server::{HealthReporter, HealthService};

/// The gRPC health service name that follows overall health.
pub const SERVICE_NAME: &str = "ratelimit";

/// Overall health is healthy only when every enabled component is.
#[derive(Debug)]
pub struct Health {
    backend: AtomicBool,
    /// Present when HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED is on.
    config: Option<AtomicBool>,
    sigterm: AtomicBool,
    reporter: HealthReporter,
}

impl Health {
    /// All components healthy, except the configuration one when it is required.
    pub fn new(require_config: bool, reporter: HealthReporter) -> Health {
        Health {
            backend: AtomicBool::new(true),
            config: require_config.then(|| AtomicBool::new(false)),
            sigterm: AtomicBool::new(true),
            reporter,
        }
    }

    /// The first failing component, or `None` when healthy.
    pub fn failing(&self) -> Option<&'static str> {
        if !self.sigterm.load(Ordering::Acquire) {
            Some("sigterm")
        } else if !self.backend.load(Ordering::Acquire) {
            Some("backend")
        } else if self
            .config
            .as_ref()
            .is_some_and(|c| !c.load(Ordering::Acquire))
        {
            Some("config")
        } else {
            None
        }
    }

    /// A configuration was loaded with `domains` domains (only matters when required).
    pub async fn config_loaded(&self, domains: usize) {
        if let Some(config) = &self.config {
            config.store(domains > 0, Ordering::Release);
            self.publish().await;
        }
    }

    /// Whether the counter store is reachable.
    pub async fn set_backend(&self, healthy: bool) {
        if self.backend.swap(healthy, Ordering::AcqRel) != healthy {
            self.publish().await;
        }
    }

    /// SIGTERM arrived: unhealthy from now on.
    pub async fn terminating(&self) {
        self.sigterm.store(false, Ordering::Release);
        self.publish().await;
    }

    /// Sends the overall state to the gRPC health service.
    pub async fn publish(&self) {
        let status = if self.failing().is_none() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.reporter.set_service_status(SERVICE_NAME, status).await;
    }
}

/// `grpc.health.v1.Health` as grpc-go serves it for upstream: tonic's service for the
/// names registered (`""` and [`SERVICE_NAME`]); for any other, `Check` is NOT_FOUND
/// `unknown service`, and `Watch` sends SERVICE_UNKNOWN and stays open, as it would until
/// such a service were registered.
#[derive(Debug)]
pub struct GrpcHealth(pub HealthService);

/// What `Watch` streams.
type Statuses = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

impl GrpcHealth {
    fn registered(request: &Request<HealthCheckRequest>) -> bool {
        matches!(request.get_ref().service.as_str(), "" | SERVICE_NAME)
    }
}

#[tonic::async_trait]
impl health_server::Health for GrpcHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        if !GrpcHealth::registered(&request) {
            return Err(Status::not_found("unknown service"));
        }
        self.0.check(request).await
    }

    type WatchStream = Statuses;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Statuses>, Status> {
        if !GrpcHealth::registered(&request) {
            let unknown = HealthCheckResponse {
                status: ServiceUnknown as i32,
            };
            let open = stream::once(async move { Ok(unknown) }).chain(stream::pending());
            return Ok(Response::new(Box::pin(open)));
        }
        let watched = self.0.watch(request).await?.into_inner();
        Ok(Response::new(Box::pin(watched)))
    }
}
