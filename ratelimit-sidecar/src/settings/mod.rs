//! Every setting of envoyproxy/ratelimit, read from the same environment variables, each
//! also a command-line flag (`--near-limit-ratio` for `NEAR_LIMIT_RATIO`), split by
//! concern. Values are parsed the way that project parses them ([`ratelimit_service_kit::values`]); a bad value
//! stops start-up with a message naming the variable, and so do settings that contradict
//! each other.

pub mod bounds;
pub mod cli;
mod config;
mod limiter;
mod memcache;
mod outage;
mod redis;
mod server;
mod stats;
mod tls;
mod traces;
mod write_behind;
mod xds;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};

pub use self::config::{ConfigSettings, ConfigType};
pub use self::limiter::{BackendType, HeadersFormat, LimiterSettings};
pub use self::memcache::MemcacheSettings;
pub use self::outage::{FailureMode, OutageSettings};
pub use self::redis::{RedisSettings, RedisType};
pub use self::server::{LogFormat, ServerSettings};
pub use self::stats::{Outputs, StatsSettings};
pub use self::tls::TlsSettings;
pub use self::traces::TracingSettings;
pub use self::write_behind::WriteBehindSettings;
pub use self::xds::XdsSettings;
pub use crate::settings::bounds::BoundsSettings;
pub use ratelimit_service_kit::values::{StringMap, go_bool, go_duration, go_map};

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
    #[command(flatten, next_help_heading = "xDS configuration source")]
    pub xds: XdsSettings,
    #[command(flatten, next_help_heading = "Limiter")]
    pub limiter: LimiterSettings,
    #[command(flatten, next_help_heading = "Redis backend")]
    pub redis: RedisSettings,
    #[command(flatten, next_help_heading = "memcached backend")]
    pub memcache: MemcacheSettings,
    #[command(flatten, next_help_heading = "Write-behind counters")]
    pub write_behind: WriteBehindSettings,
    #[command(flatten, next_help_heading = "Backend outages")]
    pub outage: OutageSettings,
    #[command(flatten, next_help_heading = "Bounds")]
    pub bounds: BoundsSettings,
    #[command(flatten, next_help_heading = "Statistics")]
    pub stats: StatsSettings,
    #[command(flatten, next_help_heading = "TLS")]
    pub tls: TlsSettings,
    #[command(flatten, next_help_heading = "Traces")]
    pub tracing: TracingSettings,
}

impl Settings {
    /// Parses the command line and the environment, and checks that the settings agree.
    /// Returns the settings and the warnings to log.
    pub fn load() -> Result<(Settings, Vec<String>), LoadError> {
        Settings::load_from(std::env::args_os())
    }

    /// [`Settings::load`] from the given arguments (and the environment).
    pub fn load_from<I, T>(args: I) -> Result<(Settings, Vec<String>), LoadError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Settings::command().try_get_matches_from(args)?;
        let mut settings = Settings::from_arg_matches(&matches)?;
        let stats = &mut settings.stats;
        stats.use_statsd_explicit = set_explicitly(&matches, "use_statsd");
        stats
            .load_mogrifiers(|name| std::env::var(name).ok())
            .map_err(LoadError::Invalid)?;
        let outputs = stats.outputs().map_err(LoadError::Invalid)?;
        settings
            .tls
            .check(&settings.server.grpc_uds)
            .map_err(LoadError::Invalid)?;
        let remote = settings.backend() != BackendType::Memory;
        settings
            .write_behind
            .check(remote)
            .map_err(LoadError::Invalid)?;
        let warnings = settings.warnings(&matches, outputs.statsd);
        Ok((settings, warnings))
    }

    /// What to warn of at start-up: settings that are accepted but change nothing here,
    /// and a default an operator may not expect.
    fn warnings(&self, matches: &clap::ArgMatches, statsd: bool) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.xds.force_start_without_initial_config
            && self.config.config_type == ConfigType::File
        {
            warnings.push("FORCE_START_WITHOUT_INITIAL_CONFIG applies to CONFIG_TYPE=GRPC_XDS_SOTW only; files are always read before the listeners open".into());
        }
        if set_explicitly(matches, "memcache_max_idle_conns")
            && self.backend() == BackendType::Memcache
        {
            warnings.push("MEMCACHE_MAX_IDLE_CONNS has no effect: each worker keeps one pipelined connection per memcached node, whatever the concurrency".into());
        }
        let stats = &self.stats;
        if statsd && !stats.use_statsd_explicit {
            warnings.push(format!(
                "USE_STATSD is true by default: statistics are pushed to {}:{} over {} every {:?}; set USE_STATSD=false to log them instead",
                stats.statsd_host, stats.statsd_port, stats.statsd_protocol, stats.stats_flush_interval
            ));
        }
        warnings
    }
}

/// Whether the setting `id` was given (in the environment or on the command line) rather
/// than left at its default.
fn set_explicitly(matches: &clap::ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::EnvVariable | ValueSource::CommandLine)
    )
}

/// Why the settings were not loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A bad value, an unknown flag, or `--help`/`--version` (which clap prints).
    #[error(transparent)]
    Parse(#[from] clap::Error),
    /// Settings that contradict each other, or name something unusable.
    #[error("{0}")]
    Invalid(String),
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
            max_stat_keys: self.bounds.max_stat_keys,
            bounds: self.bounds.request_bounds(),
            report_policies: self.limiter.limit_response_headers_enabled
                && self.limiter.limit_response_headers_format == HeadersFormat::IetfDraft11,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        assert!(go_map(" ").unwrap().is_empty());
        // envconfig's items: exactly one ':' each, and no empty one.
        assert!(go_map("a:x:y").is_err());
        assert!(go_map("a:1,").is_err());
    }

    #[test]
    fn a_log_format_other_than_json_is_text_as_upstream_reads_it() {
        let format = |value: &str| {
            Settings::parse_from(["ratelimit", "--log-format", value])
                .server
                .log_format
        };
        assert_eq!(format("JSON"), LogFormat::Json);
        assert_eq!(format("xml"), LogFormat::Text);
        assert_eq!(format(""), LogFormat::Text);
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
    fn contradictory_tls_settings_stop_start_up() {
        let invalid = |args: &[&str]| match Settings::load_from(args) {
            Err(LoadError::Invalid(error)) => error,
            other => panic!("{args:?} was accepted: {other:?}"),
        };
        for (args, names) in [
            (
                &["--grpc-server-use-tls", "true"][..],
                "GRPC_SERVER_TLS_CERT",
            ),
            (
                &["--grpc-client-tls-cacert", "/ca.pem"],
                "GRPC_SERVER_USE_TLS",
            ),
            (
                &["--grpc-client-tls-san", "client.test"],
                "GRPC_CLIENT_TLS_CACERT",
            ),
            (&["--http-server-use-tls", "true"], "GRPC_SERVER_USE_TLS"),
            (
                &[
                    "--grpc-server-use-tls",
                    "true",
                    "--grpc-server-tls-cert",
                    "c",
                    "--grpc-server-tls-key",
                    "k",
                    "--grpc-uds",
                    "/s",
                ],
                "GRPC_UDS",
            ),
        ] {
            let all: Vec<&str> = std::iter::once("ratelimit")
                .chain(args.iter().copied())
                .collect();
            let error = invalid(&all);
            assert!(error.contains(names), "{args:?}: {error}");
        }
    }

    #[test]
    fn one_statistics_sink_is_chosen_like_envoy_ratelimit() {
        if [
            "USE_STATSD",
            "USE_DOG_STATSD",
            "USE_PROMETHEUS",
            "DISABLE_STATS",
            "USE_DOG_STATSD_MOGRIFIERS",
        ]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
        {
            return;
        }
        let outputs = |args: &[&str]| {
            let mut all = vec!["ratelimit"];
            all.extend_from_slice(args);
            Settings::load_from(all).map(|(s, w)| (s.stats.outputs().unwrap(), w))
        };
        let (default, warnings) = outputs(&[]).unwrap();
        assert!(default.statsd && !default.log, "{default:?}");
        assert!(
            warnings[0].starts_with("USE_STATSD is true by default"),
            "{warnings:?}"
        );
        let (off, warnings) = outputs(&["--use-statsd", "false"]).unwrap();
        assert!(off.log && !off.statsd && warnings.is_empty(), "{off:?}");
        let (prometheus, _) = outputs(&["--use-prometheus", "true"]).unwrap();
        assert!(prometheus.prometheus && !prometheus.statsd && !prometheus.log);
        let (both, _) = outputs(&["--use-prometheus", "true", "--use-statsd", "true"]).unwrap();
        assert!(both.prometheus && both.statsd);
        let (dog, _) = outputs(&["--use-dog-statsd", "true"]).unwrap();
        assert!(dog.dog_statsd && !dog.statsd);
        let clash = outputs(&["--use-dog-statsd", "true", "--use-statsd", "true"]).unwrap_err();
        assert!(
            clash.to_string().contains("USE_STATSD and USE_DOG_STATSD"),
            "{clash}"
        );
        let (disabled, _) =
            outputs(&["--disable-stats", "true", "--use-prometheus", "true"]).unwrap();
        assert!(!disabled.prometheus && !disabled.statsd && !disabled.log);
        let mogrifier = outputs(&[
            "--use-dog-statsd",
            "true",
            "--use-dog-statsd-mogrifiers",
            "NOPE",
        ])
        .unwrap_err();
        assert!(
            mogrifier
                .to_string()
                .contains("DOG_STATSD_MOGRIFIER_NOPE_PATTERN"),
            "{mogrifier}"
        );
        let bad_address = outputs(&["--prometheus-addr", "9090"]).unwrap_err();
        assert!(
            bad_address.to_string().contains("PROMETHEUS_ADDR"),
            "{bad_address}"
        );
    }

    #[test]
    fn an_idle_connection_count_for_memcached_is_warned_of_as_unused() {
        if std::env::var_os("MEMCACHE_MAX_IDLE_CONNS").is_some() {
            return;
        }
        let warnings = |args: &[&str]| {
            let mut all = vec!["ratelimit", "--use-statsd", "false"];
            all.extend_from_slice(args);
            Settings::load_from(all).unwrap().1
        };
        let memcache = [
            "--backend-type",
            "memcache",
            "--memcache-host-port",
            "m:11211",
        ];
        assert!(warnings(&memcache).is_empty());
        let set = warnings(&[&memcache[..], &["--memcache-max-idle-conns", "8"]].concat());
        assert_eq!(set.len(), 1, "{set:?}");
        assert!(set[0].starts_with("MEMCACHE_MAX_IDLE_CONNS has no effect"));
        assert!(warnings(&["--memcache-max-idle-conns", "8"]).is_empty());
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
