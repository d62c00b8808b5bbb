//! The memcached backend (`BACKEND_TYPE=memcache`).

use std::time::Duration;

use clap::{ArgAction, Args};

use ratelimit_service_kit::values::{go_bool, go_duration};

/// Where the memcached nodes are and how they are used.
#[derive(Clone, Debug, Args)]
pub struct MemcacheSettings {
    /// `host:port,host:port` of every node, the same list in the same order on every
    /// instance (a key's node depends on both).
    #[arg(long, env, default_value = "")]
    pub memcache_host_port: String,
    /// An SRV record naming the nodes, `_service._proto.name` (exclusive with
    /// MEMCACHE_HOST_PORT): one node per record, ordered as upstream orders them.
    #[arg(long, env, default_value = "")]
    pub memcache_srv: String,
    /// How often to look MEMCACHE_SRV up again (0: never).
    #[arg(long, env, default_value = "0", value_parser = go_duration)]
    pub memcache_srv_refresh: Duration,
    /// The DNS server for MEMCACHE_SRV, `ip:port` (this project's; default: the
    /// system's resolver, from /etc/resolv.conf).
    #[arg(long, env, default_value = "")]
    pub memcache_srv_dns_server: String,
    /// Accepted as envoyproxy/ratelimit's setting and unused (a warning at start-up says
    /// so when it is set): each worker keeps one pipelined connection per node, whatever
    /// the concurrency.
    #[arg(long, env, default_value_t = 2)]
    pub memcache_max_idle_conns: usize,
    /// Time a call to memcached may take, connecting included (this project's; upstream's
    /// client always allows 500 ms).
    #[arg(long, env, default_value = "500ms", value_parser = go_duration)]
    pub memcache_timeout: Duration,
    /// Connect to every node with TLS.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub memcache_tls: bool,
    /// Client certificate presented to the nodes, PEM (with the key).
    #[arg(long, env, default_value = "")]
    pub memcache_tls_client_cert: String,
    /// Client key, PEM.
    #[arg(long, env, default_value = "")]
    pub memcache_tls_client_key: String,
    /// A CA trusted for the nodes, PEM, besides the system's.
    #[arg(long, env, default_value = "")]
    pub memcache_tls_cacert: String,
    /// Verify the chain but not the node's name.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub memcache_tls_skip_hostname_verification: bool,
}
