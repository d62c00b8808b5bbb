//! Listeners and logs.

use std::time::Duration;

use clap::Args;

use ratelimit_service_kit::values::go_duration;

pub use ratelimit_service_kit::logging::LogFormat;
use ratelimit_service_kit::logging::lenient_format;

/// Listeners and logs.
#[derive(Clone, Debug, Args)]
pub struct ServerSettings {
    /// Address of the HTTP listener (`/json`, `/healthcheck`).
    #[arg(long, env, default_value = "0.0.0.0")]
    pub host: String,
    /// Port of the HTTP listener.
    #[arg(long, env, default_value_t = 8080)]
    pub port: u16,
    /// Address of the debug listener (`/rlconfig`, `/stats`).
    #[arg(long, env, default_value = "0.0.0.0")]
    pub debug_host: String,
    /// Port of the debug listener.
    #[arg(long, env, default_value_t = 6070)]
    pub debug_port: u16,
    /// Address of the gRPC listener.
    #[arg(long, env, default_value = "0.0.0.0")]
    pub grpc_host: String,
    /// Port of the gRPC listener.
    #[arg(long, env, default_value_t = 8081)]
    pub grpc_port: u16,
    /// Unix socket for gRPC instead of GRPC_HOST:GRPC_PORT.
    #[arg(long, env, default_value = "")]
    pub grpc_uds: String,
    /// Single-threaded runtimes serving gRPC and HTTP, each with its own listeners
    /// (SO_REUSEPORT) and backend connections. Default: the CPUs this process may use.
    #[arg(long, env, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub grpc_workers: Option<u16>,
    /// Connections older than this are sent a GOAWAY (plus or minus 10%); 0 is no limit.
    #[arg(long, env, default_value = "24h", value_parser = go_duration)]
    pub grpc_max_connection_age: Duration,
    /// Extra time before an aged connection is closed by force; 0 is no limit.
    #[arg(long, env, default_value = "1h", value_parser = go_duration)]
    pub grpc_max_connection_age_grace: Duration,
    /// A gRPC connection with no call open for this long is sent a GOAWAY (grpc-go's
    /// MaxConnectionIdle; our addition): clients connect again when they next call; 0 is
    /// no limit.
    #[arg(long, env, default_value = "5m", value_parser = go_duration)]
    pub grpc_max_connection_idle: Duration,
    /// gRPC connections served at once, over every worker (our addition); later clients
    /// wait in the listen backlog.
    #[arg(long, env, default_value_t = 16_384, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_connections: u32,
    /// Calls open at once on one gRPC connection, advertised in HTTP/2 SETTINGS (our
    /// addition; clients open more connections past it).
    #[arg(long, env, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_concurrent_streams: u32,
    /// Time a new gRPC connection has to send the HTTP/2 preface and its SETTINGS, after
    /// the TLS handshake if any (our addition); a silent connection is closed.
    #[arg(long, env, default_value = "10s", value_parser = go_duration)]
    pub grpc_preface_timeout: Duration,
    /// How long a Rate Limit Quota Service assignment lives in Envoy unless it is sent
    /// again (it is, with each usage report, every 5 s); whole seconds.
    #[arg(long, env, default_value = "15s", value_parser = go_duration)]
    pub rlqs_assignment_ttl: Duration,
    /// Rate Limit Quota Service streams open at once (one per Envoy and quota server
    /// cluster); more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub rlqs_max_streams: u32,
    /// Log level: panic, fatal, error, warn, info, debug or trace.
    #[arg(long, env, default_value = "warn", value_parser = log_level)]
    pub log_level: String,
    /// Log format: json, or text (any other value, as upstream reads it).
    #[arg(long, env, default_value = "text", value_parser = lenient_format)]
    pub log_format: LogFormat,
    /// How long SIGTERM waits for requests in flight before exiting (our addition).
    #[arg(long, env, default_value = "10s", value_parser = go_duration)]
    pub shutdown_drain_timeout: Duration,
    /// Largest `/json` body accepted, in bytes (our addition).
    #[arg(long, env, default_value_t = 1 << 20)]
    pub max_json_body_bytes: u64,
}

fn log_level(value: &str) -> Result<String, String> {
    let lower = value.to_ascii_lowercase();
    match lower.as_str() {
        "panic" | "fatal" | "error" | "warn" | "warning" | "info" | "debug" | "trace" => Ok(lower),
        _ => Err(format!(
            "expected panic, fatal, error, warn, info, debug or trace; got '{value}'"
        )),
    }
}
