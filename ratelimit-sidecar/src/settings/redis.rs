//! The Redis backend.

use std::time::Duration;

use clap::{ArgAction, Args};

use ratelimit_service_kit::values::{go_bool, go_duration};

/// One Redis deployment (the main one, or the per-second one).
#[derive(Clone, Debug, Args)]
pub struct RedisSettings {
    /// tcp or unix.
    #[arg(long, env, default_value = "unix", value_parser = socket_type)]
    pub redis_socket_type: String,
    /// single, sentinel or cluster.
    #[arg(long, env, default_value = "single", value_parser = redis_type)]
    pub redis_type: RedisType,
    /// Address, or sentinel `master,host:port,...`, or cluster `host:port,...`.
    #[arg(long, env)]
    pub redis_url: Option<String>,
    /// Connections per pool.
    #[arg(long, env, default_value_t = 10)]
    pub redis_pool_size: usize,
    /// `password` or `user:password`.
    #[arg(long, env, default_value = "", hide_env_values = true)]
    pub redis_auth: String,
    /// Credentials for sentinels.
    #[arg(long, env, default_value = "", hide_env_values = true)]
    pub redis_sentinel_auth: String,
    /// Connect with TLS.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_tls: bool,
    /// Client certificate for Redis TLS.
    #[arg(long, env, default_value = "")]
    pub redis_tls_client_cert: String,
    /// Client key for Redis TLS.
    #[arg(long, env, default_value = "")]
    pub redis_tls_client_key: String,
    /// CA for Redis TLS.
    #[arg(long, env, default_value = "")]
    pub redis_tls_cacert: String,
    /// Verify the chain but not the host name.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_tls_skip_hostname_verification: bool,
    /// Connect, read and write timeout.
    #[arg(long, env, default_value = "10s", value_parser = go_duration)]
    pub redis_timeout: Duration,
    /// CREATE, ERROR or WAIT when the pool is empty.
    #[arg(long, env, default_value = "CREATE", value_parser = pool_behavior)]
    pub redis_pool_on_empty_behavior: String,
    /// Wait before the CREATE or ERROR action.
    #[arg(long, env, default_value = "1s", value_parser = go_duration)]
    pub redis_pool_on_empty_wait_duration: Duration,
    /// Implicit pipelining window (0: flush each write).
    #[arg(long, env, default_value = "0", value_parser = go_duration)]
    pub redis_pipeline_window: Duration,
    /// Deprecated, no effect.
    #[arg(long, env, default_value_t = 0)]
    pub redis_pipeline_limit: u64,
    /// Cluster pipelines run in parallel (0: pool size).
    #[arg(long, env, default_value_t = 1)]
    pub redis_cluster_pipeline_parallelism: u32,
    /// Health follows whether a connection is alive.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_health_check_active_connection: bool,
    /// First start-up connection retry interval.
    #[arg(long, env, default_value = "1s", value_parser = go_duration)]
    pub redis_startup_initial_interval: Duration,
    /// Longest start-up connection retry interval.
    #[arg(long, env, default_value = "30s", value_parser = go_duration)]
    pub redis_startup_max_interval: Duration,
    /// Give up connecting at start-up after this long (0: never).
    #[arg(long, env, default_value = "0", value_parser = go_duration)]
    pub redis_startup_max_elapsed_time: Duration,
    /// Send per-second limits to their own Redis.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_persecond: bool,
    /// Per-second Redis: tcp or unix.
    #[arg(long, env, default_value = "unix", value_parser = socket_type)]
    pub redis_persecond_socket_type: String,
    /// Per-second Redis: single, sentinel or cluster.
    #[arg(long, env, default_value = "single", value_parser = redis_type)]
    pub redis_persecond_type: RedisType,
    /// Per-second Redis address.
    #[arg(
        long,
        env,
        default_value = "/var/run/nutcracker/ratelimitpersecond.sock"
    )]
    pub redis_persecond_url: String,
    /// Per-second Redis pool size.
    #[arg(long, env, default_value_t = 10)]
    pub redis_persecond_pool_size: usize,
    /// Per-second Redis credentials.
    #[arg(long, env, default_value = "", hide_env_values = true)]
    pub redis_persecond_auth: String,
    /// Per-second sentinel credentials.
    #[arg(long, env, default_value = "", hide_env_values = true)]
    pub redis_persecond_sentinel_auth: String,
    /// Per-second Redis over TLS.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub redis_persecond_tls: bool,
    /// Per-second Redis timeout.
    #[arg(long, env, default_value = "10s", value_parser = go_duration)]
    pub redis_persecond_timeout: Duration,
    /// Per-second pool behaviour when empty.
    #[arg(long, env, default_value = "CREATE", value_parser = pool_behavior)]
    pub redis_persecond_pool_on_empty_behavior: String,
    /// Per-second wait before the empty-pool action.
    #[arg(long, env, default_value = "1s", value_parser = go_duration)]
    pub redis_persecond_pool_on_empty_wait_duration: Duration,
    /// Per-second pipelining window.
    #[arg(long, env, default_value = "0", value_parser = go_duration)]
    pub redis_persecond_pipeline_window: Duration,
    /// Deprecated, no effect.
    #[arg(long, env, default_value_t = 0)]
    pub redis_persecond_pipeline_limit: u64,
    /// Per-second cluster pipeline parallelism.
    #[arg(long, env, default_value_t = 1)]
    pub redis_persecond_cluster_pipeline_parallelism: u32,
}

fn socket_type(value: &str) -> Result<String, String> {
    let lower = value.to_ascii_lowercase();
    match lower.as_str() {
        "tcp" | "unix" => Ok(lower),
        _ => Err(format!("expected tcp or unix; got '{value}'")),
    }
}

/// The shape of a Redis deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisType {
    /// One server.
    Single,
    /// The master a set of sentinels names.
    Sentinel,
    /// A cluster.
    Cluster,
}

impl std::fmt::Display for RedisType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedisType::Single => "single",
            RedisType::Sentinel => "sentinel",
            RedisType::Cluster => "cluster",
        })
    }
}

fn redis_type(value: &str) -> Result<RedisType, String> {
    match value.to_ascii_lowercase().as_str() {
        "single" => Ok(RedisType::Single),
        "sentinel" => Ok(RedisType::Sentinel),
        "cluster" => Ok(RedisType::Cluster),
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
