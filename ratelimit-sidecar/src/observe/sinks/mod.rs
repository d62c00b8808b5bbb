//! Where statistics go. Every output reads the registry's [`Snapshot`] off the request
//! path: push outputs (statsd, DogStatsD, the log) on a thread of their own every
//! STATS_FLUSH_INTERVAL, Prometheus when scraped. A new output is one module here.

pub mod mogrifier;
pub mod prometheus;
pub mod statsd;

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use ratelimit_core::stats::{Deltas, Snapshot, StatsRegistry, Value};

use ratelimit_service_kit::prometheus::mapper::Mapper;

use self::statsd::{Format, Protocol, Statsd};
use crate::settings::{Outputs, StatsSettings};

/// An output that receives every flush.
pub trait Push: Send {
    /// Sends what `snapshot` says; never fails the caller (an output reports its own
    /// trouble).
    fn flush(&mut self, snapshot: &Snapshot);
}

/// The push outputs the settings ask for.
pub fn push_outputs(settings: &StatsSettings, outputs: Outputs) -> Vec<Box<dyn Push>> {
    let address = format!("{}:{}", settings.statsd_host, settings.statsd_port);
    let tags: Vec<(String, String)> = settings
        .extra_tags
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut out: Vec<Box<dyn Push>> = Vec::new();
    if outputs.statsd {
        let protocol = match settings.statsd_protocol.as_str() {
            "udp" => Protocol::Udp,
            _ => Protocol::Tcp,
        };
        tracing::info!(%address, protocol = %settings.statsd_protocol, interval = ?settings.stats_flush_interval, "statistics go to statsd");
        out.push(Box::new(Statsd::new(
            Format::Plain,
            protocol,
            address.clone(),
            tags.clone(),
        )));
    }
    if outputs.dog_statsd {
        tracing::info!(%address, mogrifiers = settings.mogrifiers.len(), "statistics go to DogStatsD");
        out.push(Box::new(Statsd::new(
            Format::Dog(settings.mogrifiers.clone()),
            Protocol::Udp,
            address,
            tags,
        )));
    }
    if outputs.log {
        tracing::info!(
            "no statistics sink is set (USE_STATSD=false): statistics are logged at debug level"
        );
        out.push(Box::new(Log::default()));
    }
    out
}

/// The Prometheus mapping the settings ask for: the file's, or the default.
pub fn prometheus_mapper(settings: &StatsSettings) -> Result<Mapper, String> {
    if settings.prometheus_mapper_yaml.is_empty() {
        return Ok(Mapper::default_mapping(
            settings.prometheus_response_time_as_milliseconds,
        ));
    }
    let path = &settings.prometheus_mapper_yaml;
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("PROMETHEUS_MAPPER_YAML {path}: {e}"))?;
    Mapper::parse(&text).map_err(|e| format!("PROMETHEUS_MAPPER_YAML {path}: {e}"))
}

/// The thread that flushes the push outputs; [`Flusher::stop`] flushes once more.
#[derive(Debug)]
pub struct Flusher {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Flusher {
    /// Starts flushing `outputs` every `interval`; `None` when there are none.
    pub fn start(
        stats: Arc<StatsRegistry>,
        mut outputs: Vec<Box<dyn Push>>,
        interval: Duration,
    ) -> Option<Flusher> {
        if outputs.is_empty() {
            return None;
        }
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("stats-flush".into())
            .spawn(move || {
                loop {
                    let last = !matches!(
                        stopped.recv_timeout(interval),
                        Err(RecvTimeoutError::Timeout)
                    );
                    let snapshot = stats.snapshot();
                    outputs
                        .iter_mut()
                        .for_each(|output| output.flush(&snapshot));
                    if last {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Flusher { stop, thread })
    }

    /// Flushes what was counted since the last flush, and stops.
    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// Statistics as debug-level log lines, as envoyproxy/ratelimit logs them when no sink
/// is set.
#[derive(Debug, Default)]
struct Log {
    deltas: Deltas,
}

impl Push for Log {
    fn flush(&mut self, snapshot: &Snapshot) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        for sample in &snapshot.samples {
            match &sample.value {
                Value::Counter(value) => {
                    let delta = self.deltas.counter(&sample.name, *value);
                    if delta > 0 {
                        tracing::debug!(name = %sample.name, r#type = "counter", value = delta, "flushing counter");
                    }
                }
                Value::Gauge(value) => {
                    tracing::debug!(name = %sample.name, r#type = "gauge", value, "flushing gauge");
                }
                Value::Timer(reading) => {
                    let interval = self.deltas.timer(&sample.name, reading);
                    if interval.count > 0 {
                        tracing::debug!(name = %sample.name, r#type = "timer", count = interval.count, total_us = interval.sum_us, "flushing timer");
                    }
                }
            }
        }
    }
}
