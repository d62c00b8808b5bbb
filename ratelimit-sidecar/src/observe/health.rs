//! Health components, reported on `/healthcheck` and gRPC `grpc.health.v1.Health`.

use std::sync::atomic::{AtomicBool, Ordering};

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

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
