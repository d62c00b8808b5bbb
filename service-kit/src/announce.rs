//! What every service that reloads rate-limit rules logs about a load: the domains,
//! warnings and rules of a configuration it took, or why it refused one.

use ratelimit_core::{Config, Limiter};

/// Logs a configuration just given to `limiter` (from `source`): its domains, warnings
/// and rules, and a warning, with `why_empty`, when it has no domain. Returns the
/// domains. Every service that reloads rules says the same.
pub fn announce_loaded(
    limiter: &Limiter,
    config: &Config,
    source: &str,
    why_empty: &str,
) -> Vec<String> {
    let domains: Vec<String> = config.domains().iter().map(|d| d.domain.clone()).collect();
    tracing::info!(domains = ?domains, "loaded rate limit configuration");
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    if domains.is_empty() {
        tracing::warn!(
            source,
            "no rate limit domain loaded ({why_empty}): every request will be allowed"
        );
    }
    for line in limiter.describe().lines() {
        tracing::info!("rule {line}");
    }
    domains
}

/// Logs a configuration that was refused, with the error.
pub fn announce_rejected(error: &str) {
    tracing::error!(error = %error, "rate limit configuration rejected; the previous configuration stays in use");
}
