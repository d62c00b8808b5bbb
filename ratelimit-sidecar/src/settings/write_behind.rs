//! Write-behind counters on a remote store (ours; upstream has none).

use std::time::Duration;

use clap::{ArgAction, Args};

use ratelimit_service_kit::values::{go_bool, go_duration};

/// Deciding from local counts and sending them to the store in the background.
#[derive(Clone, Debug, Args)]
pub struct WriteBehindSettings {
    /// Decide from the last totals the store reported plus this replica's hits since, and
    /// send the hits every WRITE_BEHIND_FLUSH_INTERVAL (Redis or memcached; a key may
    /// admit more than its limit across replicas: see docs/backends.md).
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub write_behind: bool,
    /// How often a write-behind replica sends its pending hits.
    #[arg(long, env, default_value = "100ms", value_parser = go_duration)]
    pub write_behind_flush_interval: Duration,
    /// Keys a write-behind replica keeps at most (the ones whose window ends first go).
    #[arg(long, env, default_value_t = 1 << 20)]
    pub write_behind_max_keys: usize,
}

impl WriteBehindSettings {
    /// Whether the settings agree with the store they are for.
    pub fn check(&self, remote: bool) -> Result<(), String> {
        if !self.write_behind {
            return Ok(());
        }
        if !remote {
            return Err("WRITE_BEHIND=true needs BACKEND_TYPE redis or memcache: the memory backend is already local".into());
        }
        if self.write_behind_flush_interval.is_zero() {
            return Err("WRITE_BEHIND_FLUSH_INTERVAL must be above 0".into());
        }
        Ok(())
    }
}
