//! Every setting of envoyproxy/ratelimit, read from the same environment variables, each
//! also a command-line flag (`--near-limit-ratio` for `NEAR_LIMIT_RATIO`).
//!
//! Values are parsed the way that project parses them (Go booleans and durations,
//! `k1:v1,k2:v2` maps); a bad value stops start-up with a message naming the variable.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, ValueEnum};

pub use crate::bounds::BoundsSettings;

/// The sidecar's settings.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "ratelimit",
    version,
    about = "A drop-in replacement for envoyproxy/ratelimit"
)]
pub struct Settings {
    #[command(flatten, next_help_heading = "Listeners")]
    pub server: ServerSettings,
    #[command(flatten, next_help_heading = "Configuration source")]
    pub config: ConfigSettings,
    #[command(flatten, next_help_heading = "Limiter")]
    pub limiter: LimiterSettings,
    #[command(flatten, next_help_heading = "Redis backend")]
    pub redis: RedisSettings,
    #[command(flatten, next_help_heading = "Memcached backend")]
    pub memcache: MemcacheSettings,
    #[command(flatten, next_help_heading = "Statistics")]
    pub stats: StatsSettings,
    #[command(flatten, next_help_heading = "Tracing")]
    pub tracing: TracingSettings,
    #[command(flatten, next_help_heading = "Bounds")]
    pub bounds: BoundsSettings,
}

/// Listeners, TLS and logs.
#[derive(Clone, Debug, Args)]
pub struct ServerSettings {
    /// Address of the HTTP listener (`/json`, `/healthcheck`).
    #[arg(long, env = "HOST", value_name = "HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// Port of the HTTP listener.
    #[arg(long, env = "PORT", value_name = "PORT", default_value_t = 8080)]
    pub port: u16,
    /// Address of the debug listener (`/rlconfig`, `/stats`).
    #[arg(
        long,
        env = "DEBUG_HOST",
        value_name = "DEBUG_HOST",
        default_value = "0.0.0.0"
    )]
    pub debug_host: String,
    /// Port of the debug listener.
    #[arg(
        long,
        env = "DEBUG_PORT",
        value_name = "DEBUG_PORT",
        default_value_t = 6070
    )]
    pub debug_port: u16,
    /// Address of the gRPC listener.
    #[arg(
        long,
        env = "GRPC_HOST",
        value_name = "GRPC_HOST",
        default_value = "0.0.0.0"
    )]
    pub grpc_host: String,
    /// Port of the gRPC listener.
    #[arg(
        long,
        env = "GRPC_PORT",
        value_name = "GRPC_PORT",
        default_value_t = 8081
    )]
    pub grpc_port: u16,
    /// Unix socket for gRPC instead of GRPC_HOST:GRPC_PORT.
    #[arg(long, env = "GRPC_UDS", value_name = "GRPC_UDS", default_value = "")]
    pub grpc_uds: String,
    /// Single-threaded runtimes serving gRPC and HTTP, each with its own listeners
    /// (SO_REUSEPORT) and backend connections. Default: the CPUs this process may use.
    #[arg(long, env = "GRPC_WORKERS", value_name = "GRPC_WORKERS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub grpc_workers: Option<u16>,
    /// Connections older than this are sent a GOAWAY (plus or minus 10%).
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE", value_name = "GRPC_MAX_CONNECTION_AGE", default_value = "24h", value_parser = go_duration)]
    pub grpc_max_connection_age: Duration,
    /// Extra time before an aged connection is closed by force.
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE_GRACE", value_name = "GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "1h", value_parser = go_duration)]
    pub grpc_max_connection_age_grace: Duration,
    /// Serve gRPC over TLS.
    #[arg(long, env = "GRPC_SERVER_USE_TLS", value_name = "GRPC_SERVER_USE_TLS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub grpc_server_use_tls: bool,
    /// Certificate chain of the gRPC server (watched and reloaded).
    #[arg(
        long,
        env = "GRPC_SERVER_TLS_CERT",
        value_name = "GRPC_SERVER_TLS_CERT",
        default_value = ""
    )]
    pub grpc_server_tls_cert: String,
    /// Private key of the gRPC server.
    #[arg(
        long,
        env = "GRPC_SERVER_TLS_KEY",
        value_name = "GRPC_SERVER_TLS_KEY",
        default_value = ""
    )]
    pub grpc_server_tls_key: String,
    /// CA that client certificates must chain to (enables mTLS).
    #[arg(
        long,
        env = "GRPC_CLIENT_TLS_CACERT",
        value_name = "GRPC_CLIENT_TLS_CACERT",
        default_value = ""
    )]
    pub grpc_client_tls_cacert: String,
    /// DNS name the client certificate must carry.
    #[arg(
        long,
        env = "GRPC_CLIENT_TLS_SAN",
        value_name = "GRPC_CLIENT_TLS_SAN",
        default_value = ""
    )]
    pub grpc_client_tls_san: String,
    /// Log level: panic, fatal, error, warn, info, debug or trace.
    #[arg(long, env = "LOG_LEVEL", value_name = "LOG_LEVEL", default_value = "warn", value_parser = log_level)]
    pub log_level: String,
    /// Log format: text or json.
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_name = "LOG_FORMAT",
        default_value = "text",
        ignore_case = true
    )]
    pub log_format: LogFormat,
    /// How long SIGTERM waits for requests in flight before exiting (our addition).
    #[arg(long, env = "SHUTDOWN_DRAIN_TIMEOUT", value_name = "SHUTDOWN_DRAIN_TIMEOUT", default_value = "10s", value_parser = go_duration)]
    pub shutdown_drain_timeout: Duration,
    /// Largest `/json` body accepted, in bytes (our addition).
    #[arg(long, env = "MAX_JSON_BODY_BYTES", value_name = "MAX_JSON_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_json_body_bytes: u64,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `time=… level=… msg=…` lines.
    Text,
    /// JSON lines with `@timestamp`, `level` and `@message`.
    Json,
}

/// Where the rules come from.
#[derive(Clone, Debug, Args)]
pub struct ConfigSettings {
    /// FILE or GRPC_XDS_SOTW.
    #[arg(long, env = "CONFIG_TYPE", value_name = "CONFIG_TYPE", default_value = "FILE", value_parser = config_type)]
    pub config_type: ConfigType,
    /// Open the listeners before the first configuration is loaded.
    #[arg(long, env = "FORCE_START_WITHOUT_INITIAL_CONFIG", value_name = "FORCE_START_WITHOUT_INITIAL_CONFIG", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub force_start_without_initial_config: bool,
    /// Root of the runtime tree (usually a symlink swapped on deploy).
    #[arg(
        long,
        env = "RUNTIME_ROOT",
        value_name = "RUNTIME_ROOT",
        default_value = "/srv/runtime_data/current"
    )]
    pub runtime_root: String,
    /// Sub-directory of the root.
    #[arg(
        long,
        env = "RUNTIME_SUBDIRECTORY",
        value_name = "RUNTIME_SUBDIRECTORY",
        default_value = ""
    )]
    pub runtime_subdirectory: String,
    /// Directory holding the YAML files, under root/sub-directory.
    #[arg(
        long,
        env = "RUNTIME_APPDIRECTORY",
        value_name = "RUNTIME_APPDIRECTORY",
        default_value = "config"
    )]
    pub runtime_appdirectory: String,
    /// Skip files and directories whose name starts with a dot.
    #[arg(long, env = "RUNTIME_IGNOREDOTFILES", value_name = "RUNTIME_IGNOREDOTFILES", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub runtime_ignoredotfiles: bool,
    /// true: reload when RUNTIME_ROOT is swapped; false: reload when files change.
    #[arg(long, env = "RUNTIME_WATCH_ROOT", value_name = "RUNTIME_WATCH_ROOT", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub runtime_watch_root: bool,
    /// Let several files define the same domain.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", value_name = "MERGE_DOMAIN_CONFIG", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub merge_domain_config: bool,
    /// Health fails until at least one domain is loaded.
    #[arg(long, env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", value_name = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub healthy_with_at_least_one_config_loaded: bool,
    /// xDS node id.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_NODE_ID",
        value_name = "CONFIG_GRPC_XDS_NODE_ID",
        default_value = "default"
    )]
    pub xds_node_id: String,
    /// xDS node metadata, `k=v,k2=v2`.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_NODE_METADATA",
        value_name = "CONFIG_GRPC_XDS_NODE_METADATA",
        default_value = ""
    )]
    pub xds_node_metadata: String,
    /// xDS server address.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_URL",
        value_name = "CONFIG_GRPC_XDS_SERVER_URL",
        default_value = "localhost:18000"
    )]
    pub xds_server_url: String,
    /// Retry interval of the xDS stream.
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", value_name = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", default_value = "3s", value_parser = go_duration)]
    pub xds_server_connect_retry_interval: Duration,
    /// Extra headers on the xDS stream, `k1:v1,k2:v2`.
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", value_name = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", default_value = "", value_parser = go_map)]
    pub xds_client_additional_headers: StringMap,
    /// Use TLS to the xDS server.
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_USE_TLS", value_name = "CONFIG_GRPC_XDS_SERVER_USE_TLS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub xds_server_use_tls: bool,
    /// Client certificate for the xDS server.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        value_name = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        default_value = ""
    )]
    pub xds_client_tls_cert: String,
    /// Client key for the xDS server.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        value_name = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        default_value = ""
    )]
    pub xds_client_tls_key: String,
    /// CA of the xDS server.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        value_name = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        default_value = ""
    )]
    pub xds_server_tls_cacert: String,
    /// Server name to verify on the xDS server's certificate.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        value_name = "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        default_value = ""
    )]
    pub xds_server_tls_san: String,
    /// First reconnect back-off.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", value_name = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", default_value = "10s", value_parser = go_duration)]
    pub xds_backoff_initial_interval: Duration,
    /// Longest reconnect back-off.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_MAX_INTERVAL", value_name = "XDS_CLIENT_BACKOFF_MAX_INTERVAL", default_value = "60s", value_parser = go_duration)]
    pub xds_backoff_max_interval: Duration,
    /// Growth factor of the back-off.
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        value_name = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        default_value_t = 0.5
    )]
    pub xds_backoff_random_factor: f64,
    /// Add jitter to the back-off.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_JITTER", value_name = "XDS_CLIENT_BACKOFF_JITTER", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub xds_backoff_jitter: bool,
    /// Largest xDS message accepted (0: 4 MiB).
    #[arg(
        long,
        env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        value_name = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        default_value_t = 0
    )]
    pub xds_max_msg_size_in_bytes: usize,
}

/// The configuration source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigType {
    /// YAML files under RUNTIME_ROOT.
    File,
    /// An xDS (SotW ADS) server.
    GrpcXdsSotw,
}

/// Settings of the decision itself.
#[derive(Clone, Debug, Args)]
pub struct LimiterSettings {
    /// redis, memcache or memory (default: redis when REDIS_URL is set, else memory).
    #[arg(long, env = "BACKEND_TYPE", value_name = "BACKEND_TYPE", value_parser = backend_type)]
    pub backend_type: Option<BackendType>,
    /// Counters the memory backend keeps at most (our addition).
    #[arg(long, env = "MEMORY_MAX_COUNTERS", value_name = "MEMORY_MAX_COUNTERS", default_value_t = 1 << 20)]
    pub memory_max_counters: usize,
    /// Random extra seconds, below this, added to counter expiry.
    #[arg(
        long,
        env = "EXPIRATION_JITTER_MAX_SECONDS",
        value_name = "EXPIRATION_JITTER_MAX_SECONDS",
        default_value_t = 300
    )]
    pub expiration_jitter_max_seconds: u64,
    /// Bytes of the local cache of over-limit keys (0 disables it).
    #[arg(
        long,
        env = "LOCAL_CACHE_SIZE_IN_BYTES",
        value_name = "LOCAL_CACHE_SIZE_IN_BYTES",
        default_value_t = 0
    )]
    pub local_cache_size_in_bytes: u64,
    /// Share of the limit above which hits count as near_limit (0 to 1).
    #[arg(long, env = "NEAR_LIMIT_RATIO", value_name = "NEAR_LIMIT_RATIO", default_value = "0.8", value_parser = ratio)]
    pub near_limit_ratio: f32,
    /// Prepended to every cache key.
    #[arg(
        long,
        env = "CACHE_KEY_PREFIX",
        value_name = "CACHE_KEY_PREFIX",
        default_value = ""
    )]
    pub cache_key_prefix: String,
    /// Leave the other counters alone when a descriptor would go over its limit.
    #[arg(long, env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", value_name = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub stop_cache_key_increment_when_overlimit: bool,
    /// Always answer OK overall (statuses keep the truth).
    #[arg(long, env = "SHADOW_MODE", value_name = "SHADOW_MODE", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub shadow_mode: bool,
    /// Every descriptor is a quota: over limit only when all are.
    #[arg(long, env = "QUOTA_MODE", value_name = "QUOTA_MODE", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub quota_mode: bool,
    /// Fill dynamic_metadata in responses.
    #[arg(long, env = "RESPONSE_DYNAMIC_METADATA", value_name = "RESPONSE_DYNAMIC_METADATA", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub response_dynamic_metadata: bool,
    /// Add the RateLimit-* headers to responses.
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", value_name = "LIMIT_RESPONSE_HEADERS_ENABLED", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub limit_response_headers_enabled: bool,
    /// Name of the limit header.
    #[arg(
        long,
        env = "LIMIT_LIMIT_HEADER",
        value_name = "LIMIT_LIMIT_HEADER",
        default_value = "RateLimit-Limit"
    )]
    pub limit_limit_header: String,
    /// Name of the remaining header.
    #[arg(
        long,
        env = "LIMIT_REMAINING_HEADER",
        value_name = "LIMIT_REMAINING_HEADER",
        default_value = "RateLimit-Remaining"
    )]
    pub limit_remaining_header: String,
    /// Name of the reset header.
    #[arg(
        long,
        env = "LIMIT_RESET_HEADER",
        value_name = "LIMIT_RESET_HEADER",
        default_value = "RateLimit-Reset"
    )]
    pub limit_reset_header: String,
}

/// The counter store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendType {
    /// Redis (single, sentinel or cluster).
    Redis,
    /// memcached.
    Memcache,
    /// This process's memory.
    Memory,
}

/// One Redis deployment (the main one, or the per-second one).
#[derive(Clone, Debug, Args)]
pub struct RedisSettings {
    /// tcp or unix.
    #[arg(
        long,
        env = "REDIS_SOCKET_TYPE",
        value_name = "REDIS_SOCKET_TYPE",
        default_value = "unix"
    )]
    pub redis_socket_type: String,
    /// single, sentinel or cluster.
    #[arg(long, env = "REDIS_TYPE", value_name = "REDIS_TYPE", default_value = "single", value_parser = redis_type)]
    pub redis_type: String,
    /// Address, or sentinel `master,host:port,...`, or cluster `host:port,...`.
    #[arg(long, env = "REDIS_URL", value_name = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Connections per pool.
    #[arg(
        long,
        env = "REDIS_POOL_SIZE",
        value_name = "REDIS_POOL_SIZE",
        default_value_t = 10
    )]
    pub redis_pool_size: usize,
    /// `password` or `user:password`.
    #[arg(
        long,
        env = "REDIS_AUTH",
        value_name = "REDIS_AUTH",
        default_value = "",
        hide_env_values = true
    )]
    pub redis_auth: String,
    /// Credentials for sentinels.
    #[arg(
        long,
        env = "REDIS_SENTINEL_AUTH",
        value_name = "REDIS_SENTINEL_AUTH",
        default_value = "",
        hide_env_values = true
    )]
    pub redis_sentinel_auth: String,
    /// Connect with TLS.
    #[arg(long, env = "REDIS_TLS", value_name = "REDIS_TLS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_tls: bool,
    /// Client certificate for Redis TLS.
    #[arg(
        long,
        env = "REDIS_TLS_CLIENT_CERT",
        value_name = "REDIS_TLS_CLIENT_CERT",
        default_value = ""
    )]
    pub redis_tls_client_cert: String,
    /// Client key for Redis TLS.
    #[arg(
        long,
        env = "REDIS_TLS_CLIENT_KEY",
        value_name = "REDIS_TLS_CLIENT_KEY",
        default_value = ""
    )]
    pub redis_tls_client_key: String,
    /// CA for Redis TLS.
    #[arg(
        long,
        env = "REDIS_TLS_CACERT",
        value_name = "REDIS_TLS_CACERT",
        default_value = ""
    )]
    pub redis_tls_cacert: String,
    /// Verify the chain but not the host name.
    #[arg(long, env = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", value_name = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_tls_skip_hostname_verification: bool,
    /// Connect, read and write timeout.
    #[arg(long, env = "REDIS_TIMEOUT", value_name = "REDIS_TIMEOUT", default_value = "10s", value_parser = go_duration)]
    pub redis_timeout: Duration,
    /// CREATE, ERROR or WAIT when the pool is empty.
    #[arg(long, env = "REDIS_POOL_ON_EMPTY_BEHAVIOR", value_name = "REDIS_POOL_ON_EMPTY_BEHAVIOR", default_value = "CREATE", value_parser = pool_behavior)]
    pub redis_pool_on_empty_behavior: String,
    /// Wait before the CREATE or ERROR action.
    #[arg(long, env = "REDIS_POOL_ON_EMPTY_WAIT_DURATION", value_name = "REDIS_POOL_ON_EMPTY_WAIT_DURATION", default_value = "1s", value_parser = go_duration)]
    pub redis_pool_on_empty_wait_duration: Duration,
    /// Implicit pipelining window (0: flush each write).
    #[arg(long, env = "REDIS_PIPELINE_WINDOW", value_name = "REDIS_PIPELINE_WINDOW", default_value = "0", value_parser = go_duration)]
    pub redis_pipeline_window: Duration,
    /// Deprecated, no effect.
    #[arg(
        long,
        env = "REDIS_PIPELINE_LIMIT",
        value_name = "REDIS_PIPELINE_LIMIT",
        default_value_t = 0
    )]
    pub redis_pipeline_limit: u64,
    /// Cluster pipelines run in parallel (0: pool size).
    #[arg(
        long,
        env = "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        value_name = "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        default_value_t = 1
    )]
    pub redis_cluster_pipeline_parallelism: u32,
    /// Health follows whether a connection is alive.
    #[arg(long, env = "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", value_name = "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_health_check_active_connection: bool,
    /// First start-up connection retry interval.
    #[arg(long, env = "REDIS_STARTUP_INITIAL_INTERVAL", value_name = "REDIS_STARTUP_INITIAL_INTERVAL", default_value = "1s", value_parser = go_duration)]
    pub redis_startup_initial_interval: Duration,
    /// Longest start-up connection retry interval.
    #[arg(long, env = "REDIS_STARTUP_MAX_INTERVAL", value_name = "REDIS_STARTUP_MAX_INTERVAL", default_value = "30s", value_parser = go_duration)]
    pub redis_startup_max_interval: Duration,
    /// Give up connecting at start-up after this long (0: never).
    #[arg(long, env = "REDIS_STARTUP_MAX_ELAPSED_TIME", value_name = "REDIS_STARTUP_MAX_ELAPSED_TIME", default_value = "0", value_parser = go_duration)]
    pub redis_startup_max_elapsed_time: Duration,
    /// Send per-second limits to their own Redis.
    #[arg(long, env = "REDIS_PERSECOND", value_name = "REDIS_PERSECOND", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_persecond: bool,
    /// Per-second Redis: tcp or unix.
    #[arg(
        long,
        env = "REDIS_PERSECOND_SOCKET_TYPE",
        value_name = "REDIS_PERSECOND_SOCKET_TYPE",
        default_value = "unix"
    )]
    pub redis_persecond_socket_type: String,
    /// Per-second Redis: single, sentinel or cluster.
    #[arg(long, env = "REDIS_PERSECOND_TYPE", value_name = "REDIS_PERSECOND_TYPE", default_value = "single", value_parser = redis_type)]
    pub redis_persecond_type: String,
    /// Per-second Redis address.
    #[arg(
        long,
        env = "REDIS_PERSECOND_URL",
        value_name = "REDIS_PERSECOND_URL",
        default_value = "/var/run/nutcracker/ratelimitpersecond.sock"
    )]
    pub redis_persecond_url: String,
    /// Per-second Redis pool size.
    #[arg(
        long,
        env = "REDIS_PERSECOND_POOL_SIZE",
        value_name = "REDIS_PERSECOND_POOL_SIZE",
        default_value_t = 10
    )]
    pub redis_persecond_pool_size: usize,
    /// Per-second Redis credentials.
    #[arg(
        long,
        env = "REDIS_PERSECOND_AUTH",
        value_name = "REDIS_PERSECOND_AUTH",
        default_value = "",
        hide_env_values = true
    )]
    pub redis_persecond_auth: String,
    /// Per-second sentinel credentials.
    #[arg(
        long,
        env = "REDIS_PERSECOND_SENTINEL_AUTH",
        value_name = "REDIS_PERSECOND_SENTINEL_AUTH",
        default_value = "",
        hide_env_values = true
    )]
    pub redis_persecond_sentinel_auth: String,
    /// Per-second Redis over TLS.
    #[arg(long, env = "REDIS_PERSECOND_TLS", value_name = "REDIS_PERSECOND_TLS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_persecond_tls: bool,
    /// Per-second Redis timeout.
    #[arg(long, env = "REDIS_PERSECOND_TIMEOUT", value_name = "REDIS_PERSECOND_TIMEOUT", default_value = "10s", value_parser = go_duration)]
    pub redis_persecond_timeout: Duration,
    /// Per-second pool behaviour when empty.
    #[arg(long, env = "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", value_name = "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", default_value = "CREATE", value_parser = pool_behavior)]
    pub redis_persecond_pool_on_empty_behavior: String,
    /// Per-second wait before the empty-pool action.
    #[arg(long, env = "REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION", value_name = "REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION", default_value = "1s", value_parser = go_duration)]
    pub redis_persecond_pool_on_empty_wait_duration: Duration,
    /// Per-second pipelining window.
    #[arg(long, env = "REDIS_PERSECOND_PIPELINE_WINDOW", value_name = "REDIS_PERSECOND_PIPELINE_WINDOW", default_value = "0", value_parser = go_duration)]
    pub redis_persecond_pipeline_window: Duration,
    /// Deprecated, no effect.
    #[arg(
        long,
        env = "REDIS_PERSECOND_PIPELINE_LIMIT",
        value_name = "REDIS_PERSECOND_PIPELINE_LIMIT",
        default_value_t = 0
    )]
    pub redis_persecond_pipeline_limit: u64,
    /// Per-second cluster pipeline parallelism.
    #[arg(
        long,
        env = "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        value_name = "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        default_value_t = 1
    )]
    pub redis_persecond_cluster_pipeline_parallelism: u32,
}

/// memcached.
#[derive(Clone, Debug, Args)]
pub struct MemcacheSettings {
    /// `host:port,...` of every node (same list on every instance).
    #[arg(
        long,
        env = "MEMCACHE_HOST_PORT",
        value_name = "MEMCACHE_HOST_PORT",
        default_value = ""
    )]
    pub memcache_host_port: String,
    /// SRV record listing the nodes (exclusive with MEMCACHE_HOST_PORT).
    #[arg(
        long,
        env = "MEMCACHE_SRV",
        value_name = "MEMCACHE_SRV",
        default_value = ""
    )]
    pub memcache_srv: String,
    /// How often to look the SRV record up again (0: never).
    #[arg(long, env = "MEMCACHE_SRV_REFRESH", value_name = "MEMCACHE_SRV_REFRESH", default_value = "0", value_parser = go_duration)]
    pub memcache_srv_refresh: Duration,
    /// Idle connections kept per node.
    #[arg(
        long,
        env = "MEMCACHE_MAX_IDLE_CONNS",
        value_name = "MEMCACHE_MAX_IDLE_CONNS",
        default_value_t = 2
    )]
    pub memcache_max_idle_conns: usize,
    /// Connect with TLS.
    #[arg(long, env = "MEMCACHE_TLS", value_name = "MEMCACHE_TLS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub memcache_tls: bool,
    /// Client certificate for memcached TLS.
    #[arg(
        long,
        env = "MEMCACHE_TLS_CLIENT_CERT",
        value_name = "MEMCACHE_TLS_CLIENT_CERT",
        default_value = ""
    )]
    pub memcache_tls_client_cert: String,
    /// Client key for memcached TLS.
    #[arg(
        long,
        env = "MEMCACHE_TLS_CLIENT_KEY",
        value_name = "MEMCACHE_TLS_CLIENT_KEY",
        default_value = ""
    )]
    pub memcache_tls_client_key: String,
    /// CA for memcached TLS.
    #[arg(
        long,
        env = "MEMCACHE_TLS_CACERT",
        value_name = "MEMCACHE_TLS_CACERT",
        default_value = ""
    )]
    pub memcache_tls_cacert: String,
    /// Verify the chain but not the host name.
    #[arg(long, env = "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", value_name = "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub memcache_tls_skip_hostname_verification: bool,
}

/// Statistics sinks.
#[derive(Clone, Debug, Args)]
pub struct StatsSettings {
    /// Push statistics to statsd.
    #[arg(long, env = "USE_STATSD", value_name = "USE_STATSD", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub use_statsd: bool,
    /// statsd host.
    #[arg(
        long,
        env = "STATSD_HOST",
        value_name = "STATSD_HOST",
        default_value = "localhost"
    )]
    pub statsd_host: String,
    /// statsd port.
    #[arg(
        long,
        env = "STATSD_PORT",
        value_name = "STATSD_PORT",
        default_value_t = 8125
    )]
    pub statsd_port: u16,
    /// statsd protocol: tcp or udp.
    #[arg(
        long,
        env = "STATSD_PROTOCOL",
        value_name = "STATSD_PROTOCOL",
        default_value = "tcp"
    )]
    pub statsd_protocol: String,
    /// Push tagged statistics to DogStatsD (exclusive with USE_STATSD and USE_PROMETHEUS).
    #[arg(long, env = "USE_DOG_STATSD", value_name = "USE_DOG_STATSD", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub use_dog_statsd: bool,
    /// Mogrifier names; each reads DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS.
    #[arg(
        long,
        env = "USE_DOG_STATSD_MOGRIFIERS",
        value_name = "USE_DOG_STATSD_MOGRIFIERS",
        default_value = ""
    )]
    pub use_dog_statsd_mogrifiers: String,
    /// Serve Prometheus metrics.
    #[arg(long, env = "USE_PROMETHEUS", value_name = "USE_PROMETHEUS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub use_prometheus: bool,
    /// Prometheus listen address.
    #[arg(
        long,
        env = "PROMETHEUS_ADDR",
        value_name = "PROMETHEUS_ADDR",
        default_value = ":9090"
    )]
    pub prometheus_addr: String,
    /// Prometheus path.
    #[arg(
        long,
        env = "PROMETHEUS_PATH",
        value_name = "PROMETHEUS_PATH",
        default_value = "/metrics"
    )]
    pub prometheus_path: String,
    /// Custom statsd-to-Prometheus mapping file.
    #[arg(
        long,
        env = "PROMETHEUS_MAPPER_YAML",
        value_name = "PROMETHEUS_MAPPER_YAML",
        default_value = ""
    )]
    pub prometheus_mapper_yaml: String,
    /// Keep response times in milliseconds.
    #[arg(long, env = "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", value_name = "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub prometheus_response_time_as_milliseconds: bool,
    /// Tags on every statistic, `k1:v1,k2:v2`.
    #[arg(long, env = "EXTRA_TAGS", value_name = "EXTRA_TAGS", default_value = "", value_parser = go_map)]
    pub extra_tags: StringMap,
    /// Flush interval.
    #[arg(long, env = "STATS_FLUSH_INTERVAL", value_name = "STATS_FLUSH_INTERVAL", default_value = "10s", value_parser = go_duration)]
    pub stats_flush_interval: Duration,
    /// Disable statistics entirely.
    #[arg(long, env = "DISABLE_STATS", value_name = "DISABLE_STATS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub disable_stats: bool,
}

/// OpenTelemetry traces.
#[derive(Clone, Debug, Args)]
pub struct TracingSettings {
    /// Export OTLP spans.
    #[arg(long, env = "TRACING_ENABLED", value_name = "TRACING_ENABLED", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub tracing_enabled: bool,
    /// Service name in spans.
    #[arg(
        long,
        env = "TRACING_SERVICE_NAME",
        value_name = "TRACING_SERVICE_NAME",
        default_value = "RateLimit"
    )]
    pub tracing_service_name: String,
    /// Service namespace in spans.
    #[arg(
        long,
        env = "TRACING_SERVICE_NAMESPACE",
        value_name = "TRACING_SERVICE_NAMESPACE",
        default_value = ""
    )]
    pub tracing_service_namespace: String,
    /// Instance id in spans (default: a random UUID).
    #[arg(
        long,
        env = "TRACING_SERVICE_INSTANCE_ID",
        value_name = "TRACING_SERVICE_INSTANCE_ID",
        default_value = ""
    )]
    pub tracing_service_instance_id: String,
    /// http or grpc.
    #[arg(long, env = "TRACING_EXPORTER_PROTOCOL", value_name = "TRACING_EXPORTER_PROTOCOL", default_value = "http", value_parser = ["http", "grpc"])]
    pub tracing_exporter_protocol: String,
    /// Share of requests traced, 0 to 1.
    #[arg(long, env = "TRACING_SAMPLING_RATE", value_name = "TRACING_SAMPLING_RATE", default_value = "1", value_parser = ratio)]
    pub tracing_sampling_rate: f32,
}

/// A `k1:v1,k2:v2` map.
pub type StringMap = BTreeMap<String, String>;

/// Go's `strconv.ParseBool`.
pub fn go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("expected a boolean (true, false, 1, 0, t, f)".into()),
    }
}

/// Go's `time.ParseDuration`: `10s`, `150us`, `1h30m`, `1.5s`, `0`.
pub fn go_duration(value: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "expected a duration with a unit, such as 10s, 150ms or 1h30m (units: ns, us, ms, s, m, h); got '{value}'"
        )
    };
    if value == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = value;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if number_len == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// `k1:v1,k2:v2`.
pub fn go_map(value: &str) -> Result<StringMap, String> {
    value
        .split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split_once(':')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("expected k1:v1,k2:v2; '{pair}' has no ':'"))
        })
        .collect()
}

fn ratio(value: &str) -> Result<f32, String> {
    match value.parse::<f32>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("expected a number from 0 to 1; got '{value}'")),
    }
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

fn config_type(value: &str) -> Result<ConfigType, String> {
    match value {
        "FILE" => Ok(ConfigType::File),
        "GRPC_XDS_SOTW" => Ok(ConfigType::GrpcXdsSotw),
        _ => Err(format!("expected FILE or GRPC_XDS_SOTW; got '{value}'")),
    }
}

fn backend_type(value: &str) -> Result<BackendType, String> {
    match value.to_ascii_lowercase().as_str() {
        "redis" => Ok(BackendType::Redis),
        "memcache" => Ok(BackendType::Memcache),
        "memory" => Ok(BackendType::Memory),
        _ => Err(format!("expected redis, memcache or memory; got '{value}'")),
    }
}

fn redis_type(value: &str) -> Result<String, String> {
    let lower = value.to_ascii_lowercase();
    match lower.as_str() {
        "single" | "sentinel" | "cluster" => Ok(lower),
        _ => Err(format!(
            "expected single, sentinel or cluster; got '{value}'"
        )),
    }
}

fn pool_behavior(value: &str) -> Result<String, String> {
    let upper = value.to_ascii_uppercase();
    match upper.as_str() {
        "CREATE" | "ERROR" | "WAIT" => Ok(upper),
        _ => Err(format!("expected CREATE, ERROR or WAIT; got '{value}'")),
    }
}

impl Settings {
    /// The backend to run: BACKEND_TYPE, else redis when REDIS_URL is set, else memory.
    pub fn backend(&self) -> BackendType {
        match (self.limiter.backend_type, &self.redis.redis_url) {
            (Some(kind), _) => kind,
            (None, Some(_)) => BackendType::Redis,
            (None, None) => BackendType::Memory,
        }
    }

    /// The engine settings.
    pub fn core(&self) -> ratelimit_core::Settings {
        ratelimit_core::Settings {
            near_limit_ratio: self.limiter.near_limit_ratio,
            cache_key_prefix: self.limiter.cache_key_prefix.clone(),
            stop_cache_key_increment_when_overlimit: self
                .limiter
                .stop_cache_key_increment_when_overlimit,
            shadow_mode: self.limiter.shadow_mode,
            quota_mode: self.limiter.quota_mode,
            local_cache_size_in_bytes: usize::try_from(self.limiter.local_cache_size_in_bytes)
                .unwrap_or(usize::MAX),
            bounds: self.bounds.request_bounds(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(go_duration("150us"), Ok(Duration::from_micros(150)));
        assert_eq!(go_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(go_duration("0"), Ok(Duration::ZERO));
        assert!(go_duration("10").is_err());
        assert!(go_duration("").is_err());
        assert!(go_duration("5 s").is_err());
        assert!(go_duration("s").is_err());
    }

    #[test]
    fn go_bools_and_maps() {
        assert_eq!(go_bool("T"), Ok(true));
        assert_eq!(go_bool("0"), Ok(false));
        assert!(go_bool("yes").is_err());
        let map = go_map("a:1,b:2").unwrap();
        assert_eq!(map.get("b").map(String::as_str), Some("2"));
        assert!(go_map("a").is_err());
        assert!(go_map("").unwrap().is_empty());
    }

    #[test]
    fn defaults_match_envoy_ratelimit() {
        // clap also reads the environment: check only what this process's environment
        // leaves at its default.
        let unset = |name: &str| std::env::var_os(name).is_none();
        let s = Settings::parse_from(["ratelimit"]);
        if unset("PORT") && unset("GRPC_PORT") && unset("DEBUG_PORT") {
            assert_eq!(
                (s.server.port, s.server.grpc_port, s.server.debug_port),
                (8080, 8081, 6070)
            );
        }
        if unset("RUNTIME_ROOT") {
            assert_eq!(s.config.runtime_root, "/srv/runtime_data/current");
        }
        if unset("NEAR_LIMIT_RATIO") {
            assert_eq!(s.limiter.near_limit_ratio, 0.8);
        }
        if unset("REDIS_POOL_SIZE") {
            assert_eq!(s.redis.redis_pool_size, 10);
        }
        if unset("STATS_FLUSH_INTERVAL") {
            assert_eq!(s.stats.stats_flush_interval, Duration::from_secs(10));
        }
        if unset("RUNTIME_WATCH_ROOT") && unset("USE_STATSD") {
            assert!(s.config.runtime_watch_root && s.stats.use_statsd);
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        let error =
            Settings::try_parse_from(["ratelimit", "--near-limit-ratio", "1.5"]).unwrap_err();
        assert!(error.to_string().contains("NEAR_LIMIT_RATIO"), "{error}");
        let error = Settings::try_parse_from(["ratelimit", "--backend-type", "etcd"]).unwrap_err();
        assert!(error.to_string().contains("BACKEND_TYPE"), "{error}");
    }
}
