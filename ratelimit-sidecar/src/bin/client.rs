//! `ratelimit-client`: sends one ShouldRateLimit request and prints the response.
//!
//! `ratelimit-client -dial_string localhost:8081 -domain edge -descriptors user=alice,method=POST`
//! (`-descriptors` may be repeated: one descriptor each).

use std::process::ExitCode;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_sidecar::cli::Flags;
use ratelimit_sidecar::json::render_response;

const USAGE: &str = "usage: ratelimit-client [-dial_string host:port] -domain DOMAIN -descriptors k=v[,k2=v2] [-descriptors ...]
  -dial_string  the server's gRPC address (default localhost:8081)
  -domain       the rate limit domain (required)
  -descriptors  one descriptor: its entries as k=v pairs joined by commas; repeat for more
Flags take one dash or two (-domain, --domain), and their value after a space or '='.";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let flags = Flags::parse(std::env::args().skip(1), &[]).map_err(|e| format!("{e}\n{USAGE}"))?;
    if flags.wants_help() {
        println!("{USAGE}");
        return Ok(());
    }
    if let Some(flag) = flags.unknown(&["dial_string", "domain", "descriptors"]) {
        return Err(format!("flag provided but not defined: -{flag}\n{USAGE}"));
    }
    let dial = flags.get("dial_string").unwrap_or("localhost:8081");
    let domain = flags
        .get("domain")
        .filter(|domain| !domain.is_empty())
        .ok_or_else(|| format!("-domain is required: nothing was sent\n{USAGE}"))?;
    if flags.all("descriptors").next().is_none() {
        return Err(format!(
            "-descriptors is required (at least one): nothing was sent\n{USAGE}"
        ));
    }
    let descriptors = flags
        .all("descriptors")
        .map(descriptor)
        .collect::<Result<Vec<_>, _>>()?;
    println!("dial_string: {dial}\ndomain: {domain}");
    for d in flags.all("descriptors") {
        println!("descriptor: {d}");
    }
    let url = if dial.contains("://") {
        dial.to_owned()
    } else {
        format!("http://{dial}")
    };
    let mut client = RateLimitServiceClient::connect(url)
        .await
        .map_err(|e| format!("error connecting: {e}"))?;
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 1,
    };
    let response = client
        .should_rate_limit(request)
        .await
        .map_err(|e| format!("request error: {} {}", e.code(), e.message()))?;
    println!("response: {}", render_response(response.get_ref()));
    Ok(())
}

fn descriptor(text: &str) -> Result<RateLimitDescriptor, String> {
    let entries = text
        .split(',')
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !value.contains('=') => Ok(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }),
            _ => Err(format!(
                "invalid descriptor list: '{text}' (expected k=v,k2=v2)"
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..RateLimitDescriptor::default()
    })
}
