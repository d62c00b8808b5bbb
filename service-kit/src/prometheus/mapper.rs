//! statsd_exporter's mapping format, read from YAML: which statistic becomes which
//! Prometheus metric, with which labels. The default mapping gives the rate-limit
//! statistics the names and labels envoyproxy/ratelimit exports
//! ([`ratelimit_core::stats::PROMETHEUS_MAPPING`]).

use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// A parsed mapping file.
#[derive(Debug)]
pub struct Mapper {
    rules: Vec<Rule>,
}

#[derive(Debug)]
struct Rule {
    pattern: Regex,
    name: String,
    labels: Vec<(String, String)>,
    kind: Option<Kind>,
    scale: f64,
    drop: bool,
}

/// The kind of statistic a rule applies to (`match_metric_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Counters.
    Counter,
    /// Gauges.
    Gauge,
    /// Timers (statsd_exporter also calls them observers).
    #[serde(alias = "observer")]
    Timer,
}

/// What a statistic maps to.
#[derive(Debug, PartialEq)]
pub struct Mapped {
    /// The metric name.
    pub name: String,
    /// Its labels, in the file's order.
    pub labels: Vec<(String, String)>,
    /// Factor applied to timer values (in milliseconds).
    pub scale: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    mappings: Vec<RuleFile>,
    #[serde(default, rename = "defaults")]
    _defaults: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    match_metric_type: Option<Kind>,
    // Timers are always histograms here.
    #[serde(default, rename = "timer_type")]
    _timer_type: Option<IgnoredAny>,
    #[serde(default, rename = "observer_type")]
    _observer_type: Option<IgnoredAny>,
    #[serde(default)]
    scale: Option<f64>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default, rename = "help")]
    _help: Option<IgnoredAny>,
}

impl Mapper {
    /// Parses a mapping file; `response_time_in_ms` drops the `scale` of the default
    /// mapping's response-time rule (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS).
    pub fn parse(text: &str) -> Result<Mapper, String> {
        let file: File = yaml_serde::from_str(text).map_err(|error| error.to_string())?;
        let rules = file
            .mappings
            .into_iter()
            .map(|rule| {
                let regex = match rule.match_type.as_deref() {
                    None | Some("glob") => glob(&rule.pattern),
                    Some("regex") => rule.pattern.clone(),
                    Some(other) => {
                        return Err(format!("match_type {other}: expected glob or regex"));
                    }
                };
                let pattern =
                    Regex::new(&regex).map_err(|e| format!("match {}: {e}", rule.pattern))?;
                let drop = match rule.action.as_deref() {
                    None | Some("map") => false,
                    Some("drop") => true,
                    Some(other) => return Err(format!("action {other}: expected map or drop")),
                };
                if !drop && rule.name.is_empty() {
                    return Err(format!("match {}: a mapping needs a name", rule.pattern));
                }
                Ok(Rule {
                    pattern,
                    name: rule.name,
                    labels: rule.labels.into_iter().collect(),
                    kind: rule.match_metric_type,
                    scale: rule.scale.unwrap_or(1.0),
                    drop,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Mapper { rules })
    }

    /// The default mapping, with response times in seconds or, if asked, milliseconds.
    pub fn default_mapping(response_time_in_ms: bool) -> Mapper {
        let mut mapper = Mapper::parse(ratelimit_core::stats::PROMETHEUS_MAPPING)
            .expect("the default mapping parses");
        if response_time_in_ms {
            mapper.rules.iter_mut().for_each(|rule| rule.scale = 1.0);
        }
        mapper
    }

    /// What `statistic` (of `kind`) maps to: `None` when a rule drops it; an escaped copy
    /// of the name with no labels when no rule matches (as statsd_exporter does).
    pub fn map(&self, statistic: &str, kind: Kind) -> Option<Mapped> {
        for rule in &self.rules {
            if rule.kind.is_some_and(|k| k != kind) {
                continue;
            }
            let Some(captures) = rule.pattern.captures(statistic) else {
                continue;
            };
            if rule.drop {
                return None;
            }
            let expand = |template: &str| {
                let mut out = String::new();
                captures.expand(template, &mut out);
                out
            };
            return Some(Mapped {
                name: escape_name(&expand(&rule.name)),
                labels: rule
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .collect(),
                scale: rule.scale,
            });
        }
        Some(Mapped {
            name: escape_name(statistic),
            labels: Vec::new(),
            scale: 1.0,
        })
    }
}

/// A statsd_exporter glob as an anchored regular expression: `*` is one dot-separated
/// segment, captured.
fn glob(pattern: &str) -> String {
    let parts: Vec<String> = pattern.split('*').map(regex::escape).collect();
    format!("^{}$", parts.join("([^.]*)"))
}

/// A valid Prometheus metric name: other characters become `_`.
pub fn escape_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(name: &str, labels: &[(&str, &str)], scale: f64) -> Option<Mapped> {
        Some(Mapped {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            scale,
        })
    }

    #[test]
    fn the_default_mapping_gives_envoy_ratelimits_names_and_labels() {
        let m = Mapper::default_mapping(false);
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.user.over_limit",
                Kind::Counter
            ),
            mapped(
                "ratelimit_service_rate_limit_over_limit",
                &[("domain", "edge"), ("key1", "user")],
                1.0
            )
        );
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.user_alice.method_GET.x.total_hits",
                Kind::Counter
            ),
            mapped(
                "ratelimit_service_rate_limit_total_hits",
                &[
                    ("domain", "edge"),
                    ("key1", "user_alice"),
                    ("key2", "method_GET")
                ],
                1.0
            )
        );
        assert_eq!(
            m.map(
                "ratelimit.service.call.should_rate_limit.redis_error",
                Kind::Counter
            ),
            mapped(
                "ratelimit_service_should_rate_limit_error",
                &[("err_type", "redis_error")],
                1.0
            )
        );
        assert_eq!(
            m.map(
                "ratelimit_server.ShouldRateLimit.response_time",
                Kind::Timer
            ),
            mapped(
                "ratelimit_service_response_time_seconds",
                &[("grpc_method", "ShouldRateLimit")],
                0.001
            )
        );
        assert_eq!(
            Mapper::default_mapping(true)
                .map(
                    "ratelimit_server.ShouldRateLimit.response_time",
                    Kind::Timer
                )
                .unwrap()
                .scale,
            1.0
        );
        assert_eq!(
            m.map("ratelimit.localcache.hitCount", Kind::Counter),
            mapped("ratelimit_localcache_hitCount", &[], 1.0),
            "unmapped names are escaped"
        );
    }

    #[test]
    fn custom_files_map_drop_and_fail_precisely() {
        let m = Mapper::parse(
            "mappings:\n- match: a.*.b\n  name: x_$1\n  labels: {k: \"$1\"}\n- match: 'c\\..*'\n  match_type: regex\n  action: drop\n",
        )
        .unwrap();
        assert_eq!(
            m.map("a.q.b", Kind::Counter),
            mapped("x_q", &[("k", "q")], 1.0)
        );
        assert_eq!(m.map("c.anything", Kind::Gauge), None);
        assert!(
            Mapper::parse("mappings:\n- match: a\n  nmae: x\n")
                .unwrap_err()
                .contains("nmae")
        );
        assert!(
            Mapper::parse("mappings:\n- match: a\n")
                .unwrap_err()
                .contains("needs a name")
        );
    }
}
