//! `envoy.service.ratelimit.v3.RateLimitService` over tonic.
//!
//! The service is wired by hand rather than with the generated server so that its codec
//! can answer a body that is not a `RateLimitRequest` with `INVALID_ARGUMENT` (the
//! generated prost codec says `INTERNAL`, which reads as the server's fault).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::future::{Either, Ready, ready};
use prost::Message;
use prost::bytes::Buf;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::server::{NamedService, UnaryService};
use tonic::{Request, Response, Status};

use crate::backend::BackendError;
use crate::service::{Service as Decider, ServiceError};

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The gRPC face of the decision service: serves `ShouldRateLimit`.
#[derive(Clone, Debug)]
pub struct Grpc(pub Arc<Decider>);

impl NamedService for Grpc {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<B> Service<http::Request<B>> for Grpc
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let status = Status::unimplemented(format!(
                "{} is not a method of this server",
                request.uri().path()
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let method = ShouldRateLimit(Arc::clone(&self.0));
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RlsCodec);
            Ok(grpc.unary(method, request).await)
        })
    }
}

struct ShouldRateLimit(Arc<Decider>);

/// What a call answers.
type Answer = Result<Response<RateLimitResponse>, Status>;

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    /// A decision that waits for nothing (the memory store) is ready when the call
    /// returns, so only one that waits for a backend is boxed.
    type Future = Either<Ready<Answer>, BoxFuture<Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let (metadata, _, request) = request.into_parts();
        if let Some(store) = self.0.decides_now() {
            let answer = self.0.should_rate_limit_grpc_now(store, request);
            return Either::Left(ready(
                answer.map(Response::new).map_err(|error| status(&error)),
            ));
        }
        let service = Arc::clone(&self.0);
        Either::Right(Box::pin(async move {
            service
                .should_rate_limit_grpc(request, &metadata.into_headers())
                .await
                .map(Response::new)
                .map_err(|error| status(&error))
        }))
    }
}

/// envoyproxy/ratelimit answers its own request errors with `UNKNOWN` and the message;
/// an override with an unknown unit (which crashes upstream) or a request past the bounds
/// (which upstream does not check) is `INVALID_ARGUMENT`, and a
/// failing counter store `UNAVAILABLE` (upstream says `UNKNOWN`), so callers may retry.
fn status(error: &ServiceError) -> Status {
    match error {
        ServiceError::Invalid(e) => Status::invalid_argument(e.to_string()),
        ServiceError::Request(e) if e.is_invalid_argument() => {
            Status::invalid_argument(e.to_string())
        }
        ServiceError::Request(e) => Status::unknown(e.to_string()),
        ServiceError::Backend(e @ BackendError::Key(_)) => Status::invalid_argument(e.to_string()),
        ServiceError::Backend(e) => Status::unavailable(e.to_string()),
        ServiceError::Overloaded(e) => Status::resource_exhausted(e.to_string()),
    }
}

/// Protobuf in both directions; a request that does not decode is the caller's error.
#[derive(Clone, Copy, Debug, Default)]
struct RlsCodec;

impl Codec for RlsCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = RlsCodec;
    type Decoder = RlsCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RlsCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RlsCodec
    }
}

impl Encoder for RlsCodec {
    type Item = RateLimitResponse;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf)
            .map_err(|error| Status::internal(format!("cannot encode the response: {error}")))
    }
}

impl Decoder for RlsCodec {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        // Tonic hands over the whole message in one buffer, and prost reads a slice for
        // three quarters of what it spends through the buffer's cursor (a split buffer, which
        // a later tonic could pass, is read as it comes).
        let len = buf.remaining();
        let decoded = if buf.chunk().len() == len {
            let decoded = RateLimitRequest::decode(buf.chunk());
            buf.advance(len);
            decoded
        } else {
            RateLimitRequest::decode(buf.copy_to_bytes(len))
        };
        decoded.map(Some).map_err(|error| {
            Status::invalid_argument(format!("the body is not a RateLimitRequest: {error}"))
        })
    }
}
