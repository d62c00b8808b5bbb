//! A ShouldRateLimit load generator: `rls-load ADDRESS KEYS [SECONDS] [CONNECTIONS] [STREAMS]`.
//!
//! Opens CONNECTIONS HTTP/2 connections with STREAMS requests in flight on each, sends
//! `client=<key>` descriptors cycling over KEYS distinct values for SECONDS, and prints
//! requests/s, p50 and p99 latency. Requests are encoded once, up front, and sent with a
//! bare HTTP/2 client on one thread, so that the generator costs far less per request
//! than any gRPC server it measures. `rls-load --frame FILE` writes one request frame
//! (for h2load's `-d`) instead.

use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use ratelimit_load_bench::request;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--frame") {
        std::fs::write(args.get(1).ok_or("--frame FILE")?, grpc_frame("client-0"))?;
        return Ok(());
    }
    let address = args
        .first()
        .ok_or("usage: rls-load ADDRESS KEYS [SECONDS] [CONNECTIONS] [STREAMS]")?
        .clone();
    let keys: usize = args.get(1).map_or(Ok(1), |k| k.parse())?;
    let seconds: u64 = args.get(2).map_or(Ok(10), |s| s.parse())?;
    let connections: usize = args.get(3).map_or(Ok(4), |c| c.parse())?;
    let streams: usize = args.get(4).map_or(Ok(16), |s| s.parse())?;
    let frames: Vec<Bytes> = (0..keys)
        .map(|i| grpc_frame(&format!("client-{i}")))
        .collect();

    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let tcp = tokio::net::TcpStream::connect(&address).await?;
        tcp.set_nodelay(true)?;
        let (client, connection) = h2::client::handshake(tcp).await?;
        tokio::spawn(connection);
        for s in 0..streams {
            let client = client.clone();
            let frames = frames.clone();
            let uri = format!("http://{address}{PATH}");
            let first = c * streams + s;
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 16);
                let mut errors = 0u64;
                let mut i = first;
                while Instant::now() < deadline {
                    let started = Instant::now();
                    if call(client.clone(), &uri, frames[i % frames.len()].clone())
                        .await
                        .is_err()
                    {
                        errors += 1;
                    }
                    latencies
                        .push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
                    i += connections * streams;
                }
                (latencies, errors)
            }));
        }
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (latencies, e) = task.await?;
        all.extend(latencies);
        errors += e;
    }
    all.sort_unstable();
    let at = |q: f64| {
        let index = ((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1));
        all.get(index).copied().unwrap_or(0)
    };
    println!(
        "keys={keys} requests={} errors={errors} rps={:.0} p50_us={} p99_us={}",
        all.len(),
        all.len() as f64 / seconds as f64,
        at(0.50),
        at(0.99)
    );
    Ok(())
}

/// One request as a gRPC message frame: flag byte, length, protobuf.
fn grpc_frame(value: &str) -> Bytes {
    let body = request(value).encode_to_vec();
    let mut frame = Vec::with_capacity(body.len() + 5);
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

/// One unary call; an error unless the trailers say `grpc-status: 0`.
async fn call(
    client: h2::client::SendRequest<Bytes>,
    uri: &str,
    frame: Bytes,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = client.ready().await?;
    let request = http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (response, mut send) = client.send_request(request, false)?;
    send.send_data(frame, true)?;
    let mut body = response.await?.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        body.flow_control().release_capacity(chunk.len())?;
    }
    let trailers = body.trailers().await?.ok_or("no trailers")?;
    match trailers.get("grpc-status").map(|v| v.as_bytes()) {
        Some(b"0") => Ok(()),
        other => Err(format!("grpc-status {other:?}").into()),
    }
}
