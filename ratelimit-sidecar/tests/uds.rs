//! gRPC over `GRPC_UDS` from gRPC's C core (Python's grpcio), which names the socket in
//! `:authority` by its percent-encoded path: every client Envoy or a gRPC library
//! produces must be served, not only tonic's.

use ratelimit_tests::sidecar as support;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use prost::Message;
use support::{Options, Server, request, run_ok};

const RULES: &str =
    "domain: u\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 2}}]\n";

/// Calls ShouldRateLimit three times on one grpcio channel over the unix socket; each
/// answer is printed as hex, or `ERR <code> <details>`.
const CLIENT: &str = r#"
import sys, grpc
channel = grpc.insecure_channel("unix:" + sys.argv[1])
call = channel.unary_unary(
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    request_serializer=lambda b: b, response_deserializer=lambda b: b)
for _ in range(3):
    try:
        print(call(bytes.fromhex(sys.argv[2]), timeout=5).hex())
    except grpc.RpcError as e:
        print("ERR", e.code(), e.details())
"#;

#[test]
fn grpcio_is_served_over_the_unix_socket() {
    let python = std::env::var("GRPC_PYTHON").expect(
        "GRPC_PYTHON must name a Python with grpcio: run scripts/test.sh, which installs one",
    );
    let server = Server::start_with(Options {
        uds: true,
        ..Options::rules(RULES)
    });
    let socket = server.uds.clone().expect("a unix socket");
    let body = request("u", &[&[("user", "py")]]).encode_to_vec();
    let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
    let stdout = run_ok(
        std::process::Command::new(python)
            .args(["-c", CLIENT])
            .arg(&socket)
            .arg(hex),
    );
    let codes: Vec<i32> = stdout
        .lines()
        .map(|line| {
            let bytes: Vec<u8> = (0..line.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&line[i..i + 2], 16))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|_| panic!("not an answer: {line}\n{}", server.log()));
            RateLimitResponse::decode(bytes.as_slice())
                .unwrap()
                .overall_code
        })
        .collect();
    // OK, OK, then OVER_LIMIT: the same counter, over one channel's three requests.
    assert_eq!(codes, [1, 1, 2], "{stdout}");
}
