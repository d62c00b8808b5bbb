//! `ratelimit-client`: sends one ShouldRateLimit request and prints the response.
//!
//! `ratelimit-client -dial_string localhost:8081 -domain edge -descriptors user=alice,method=POST`
//! (`-descriptors` may be repeated: one descriptor each). With `-explain`, asks the debug
//! server's `/explain` instead: which rule each descriptor meets, its counter, and the
//! answer it would get, without counting it.

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_proto::json::render_response;
use ratelimit_sidecar::settings::cli::Flags;

const USAGE: &str = "usage: ratelimit-client [-dial_string host:port] -domain DOMAIN -descriptors k=v[,k2=v2] [-descriptors ...] [-explain [-debug_address host:port]]
  -dial_string    the server's gRPC address (default localhost:8081)
  -domain         the rate limit domain (required)
  -descriptors    one descriptor: its entries as k=v pairs joined by commas; repeat for more
  -explain        ask the debug server why, without counting: the rule each descriptor
                  meets, its counter now, and the answer the request would get
  -debug_address  the debug server for -explain (default localhost:6070)
Flags take one dash or two (-domain, --domain), and their value after a space or '='.";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        // Whoever reads the output stopped reading (`ratelimit-client … | head`): that is
        // their choice, not a failure, so the program ends quietly.
        Ok(()) | Err(Stop::OutputClosed) => ExitCode::SUCCESS,
        Err(Stop::Failed(message)) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// Why the program stopped early.
#[derive(Debug, PartialEq)]
enum Stop {
    /// An error, to print on stderr.
    Failed(String),
    /// Standard output is a pipe whose reader has gone.
    OutputClosed,
}

impl From<String> for Stop {
    fn from(message: String) -> Stop {
        Stop::Failed(message)
    }
}

/// Writes `text` to `out` and flushes it; a reader that has gone is [`Stop::OutputClosed`],
/// where `println!` would panic.
fn say(out: &mut impl Write, text: &str) -> Result<(), Stop> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == ErrorKind::BrokenPipe => Err(Stop::OutputClosed),
        Err(error) => Err(Stop::Failed(format!("cannot write the output: {error}"))),
    }
}

async fn run() -> Result<(), Stop> {
    let stdout = &mut std::io::stdout();
    let flags = Flags::parse(std::env::args().skip(1), &["explain"])
        .map_err(|e| format!("{e}\n{USAGE}"))?;
    if flags.wants_help() {
        return say(stdout, &format!("{USAGE}\n"));
    }
    if let Some(flag) = flags.unknown(&[
        "dial_string",
        "domain",
        "descriptors",
        "explain",
        "debug_address",
    ]) {
        return Err(format!("flag provided but not defined: -{flag}\n{USAGE}").into());
    }
    let dial = flags.get("dial_string").unwrap_or("localhost:8081");
    let domain = flags
        .get("domain")
        .filter(|domain| !domain.is_empty())
        .ok_or_else(|| format!("-domain is required: nothing was sent\n{USAGE}"))?;
    if flags.all("descriptors").next().is_none() {
        return Err(
            format!("-descriptors is required (at least one): nothing was sent\n{USAGE}").into(),
        );
    }
    let descriptors = flags
        .all("descriptors")
        .map(descriptor)
        .collect::<Result<Vec<_>, _>>()?;
    say(stdout, &format!("dial_string: {dial}\ndomain: {domain}\n"))?;
    for d in flags.all("descriptors") {
        say(stdout, &format!("descriptor: {d}\n"))?;
    }
    if flags.get("explain").is_some_and(|v| v != "false") {
        let debug = flags.get("debug_address").unwrap_or("localhost:6070");
        let body = serde_json::json!({
            "domain": domain,
            "descriptors": descriptors.iter().map(|d| serde_json::json!({
                "entries": d.entries.iter().map(|e| serde_json::json!({"key": e.key, "value": e.value})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        let answer = post(debug, "/explain", &body.to_string())?;
        return say(stdout, &answer);
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
    say(
        stdout,
        &format!("response: {}\n", render_response(response.get_ref())),
    )
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

/// POSTs `body` to `http://address/path` over plain HTTP/1.1 and returns the response
/// body; a status other than 200 is an error carrying the body.
fn post(address: &str, path: &str, body: &str) -> Result<String, String> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address)
        .map_err(|e| format!("error connecting to the debug server {address}: {e}"))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut answer = String::new();
    stream
        .write_all(request.as_bytes())
        .and_then(|()| stream.read_to_string(&mut answer))
        .map_err(|e| format!("request error: {e}"))?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    match head.split_whitespace().nth(1) {
        Some("200") => Ok(body.to_owned()),
        status => Err(format!(
            "request error: {} {body}",
            status.unwrap_or("no status")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe whose reader has gone.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_output_stops_quietly_and_other_write_errors_are_failures() {
        let mut written = Vec::new();
        assert_eq!(say(&mut written, "descriptor: a=b\n"), Ok(()));
        assert_eq!(written, b"descriptor: a=b\n");
        assert_eq!(say(&mut Closed, "x"), Err(Stop::OutputClosed));
        let mut full: &mut [u8] = &mut [0u8; 1];
        assert!(matches!(say(&mut full, "xy"), Err(Stop::Failed(m)) if m.contains("cannot write")));
    }
}
