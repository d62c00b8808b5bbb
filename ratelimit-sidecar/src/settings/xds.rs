//! The xDS configuration source (`CONFIG_TYPE=GRPC_XDS_SOTW`): envoyproxy/ratelimit's
//! `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` variables.

use std::time::Duration;

use clap::{ArgAction, Args};

use ratelimit_service_kit::values::{StringMap, go_bool, go_duration, go_map};

/// Where rules come from over xDS, and how the client connects.
#[derive(Clone, Debug, Args)]
pub struct XdsSettings {
    /// With xDS: open the listeners before the first configuration arrives (requests
    /// fail with "no rate limit configuration loaded" until it does).
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub force_start_without_initial_config: bool,
    /// The node id sent to the xDS server.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_NODE_ID",
        value_name = "CONFIG_GRPC_XDS_NODE_ID",
        default_value = "default"
    )]
    pub xds_node_id: String,
    /// The node metadata sent to the xDS server, `k1=v1,k2=v2` (string values).
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_METADATA", value_name = "CONFIG_GRPC_XDS_NODE_METADATA", default_value = "", value_parser = node_metadata)]
    pub xds_node_metadata: StringMap,
    /// The xDS server, `host:port`.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_URL",
        value_name = "CONFIG_GRPC_XDS_SERVER_URL",
        default_value = "localhost:18000"
    )]
    pub xds_server_url: String,
    /// Until the first configuration arrives, a failed connection is retried after this
    /// long (afterwards the XDS_CLIENT_BACKOFF_* back-off applies).
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", value_name = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", default_value = "3s", value_parser = go_duration)]
    pub xds_server_connect_retry_interval: Duration,
    /// gRPC metadata on the xDS stream, `k1:v1,k2:v2`.
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", value_name = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", default_value = "", value_parser = go_map)]
    pub xds_client_additional_headers: StringMap,
    /// Connect to the xDS server with TLS.
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_USE_TLS", value_name = "CONFIG_GRPC_XDS_SERVER_USE_TLS", default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub xds_server_use_tls: bool,
    /// Client certificate presented to the xDS server, PEM (with the key).
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        value_name = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        default_value = ""
    )]
    pub xds_client_tls_cert: String,
    /// Client key for the xDS server, PEM.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        value_name = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        default_value = ""
    )]
    pub xds_client_tls_key: String,
    /// A CA trusted for the xDS server, PEM, besides the system's.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        value_name = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        default_value = ""
    )]
    pub xds_server_tls_cacert: String,
    /// The name the xDS server's certificate must carry (default: the URL's host).
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        value_name = "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        default_value = ""
    )]
    pub xds_server_tls_san: String,
    /// First wait before reconnecting after the stream broke.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", value_name = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", default_value = "10s", value_parser = go_duration)]
    pub xds_backoff_initial_interval: Duration,
    /// Longest wait before reconnecting (the wait doubles up to it).
    #[arg(long, env = "XDS_CLIENT_BACKOFF_MAX_INTERVAL", value_name = "XDS_CLIENT_BACKOFF_MAX_INTERVAL", default_value = "60s", value_parser = go_duration)]
    pub xds_backoff_max_interval: Duration,
    /// With jitter, each wait is spread by up to this share either way (0 to 1).
    #[arg(long, env = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", value_name = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", default_value = "0.5", value_parser = ratelimit_service_kit::values::ratio)]
    pub xds_backoff_random_factor: f32,
    /// Spread the waits at random.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_JITTER", value_name = "XDS_CLIENT_BACKOFF_JITTER", default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub xds_backoff_jitter: bool,
    /// Largest xDS message accepted, in bytes (0: 4 MiB).
    #[arg(
        long,
        env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        value_name = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        default_value_t = 0
    )]
    pub xds_max_msg_size_in_bytes: usize,
}

/// `k1=v1,k2=v2`; an item without `=` is an error (envoyproxy/ratelimit drops it).
fn node_metadata(value: &str) -> Result<StringMap, String> {
    value
        .split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("expected k1=v1,k2=v2; '{pair}' has no '='"))
        })
        .collect()
}
