//! `envoy.service.ratelimit.v3.RateLimitService` over tonic.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::service::{Service, ServiceError};

/// The gRPC face of [`Service`].
#[derive(Clone, Debug)]
pub struct Grpc(pub Arc<Service>);

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.0
            .should_rate_limit(request.into_inner())
            .await
            .map(Response::new)
            .map_err(|error| status(&error))
    }
}

/// envoyproxy/ratelimit answers its own request errors with `UNKNOWN` and the message;
/// an override with an unknown unit (which crashes upstream) is `INVALID_ARGUMENT`, and a
/// failing counter store `UNAVAILABLE` (upstream says `UNKNOWN`), so callers may retry.
fn status(error: &ServiceError) -> Status {
    match error {
        ServiceError::Invalid(e) => Status::invalid_argument(e.to_string()),
        ServiceError::Request(e) => Status::unknown(e.to_string()),
        ServiceError::Backend(e) => Status::unavailable(e.to_string()),
    }
}
