//! Where rules come from: YAML files under the runtime directory ([`files`]) or an xDS
//! server ([`xds`]). Each source turns what it reads into a [`ratelimit_core::Config`]
//! (or the error that refused it) and hands it to [`apply_from`], which is the one place
//! rules reach the limiter: the swap, the load statistics, the log and the health.

pub mod files;
pub(crate) mod xds;

use ratelimit_core::Config;
use ratelimit_core::stats::names;
use ratelimit_service_kit::announce::{announce_loaded, announce_rejected};

use ratelimit_service_kit::clock::unix_now;

use crate::decider::{Decider, LoadResult};

/// Applies a load result from `source` (files or xDS): swap the rules and count
/// `config_load_success` (warning, with `why_empty`, when no domain was found: every
/// request is then allowed), or keep the old rules, log the error and count
/// `config_load_error`.
pub async fn apply_from(
    service: &Decider,
    source: &str,
    why_empty: &str,
    result: Result<Config, String>,
) {
    let stats = service.limiter.stats();
    let result = result.and_then(|config| match service.backend.refusal(&config) {
        Some(refusal) => Err(refusal),
        None => Ok(config),
    });
    match result {
        Ok(config) => {
            service.limiter.set_config(&config);
            stats.counter(names::CONFIG_LOAD_SUCCESS).add(1);
            let loaded = announce_loaded(&service.limiter, &config, source, why_empty);
            let count = loaded.len();
            record(service, Ok(loaded));
            service.health.config_loaded(count).await;
        }
        Err(error) => {
            stats.counter(names::CONFIG_LOAD_ERROR).add(1);
            announce_rejected(&error);
            record(service, Err(error));
        }
    }
}

fn record(service: &Decider, outcome: Result<Vec<String>, String>) {
    let result = LoadResult {
        at: unix_now(),
        outcome,
    };
    *service
        .last_load
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(result);
}
