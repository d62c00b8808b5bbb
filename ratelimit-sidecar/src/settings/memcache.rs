//! The memcached backend (`BACKEND_TYPE=memcache`).

use std::time::Duration;

use clap::Args;

use super::values::go_duration;

/// Where the memcached nodes are and how they are used.
#[derive(Clone, Debug, Args)]
pub struct MemcacheSettings {
    /// `host:port,host:port` of every node, the same list in the same order on every
    /// instance (a key's node depends on both).
    #[arg(long, env, default_value = "")]
    pub memcache_host_port: String,
    /// Idle connections kept per node (and per worker).
    #[arg(long, env, default_value_t = 2)]
    pub memcache_max_idle_conns: usize,
    /// Time a call to memcached may take, connecting included (this project's; upstream's
    /// client always allows 500 ms).
    #[arg(long, env, default_value = "500ms", value_parser = go_duration)]
    pub memcache_timeout: Duration,
}
