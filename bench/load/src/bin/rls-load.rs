//! A ShouldRateLimit load generator: `rls-load ADDRESS KEYS [SECONDS] [CONNECTIONS] [STREAMS]`.
//!
//! Opens CONNECTIONS HTTP/2 connections with STREAMS requests in flight on each, sends
//! `client=<key>` descriptors cycling over KEYS distinct values for SECONDS, and prints
//! requests/s, p50 and p99 latency. `rls-load --frame FILE` writes one request as a gRPC
//! frame for h2load instead.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use prost::Message;
use ratelimit_load_bench::request;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--frame") {
        let body = request("hot").encode_to_vec();
        let mut frame = vec![0u8];
        frame.extend_from_slice(&u32::try_from(body.len())?.to_be_bytes());
        frame.extend_from_slice(&body);
        std::fs::write(args.get(1).ok_or("--frame FILE")?, frame)?;
        return Ok(());
    }
    let address = format!(
        "http://{}",
        args.first()
            .ok_or("usage: rls-load ADDRESS KEYS [SECONDS] [CONNECTIONS] [STREAMS]")?
    );
    let keys: usize = args.get(1).map_or(Ok(1), |k| k.parse())?;
    let seconds: u64 = args.get(2).map_or(Ok(10), |s| s.parse())?;
    let connections: usize = args.get(3).map_or(Ok(4), |c| c.parse())?;
    let streams: usize = args.get(4).map_or(Ok(16), |s| s.parse())?;
    let values: Vec<String> = (0..keys).map(|i| format!("client-{i}")).collect();

    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let channel = tonic::transport::Endpoint::from_shared(address.clone())?
            .tcp_nodelay(true)
            .connect()
            .await?;
        for s in 0..streams {
            let mut client = RateLimitServiceClient::new(channel.clone());
            let values = values.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 16);
                let mut errors = 0u64;
                let mut i = c * streams + s;
                while Instant::now() < deadline {
                    let started = Instant::now();
                    if client
                        .should_rate_limit(request(&values[i % values.len()]))
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
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
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
