//! Where statistics go: statsd, DogStatsD, Prometheus, or the log.

use std::time::Duration;

use clap::{ArgAction, Args};

use crate::observe::sinks::mogrifier::Mogrifier;
use ratelimit_service_kit::values::{StringMap, go_bool, go_duration, go_map};

/// Statistics outputs (envoyproxy/ratelimit's variables).
#[derive(Clone, Debug, Args)]
pub struct StatsSettings {
    /// Push statistics to statsd (off by itself when USE_DOG_STATSD or USE_PROMETHEUS is
    /// set and this is not).
    #[arg(long, env, default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub use_statsd: bool,
    /// statsd (and DogStatsD) host.
    #[arg(long, env, default_value = "localhost")]
    pub statsd_host: String,
    /// statsd (and DogStatsD) port.
    #[arg(long, env, default_value_t = 8125)]
    pub statsd_port: u16,
    /// statsd protocol: tcp (envoyproxy/ratelimit's) or udp. DogStatsD is always udp.
    #[arg(long, env, default_value = "tcp", value_parser = ["tcp", "udp"])]
    pub statsd_protocol: String,
    /// Push tagged statistics to DogStatsD over UDP.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub use_dog_statsd: bool,
    /// Mogrifier names, comma-separated; each reads DOG_STATSD_MOGRIFIER_<NAME>_PATTERN,
    /// _NAME and _TAGS.
    #[arg(long, env, default_value = "")]
    pub use_dog_statsd_mogrifiers: String,
    /// Serve Prometheus metrics on PROMETHEUS_ADDR + PROMETHEUS_PATH.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub use_prometheus: bool,
    /// Prometheus listen address, `host:port` (`:9090` is every interface).
    #[arg(long, env, default_value = ":9090", value_parser = listen_address)]
    pub prometheus_addr: ListenAddress,
    /// Prometheus path.
    #[arg(long, env, default_value = "/metrics")]
    pub prometheus_path: String,
    /// A statsd_exporter mapping file replacing the default mapping.
    #[arg(long, env, default_value = "")]
    pub prometheus_mapper_yaml: String,
    /// Export response times in milliseconds instead of seconds (default mapping only).
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub prometheus_response_time_as_milliseconds: bool,
    /// Tags on every statistic, `k1:v1,k2:v2`.
    #[arg(long, env, default_value = "", value_parser = go_map)]
    pub extra_tags: StringMap,
    /// How often statsd, DogStatsD and the log receive statistics.
    #[arg(long, env, default_value = "10s", value_parser = go_duration)]
    pub stats_flush_interval: Duration,
    /// Send statistics nowhere (the debug /stats page still shows them).
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub disable_stats: bool,
    /// The mogrifiers USE_DOG_STATSD_MOGRIFIERS names, read at load.
    #[arg(skip)]
    pub mogrifiers: Vec<Mogrifier>,
    /// Whether USE_STATSD was set rather than left at its default.
    #[arg(skip)]
    pub use_statsd_explicit: bool,
}

/// Which outputs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outputs {
    /// Plain statsd.
    pub statsd: bool,
    /// DogStatsD.
    pub dog_statsd: bool,
    /// The Prometheus endpoint.
    pub prometheus: bool,
    /// Debug-level log lines, when nothing else receives statistics.
    pub log: bool,
}

impl StatsSettings {
    /// Resolves the outputs. `USE_STATSD` is true by default, so it yields to another
    /// sink chosen explicitly; statsd and DogStatsD both set explicitly is refused (they
    /// would share STATSD_HOST:STATSD_PORT).
    pub fn outputs(&self) -> Result<Outputs, String> {
        if self.disable_stats {
            return Ok(Outputs {
                statsd: false,
                dog_statsd: false,
                prometheus: false,
                log: false,
            });
        }
        let other = self.use_dog_statsd || self.use_prometheus;
        let statsd = self.use_statsd && (self.use_statsd_explicit || !other);
        if statsd && self.use_dog_statsd {
            return Err("USE_STATSD and USE_DOG_STATSD are both true: they push to the same STATSD_HOST:STATSD_PORT; set one of them".into());
        }
        Ok(Outputs {
            statsd,
            dog_statsd: self.use_dog_statsd,
            prometheus: self.use_prometheus,
            log: !statsd && !other,
        })
    }

    /// Reads the mogrifiers that USE_DOG_STATSD_MOGRIFIERS names from `env`.
    pub fn load_mogrifiers(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<(), String> {
        self.mogrifiers = self
            .use_dog_statsd_mogrifiers
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(|name| Mogrifier::from_env(name, &env))
            .collect::<Result<_, _>>()?;
        if !self.mogrifiers.is_empty() && !self.use_dog_statsd {
            return Err(
                "USE_DOG_STATSD_MOGRIFIERS is set but USE_DOG_STATSD is not: mogrifiers only rename DogStatsD statistics".into(),
            );
        }
        Ok(())
    }
}

/// A `host:port` to listen on; an empty host is every interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenAddress {
    /// The host.
    pub host: String,
    /// The port.
    pub port: u16,
}

fn listen_address(value: &str) -> Result<ListenAddress, String> {
    let bad = || format!("expected host:port or :port; got '{value}'");
    let (host, port) = value.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(ListenAddress {
        host: if host.is_empty() { "0.0.0.0" } else { host }.to_owned(),
        port: port.parse().map_err(|_| bad())?,
    })
}
