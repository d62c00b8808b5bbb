//! gRPC callouts: `proxy_grpc_call` records them, and [`forward`] sends them to a real
//! rate-limit service once the request's headers have been handled.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use prost::Message;
use wasmtime::{Caller, Linker};

use super::memory::{read, read_string, write_u32};
use super::{
    BAD_ARGUMENT, Callout, GRPC_DEADLINE_EXCEEDED, GRPC_UNAVAILABLE, Host, OK, host_function,
};

pub(super) fn define(linker: &mut Linker<Host>) {
    host_function(
        linker,
        "proxy_grpc_call",
        |mut c: Caller<'_, Host>,
         up: i32,
         ul: i32,
         sp: i32,
         sl: i32,
         mp: i32,
         ml: i32,
         _hp: i32,
         _hl: i32,
         bp: i32,
         bl: i32,
         timeout_ms: i32,
         token_out: i32| {
            let cluster = read_string(&mut c, up, ul);
            if !c.data().upstreams.contains_key(&cluster) {
                return BAD_ARGUMENT;
            }
            c.data_mut().next_token += 1;
            let token = c.data().next_token;
            let callout = Callout {
                token,
                cluster,
                service: read_string(&mut c, sp, sl),
                method: read_string(&mut c, mp, ml),
                message: read(&mut c, bp, bl),
                timeout: Duration::from_millis(timeout_ms as u32 as u64),
            };
            c.data_mut().callouts.push(callout);
            write_u32(&mut c, token_out, token);
            OK
        },
    );
}

/// Calls the rate-limit service at `url` with the filter's serialized request; the
/// serialized response, or a gRPC status code.
pub(super) fn forward(url: &str, message: &[u8], timeout: Duration) -> Result<Vec<u8>, u32> {
    let request =
        RateLimitRequest::decode(message).expect("the filter sends a valid RateLimitRequest");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let call = async {
            let mut client = RateLimitServiceClient::connect(url.to_owned())
                .await
                .map_err(|_| GRPC_UNAVAILABLE)?;
            client
                .should_rate_limit(request)
                .await
                .map(|r| r.into_inner().encode_to_vec())
                .map_err(|status| status.code() as u32)
        };
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(GRPC_DEADLINE_EXCEEDED))
    })
}
