//! The tonic reference: a generated RateLimitService that answers OK without deciding anything,
//! on a single-threaded runtime (the fastest tonic serves on one core; a multi-thread
//! runtime would add its scheduler's cost and flatter the server compared).
//! `rls-tonic 127.0.0.1:PORT`

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct AlwaysOk;

#[tonic::async_trait]
impl RateLimitService for AlwaysOk {
    async fn should_rate_limit(
        &self,
        _: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..RateLimitResponse::default()
        }))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    ratelimit_load_bench::exit_on_sigterm()?;
    serve()
}

#[tokio::main(flavor = "current_thread")]
async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18081".into())
        .parse()?;
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(RateLimitServiceServer::new(AlwaysOk))
        .serve(address)
        .await?;
    Ok(())
}
