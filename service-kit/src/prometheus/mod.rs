//! Prometheus's text exposition format: a statistics snapshot rendered through a
//! statsd_exporter mapping ([`mapper`]).

pub mod mapper;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ratelimit_core::stats::{BUCKET_BOUNDS_US, Snapshot, TimerReading, Value};

use self::mapper::{Kind, Mapper};

/// One metric family: its type and its series, by rendered label set.
#[derive(Default)]
struct Family {
    kind: Option<Kind>,
    series: BTreeMap<String, Series>,
}

enum Series {
    Number(u64),
    Histogram(TimerReading, f64),
}

/// The exposition text of `snapshot`. Statistics that map to the same series add up
/// (as statsd_exporter adds their events); one whose kind conflicts with its family's is
/// left out.
pub fn render(snapshot: &Snapshot, mapper: &Mapper, extra: &[(String, String)]) -> String {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for sample in &snapshot.samples {
        let kind = match sample.value {
            Value::Counter(_) => Kind::Counter,
            Value::Gauge(_) => Kind::Gauge,
            Value::Timer(_) => Kind::Timer,
        };
        let Some(mapped) = mapper.map(&sample.name.to_string(), kind) else {
            continue;
        };
        let family = families.entry(mapped.name).or_default();
        if *family.kind.get_or_insert(kind) != kind {
            continue;
        }
        let labels = label_set(mapped.labels.iter().chain(extra));
        match (&sample.value, family.series.get_mut(&labels)) {
            (Value::Counter(v), Some(Series::Number(total))) => *total += v,
            (Value::Gauge(v), Some(Series::Number(level))) => *level = *v,
            (Value::Timer(t), Some(Series::Histogram(sum, _))) => merge(sum, t),
            (Value::Counter(v) | Value::Gauge(v), None) => {
                family.series.insert(labels, Series::Number(*v));
            }
            (Value::Timer(t), None) => {
                family
                    .series
                    .insert(labels, Series::Histogram(t.clone(), mapped.scale));
            }
            _ => {}
        }
    }
    let mut out = String::new();
    for (name, family) in &families {
        let kind = match family.kind {
            Some(Kind::Counter) => "counter",
            Some(Kind::Gauge) => "gauge",
            Some(Kind::Timer) => "histogram",
            None => continue,
        };
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, series) in &family.series {
            match series {
                Series::Number(value) => {
                    let _ = writeln!(out, "{name}{} {value}", braces(labels));
                }
                Series::Histogram(reading, scale) => {
                    histogram(&mut out, name, labels, reading, *scale)
                }
            }
        }
    }
    out
}

fn merge(into: &mut TimerReading, more: &TimerReading) {
    into.count += more.count;
    into.sum_us += more.sum_us;
    into.max_us = into.max_us.max(more.max_us);
    for (a, b) in into.buckets.iter_mut().zip(&more.buckets) {
        *a += b;
    }
}

/// Timer values are milliseconds times the mapping's scale.
/// The bucket bounds statsd_exporter gives a histogram unless told otherwise
/// (Prometheus's default buckets, 5 ms to 10 s), in microseconds: each is one of the
/// timers' own bounds, so the counts are exact.
const EXPORTED_BOUNDS_US: [u64; 11] = [
    5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
    10_000_000,
];

fn histogram(out: &mut String, name: &str, labels: &str, reading: &TimerReading, scale: f64) {
    let value = |us: u64| us as f64 / 1000.0 * scale;
    let with_le = |le: &str| {
        let le = format!("le=\"{le}\"");
        braces(&if labels.is_empty() {
            le
        } else {
            format!("{labels},{le}")
        })
    };
    let mut cumulative = 0;
    for (bound, count) in BUCKET_BOUNDS_US.iter().zip(&reading.buckets) {
        cumulative += count;
        if !EXPORTED_BOUNDS_US.contains(bound) {
            continue;
        }
        let _ = writeln!(
            out,
            "{name}_bucket{} {cumulative}",
            with_le(&value(*bound).to_string())
        );
    }
    let _ = writeln!(out, "{name}_bucket{} {}", with_le("+Inf"), reading.count);
    let _ = writeln!(
        out,
        "{name}_sum{} {}",
        braces(labels),
        value(reading.sum_us)
    );
    let _ = writeln!(out, "{name}_count{} {}", braces(labels), reading.count);
}

fn label_set<'a>(labels: impl Iterator<Item = &'a (String, String)>) -> String {
    let mut out = String::new();
    for (key, value) in labels {
        if !out.is_empty() {
            out.push(',');
        }
        let value = value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(out, "{}=\"{value}\"", mapper::escape_name(key));
    }
    out
}

fn braces(labels: &str) -> String {
    if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratelimit_core::stats::{StatsRegistry, names};

    use super::*;

    #[test]
    fn series_add_up_and_timers_are_histograms_in_seconds() {
        let registry = StatsRegistry::default();
        registry.rule("edge.user.a.x").add_not_within(2);
        registry.rule("edge.user.a.y").add_not_within(3);
        registry.rule("edge.path_/x\"y").over_limit.add(1);
        registry
            .timer(&names::response_time("ShouldRateLimit"))
            .record(Duration::from_micros(700));
        let extra = [("env".to_owned(), "ci".to_owned())];
        let text = render(
            &registry.snapshot(),
            &Mapper::default_mapping(false),
            &extra,
        );
        for expected in [
            "# TYPE ratelimit_service_rate_limit_total_hits counter",
            "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"user\",key2=\"a\",env=\"ci\"} 5",
            "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"path_/x\\\"y\",env=\"ci\"} 1",
            "# TYPE ratelimit_service_response_time_seconds histogram",
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",env=\"ci\",le=\"0.005\"} 1",
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",env=\"ci\",le=\"5\"} 1",
            "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\",env=\"ci\"} 1",
            "ratelimit_service_response_time_seconds_sum{grpc_method=\"ShouldRateLimit\",env=\"ci\"} 0.0007",
        ] {
            assert!(
                text.lines().any(|line| line == expected),
                "{expected} not in\n{text}"
            );
        }
        // Prometheus's default buckets, as statsd_exporter exports them: no finer ones.
        let bounds = text.lines().filter(|l| l.contains("_bucket{")).count();
        assert_eq!(bounds, EXPORTED_BOUNDS_US.len() + 1, "{text}");
        assert!(!text.contains("le=\"0.001\""), "{text}");
    }

    #[test]
    fn every_exported_bound_is_a_timer_bound() {
        for bound in EXPORTED_BOUNDS_US {
            assert!(BUCKET_BOUNDS_US.contains(&bound), "{bound}");
        }
    }
}
