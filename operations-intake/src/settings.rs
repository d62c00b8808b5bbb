//! The service's settings: environment variables, each also a command-line flag
//! (`--kafka-topic` for `KAFKA_TOPIC`). A bad value stops start-up naming the variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};

/// Everything the service can be told.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "operations-intake",
    version,
    about = "Receives financial operations over HTTP, rate-limits them and produces them to Kafka"
)]
pub struct Settings {
    /// `keygen`: print a new API key instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Address to listen on.
    #[arg(long, env = "HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, env = "PORT", default_value_t = 3000)]
    pub port: u16,
    /// Largest accepted request body, in bytes (413 above it).
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = 1_048_576)]
    pub max_body_bytes: usize,
    /// Most operations in one request (413 above it).
    #[arg(long, env = "MAX_OPERATIONS", default_value_t = 10_000)]
    pub max_operations: usize,
    /// Refuse (400, at the operation's unit-cost) a unit cost with more decimal places
    /// than this, counted on the value: trailing zeros do not count (10.10 has one, 1.5e-3
    /// has four). Unset: any, within the schema's bounds.
    #[arg(long, env = "MAX_UNIT_COST_DECIMALS")]
    pub max_unit_cost_decimals: Option<u32>,
    /// Refuse (400, at the operation's quantity) a batch that sells more than it bought:
    /// walking it in order from a position of zero, plus the quantity of a buy and minus
    /// that of a sell, the first operation that takes the position below zero.
    #[arg(long, env = "REJECT_OVERSELL", default_value_t = false, action = ArgAction::Set)]
    pub reject_oversell: bool,
    /// `HTTP_HEADER_READ_TIMEOUT`, `HTTP_IDLE_TIMEOUT` and `HTTP_MAX_CONNECTIONS`.
    #[command(flatten)]
    pub http: ratelimit_service_kit::serve::HttpLimitsSettings,

    /// How clients authenticate: api-keys (Authorization: Bearer, keys in API_KEYS_FILE),
    /// mtls (the client certificate's name; needs TLS_CLIENT_CA) or none (X-Client-Id
    /// names the client; for development only).
    #[arg(long, env = "AUTH", value_enum, default_value_t = AuthMode::ApiKeys)]
    pub auth: AuthMode,
    /// The clients' keys: a YAML list of {client_id, key_sha256, scopes}; reloaded when
    /// it changes. Required with AUTH=api-keys.
    #[arg(long, env = "API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,

    /// Serve HTTPS with this certificate chain (PEM); reloaded when it changes.
    #[arg(long, env = "TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of TLS_CERT (PEM).
    #[arg(long, env = "TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates chaining to these CA certificates (PEM): mutual TLS.
    #[arg(long, env = "TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Rate-limit rules in envoyproxy/ratelimit's YAML format, reloaded when the file
    /// changes; none means no limits.
    #[arg(long, env = "RATELIMIT_CONFIG")]
    pub ratelimit_config: Option<PathBuf>,
    /// The rules' domain.
    #[arg(long, env = "RATELIMIT_DOMAIN", default_value = "operations")]
    pub ratelimit_domain: String,
    /// Ask a ratelimit sidecar at this gRPC URL (`http://host:port`) instead of deciding
    /// in process, so replicas share limits.
    #[arg(long, env = "RATELIMIT_GRPC_URL", conflicts_with = "ratelimit_config")]
    pub ratelimit_grpc_url: Option<String>,
    /// Start even when the sidecar answers that it has no limit for RATELIMIT_DOMAIN.
    #[arg(long, env = "RATELIMIT_ALLOW_UNKNOWN_DOMAIN", default_value_t = false, action = clap::ArgAction::Set)]
    pub ratelimit_allow_unknown_domain: bool,
    /// How long to wait for the sidecar.
    #[arg(long, env = "RATELIMIT_TIMEOUT", default_value = "500ms", value_parser = duration)]
    pub ratelimit_timeout: Duration,
    /// Refuse requests (503) when the sidecar cannot answer, instead of allowing them.
    #[arg(long, env = "RATELIMIT_FAILURE_MODE_DENY", default_value_t = false, action = ArgAction::Set)]
    pub ratelimit_failure_mode_deny: bool,

    /// Which rate-limit headers answers carry: ratelimit (RateLimit-Limit, -Remaining and
    /// -Reset, for the tightest limit) or ietf-draft-11 (RateLimit-Policy listing every
    /// limit that applied, and RateLimit for the one that decided, as Structured Fields).
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_FORMAT", default_value = "ratelimit", value_parser = headers_format)]
    pub limit_response_headers_format: ratelimit_core::HeaderFormat,
    /// Kafka bootstrap servers.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "localhost:9092"
    )]
    pub kafka_bootstrap_servers: String,
    /// Topic the operations are produced to.
    #[arg(long, env = "KAFKA_TOPIC", default_value = "operations")]
    pub kafka_topic: String,
    /// Extra librdkafka properties, `name=value` separated by commas or new lines
    /// (`security.protocol=SASL_SSL,sasl.mechanism=PLAIN`).
    #[arg(long, env = "KAFKA_PROPERTIES", default_value = "")]
    pub kafka_properties: String,
    /// A file of librdkafka properties, one `name=value` a line, `#` for comments; read
    /// before `KAFKA_PROPERTIES`.
    #[arg(long, env = "KAFKA_PROPERTIES_FILE")]
    pub kafka_properties_file: Option<PathBuf>,
    /// How long the broker has to acknowledge a batch before the answer is 503.
    #[arg(long, env = "KAFKA_DELIVERY_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub kafka_delivery_timeout: Duration,
    /// How long `/health` waits for the broker's metadata answer.
    #[arg(long, env = "KAFKA_HEALTH_TIMEOUT", default_value = "1s", value_parser = duration)]
    pub kafka_health_timeout: Duration,
    /// The producer's transactional.id: stable across restarts of this replica and unique
    /// among replicas. Unset: `operations-intake-<host name>-<PORT>`
    #[arg(long, env = "KAFKA_TRANSACTIONAL_ID")]
    pub kafka_transactional_id: Option<String>,
    /// Start an in-process mock broker and produce to it. Nothing is durable: for trying
    /// the service out only.
    #[arg(long, env = "KAFKA_MOCK_BROKER", default_value_t = false, action = ArgAction::Set)]
    pub kafka_mock_broker: bool,

    /// How long an `Idempotency-Key` answer is remembered.
    #[arg(long, env = "IDEMPOTENCY_TTL", default_value = "24h", value_parser = duration)]
    pub idempotency_ttl: Duration,
    /// Most idempotency keys remembered; the oldest are forgotten first.
    #[arg(long, env = "IDEMPOTENCY_MAX_KEYS", default_value_t = 100_000)]
    pub idempotency_max_keys: usize,
    /// Where idempotency keys are remembered: memory (this process) or redis (shared by
    /// every replica, and kept across restarts).
    #[arg(long, env = "IDEMPOTENCY_STORE", value_enum, default_value_t = IdempotencyStore::Memory)]
    pub idempotency_store: IdempotencyStore,
    /// The Redis of IDEMPOTENCY_STORE=redis (redis://[:password@]host:port[/db]).
    #[arg(long, env = "IDEMPOTENCY_REDIS_URL")]
    pub idempotency_redis_url: Option<String>,
    /// How long a claimed key stays claimed if its replica dies before answering. Must
    /// exceed KAFKA_DELIVERY_TIMEOUT plus RATELIMIT_TIMEOUT.
    #[arg(long, env = "IDEMPOTENCY_CLAIM_TTL", default_value = "60s", value_parser = duration)]
    pub idempotency_claim_ttl: Duration,
    /// How long a Redis call may take.
    #[arg(long, env = "IDEMPOTENCY_REDIS_TIMEOUT", default_value = "500ms", value_parser = duration)]
    pub idempotency_redis_timeout: Duration,

    /// On SIGTERM, how long to wait for requests in flight and the producer's queue.
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub shutdown_timeout: Duration,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

pub use ratelimit_service_kit::logging::LogFormat;

pub use crate::auth::Mode as AuthMode;

/// `IDEMPOTENCY_STORE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IdempotencyStore {
    /// This process's memory.
    Memory,
    /// Redis, at IDEMPOTENCY_REDIS_URL.
    Redis,
}

/// What to do instead of serving.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum Command {
    /// Print a new API key, and the API_KEYS_FILE entry (its SHA-256) to add for it.
    Keygen {
        /// The client the key is for.
        #[arg(long)]
        client_id: String,
        /// What it may send: buy, sell (comma-separated); every operation when left out.
        #[arg(long, value_delimiter = ',')]
        scopes: Option<Vec<String>>,
        /// Append the entry to this keys file (created if missing) and print only the key.
        #[arg(long)]
        append_to: Option<PathBuf>,
    },
}

fn headers_format(value: &str) -> Result<ratelimit_core::HeaderFormat, String> {
    ratelimit_core::HeaderFormat::parse(value)
        .ok_or_else(|| format!("expected ratelimit or ietf-draft-11; got `{value}`"))
}

fn duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value).map_err(|e| format!("{e} (examples: 500ms, 10s, 24h)"))
}

/// Parses `name=value` pairs separated by commas or new lines; blank entries and `#`
/// comment lines are skipped.
pub fn parse_properties(text: &str) -> Result<Vec<(String, String)>, String> {
    pairs(text.split(['\n', ',']))
}

/// Parses a properties file: one `name=value` a line, so values may hold commas.
pub fn parse_properties_file(text: &str) -> Result<Vec<(String, String)>, String> {
    pairs(text.lines())
}

fn pairs<'a>(entries: impl Iterator<Item = &'a str>) -> Result<Vec<(String, String)>, String> {
    entries
        .map(str::trim)
        .filter(|entry| !entry.is_empty() && !entry.starts_with('#'))
        .map(|entry| match entry.split_once('=') {
            Some((name, value)) if !name.trim().is_empty() => {
                Ok((name.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(format!("`{entry}` is not name=value")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_readme() {
        let s = Settings::try_parse_from(["operations-intake"]).unwrap();
        assert_eq!(s.port, 3000);
        assert_eq!(s.max_body_bytes, 1 << 20);
        assert_eq!(s.max_operations, 10_000);
        assert_eq!(s.kafka_topic, "operations");
        assert_eq!(s.idempotency_ttl, Duration::from_secs(86_400));
        assert!(!s.ratelimit_failure_mode_deny);
        assert!(!s.kafka_mock_broker);
        assert_eq!(s.auth, AuthMode::ApiKeys);
        assert_eq!(s.idempotency_store, IdempotencyStore::Memory);
        assert_eq!(s.idempotency_claim_ttl, Duration::from_secs(60));
        assert_eq!(s.max_unit_cost_decimals, None);
        assert!(!s.reject_oversell);
    }

    #[test]
    fn properties_from_a_list_and_a_file() {
        assert_eq!(
            parse_properties("a.b=1, c=x=y\n\n#skip\n").unwrap(),
            [("a.b".into(), "1".into()), ("c".into(), "x=y".into())]
        );
        assert!(parse_properties("novalue").is_err());
        assert_eq!(
            parse_properties_file("sasl.password=a,b\n# c\n").unwrap(),
            [("sasl.password".into(), "a,b".into())]
        );
    }

    #[test]
    fn a_remote_limiter_and_a_local_file_exclude_each_other() {
        let both = Settings::try_parse_from([
            "operations-intake",
            "--ratelimit-config",
            "x.yaml",
            "--ratelimit-grpc-url",
            "http://127.0.0.1:1",
        ]);
        assert!(both.is_err());
    }
}
