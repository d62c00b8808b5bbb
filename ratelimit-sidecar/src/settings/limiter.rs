//! Settings of the decision itself.

use clap::{ArgAction, Args};

use ratelimit_service_kit::values::{go_bool, ratio};

/// Settings of the decision itself.
#[derive(Clone, Debug, Args)]
pub struct LimiterSettings {
    /// redis, memcache or memory (default: redis when REDIS_URL is set, else memory).
    #[arg(long, env, value_parser = backend_type)]
    pub backend_type: Option<BackendType>,
    /// Counters the memory backend keeps at most (our addition).
    #[arg(long, env, default_value_t = 1 << 20)]
    pub memory_max_counters: usize,
    /// Random extra seconds, below this, added to counter expiry.
    #[arg(long, env, default_value_t = 300)]
    pub expiration_jitter_max_seconds: u64,
    /// Bytes of the local cache of over-limit keys (0 disables it).
    #[arg(long, env, default_value_t = 0)]
    pub local_cache_size_in_bytes: u64,
    /// Share of the limit above which hits count as near_limit (0 to 1).
    #[arg(long, env, default_value = "0.8", value_parser = ratio)]
    pub near_limit_ratio: f32,
    /// Prepended to every cache key.
    #[arg(long, env, default_value = "")]
    pub cache_key_prefix: String,
    /// Leave the other counters alone when a descriptor would go over its limit.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub stop_cache_key_increment_when_overlimit: bool,
    /// Always answer OK overall (statuses keep the truth).
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub shadow_mode: bool,
    /// Every descriptor is a quota: over limit only when all are.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub quota_mode: bool,
    /// Fill dynamic_metadata in responses.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub response_dynamic_metadata: bool,
    /// Add the RateLimit-* headers to responses.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub limit_response_headers_enabled: bool,
    /// Name of the limit header.
    #[arg(long, env, default_value = "RateLimit-Limit")]
    pub limit_limit_header: String,
    /// Name of the remaining header.
    #[arg(long, env, default_value = "RateLimit-Remaining")]
    pub limit_remaining_header: String,
    /// Name of the reset header.
    #[arg(long, env, default_value = "RateLimit-Reset")]
    pub limit_reset_header: String,
    /// Which headers LIMIT_RESPONSE_HEADERS_ENABLED adds: ratelimit (the three above) or
    /// ietf-draft-11 (RateLimit-Policy and RateLimit, as Structured Fields; our addition).
    #[arg(long, env, default_value = "ratelimit", value_enum)]
    pub limit_response_headers_format: HeadersFormat,
}

/// The rate-limit headers' format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeadersFormat {
    /// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.
    Ratelimit,
    /// draft-ietf-httpapi-ratelimit-headers-11: RateLimit-Policy and RateLimit.
    #[value(name = "ietf-draft-11")]
    IetfDraft11,
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

fn backend_type(value: &str) -> Result<BackendType, String> {
    match value.to_ascii_lowercase().as_str() {
        "redis" => Ok(BackendType::Redis),
        "memcache" => Ok(BackendType::Memcache),
        "memory" => Ok(BackendType::Memory),
        _ => Err(format!("expected redis, memcache or memory; got '{value}'")),
    }
}
