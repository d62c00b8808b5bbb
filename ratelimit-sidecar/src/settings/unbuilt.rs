//! Settings of features this version does not have yet, all in one place.
//!
//! They are parsed (a bad value still names the variable), but none of them may be set:
//! an explicit value stops start-up and names the setting, so that, say,
//! `GRPC_SERVER_USE_TLS=true` never becomes a server that quietly speaks plaintext. A
//! switch set explicitly to off (`USE_PROMETHEUS=false`) is accepted: it asks for
//! nothing. When a feature is built, its settings move to a module of their own.

use std::time::Duration;

use clap::{ArgAction, Args};

use super::values::{StringMap, go_bool, go_duration, go_map};

/// The xDS configuration source and memcached.
#[derive(Clone, Debug, Args)]
pub struct UnbuiltSettings {
    /// Open the listeners before the first configuration is loaded.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub force_start_without_initial_config: bool,
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
    /// `host:port,...` of every node (same list on every instance).
    #[arg(long, env, default_value = "")]
    pub memcache_host_port: String,
    /// SRV record listing the nodes (exclusive with MEMCACHE_HOST_PORT).
    #[arg(long, env, default_value = "")]
    pub memcache_srv: String,
    /// How often to look the SRV record up again (0: never).
    #[arg(long, env, default_value = "0", value_parser = go_duration)]
    pub memcache_srv_refresh: Duration,
    /// Idle connections kept per node.
    #[arg(long, env, default_value_t = 2)]
    pub memcache_max_idle_conns: usize,
    /// Connect with TLS.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub memcache_tls: bool,
    /// Client certificate for memcached TLS.
    #[arg(long, env, default_value = "")]
    pub memcache_tls_client_cert: String,
    /// Client key for memcached TLS.
    #[arg(long, env, default_value = "")]
    pub memcache_tls_client_key: String,
    /// CA for memcached TLS.
    #[arg(long, env, default_value = "")]
    pub memcache_tls_cacert: String,
    /// Verify the chain but not the host name.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub memcache_tls_skip_hostname_verification: bool,
}

/// `BACKEND_TYPE=memcache`, refused.
pub const MEMCACHE_BACKEND: &str =
    "BACKEND_TYPE=memcache: this backend is not available in this version; use redis or memory";
/// `CONFIG_TYPE=GRPC_XDS_SOTW`, refused.
pub const XDS_CONFIG: &str = "CONFIG_TYPE=GRPC_XDS_SOTW: the xDS configuration source is not available in this version; use CONFIG_TYPE=FILE";

/// One message for each setting given a value (by `explicit`, which says whether the
/// setting with that id came from the environment or the command line), except switches
/// set to off.
pub fn explicitly_set(settings: &UnbuiltSettings, explicit: impl Fn(&str) -> bool) -> Vec<String> {
    UnbuiltSettings::augment_args(clap::Command::new("ratelimit"))
        .get_arguments()
        .filter(|arg| {
            explicit(arg.get_id().as_str()) && !asks_for_nothing(settings, arg.get_id().as_str())
        })
        .map(|arg| {
            let id = arg.get_id().as_str();
            let name = arg
                .get_env()
                .map_or_else(|| id.to_owned(), |env| env.to_string_lossy().into_owned());
            format!(
                "{name}: {} not available in this version; unset it",
                feature(id)
            )
        })
        .collect()
}

/// A switch set to off, which asks for nothing.
fn asks_for_nothing(settings: &UnbuiltSettings, id: &str) -> bool {
    match id {
        "xds_server_use_tls" => !settings.xds_server_use_tls,
        "memcache_tls" => !settings.memcache_tls,
        _ => false,
    }
}

/// What a setting belongs to, by its id.
fn feature(id: &str) -> &'static str {
    if id.starts_with("xds_") || id == "force_start_without_initial_config" {
        "the xDS configuration source is"
    } else {
        "the memcached backend is"
    }
}
