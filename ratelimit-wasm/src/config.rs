//! The plugin configuration (Envoy's `configuration` field, JSON).

use ratelimit_core::{Algorithm, Config, HeaderFormat, Limiter, Settings};
use serde::Deserialize;

use crate::actions::Action;

/// The configuration as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    domain: String,
    rules: String,
    #[serde(default)]
    descriptors: Vec<Vec<Action>>,
    #[serde(default)]
    response_headers: bool,
    #[serde(default = "default_headers_format")]
    response_headers_format: String,
    #[serde(default)]
    failure_mode_deny: bool,
    #[serde(default)]
    global: Option<Global>,
    #[serde(default = "default_shared_slots")]
    shared_slots: u64,
}

fn default_headers_format() -> String {
    "ratelimit".into()
}

fn default_shared_slots() -> u64 {
    16_384
}

/// The sidecar tier: descriptors that pass locally are then asked of a ratelimit sidecar.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Global {
    /// Envoy cluster of the ratelimit sidecar.
    pub cluster: String,
    /// Time allowed for its answer.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Domain asked at the sidecar.
    pub domain: String,
    /// Set: decide from the service's last reports and report each worker's hits every
    /// this many milliseconds, instead of a callout per request ([`crate::fleet`]).
    #[serde(default)]
    pub report_interval_ms: Option<u64>,
}

fn default_timeout_ms() -> u64 {
    100
}

/// A validated filter configuration.
#[derive(Debug)]
pub struct FilterConfig {
    /// The domain of the local rules.
    pub domain: String,
    /// The engine on the local rules.
    pub limiter: Limiter,
    /// One list of actions per descriptor.
    pub descriptors: Vec<Vec<Action>>,
    /// Add the rate-limit headers to responses.
    pub response_headers: bool,
    /// Which ones: `ratelimit` (`RateLimit-Limit/-Remaining/-Reset`) or
    /// `ietf-draft-11` (`RateLimit-Policy` and `RateLimit`).
    pub headers_format: HeaderFormat,
    /// Deny when the decision cannot be made.
    pub failure_mode_deny: bool,
    /// The sidecar tier, when configured.
    pub global: Option<Global>,
    /// Shared-data entries the counters may use (our extension; default 16 384).
    pub shared_slots: u64,
}

impl FilterConfig {
    /// Parses and validates the plugin configuration; the error is what an operator
    /// needs to fix it (the rules' errors are the sidecar's, with the YAML path).
    pub fn parse(json: &[u8]) -> Result<FilterConfig, String> {
        let raw: Raw =
            serde_json::from_slice(json).map_err(|e| format!("plugin configuration: {e}"))?;
        let config = Config::from_yaml("rules", &raw.rules).map_err(|e| e.to_string())?;
        if let Some(rule) = config.rule_using(Algorithm::Concurrency.as_str()) {
            return Err(format!(
                "rules: {rule} is a concurrency limit, which the filter cannot hold (its places are given back at stream end): use the rate limit service for it"
            ));
        }
        if !config.domains().iter().any(|d| d.domain == raw.domain) {
            return Err(format!(
                "plugin configuration: the rules define no domain '{}'",
                raw.domain
            ));
        }
        if raw.global.as_ref().and_then(|g| g.report_interval_ms) == Some(0) {
            return Err("plugin configuration: global.report_interval_ms must be above 0".into());
        }
        let headers_format = HeaderFormat::parse(&raw.response_headers_format).ok_or_else(|| {
            format!(
                "plugin configuration: response_headers_format '{}' is not ratelimit or ietf-draft-11",
                raw.response_headers_format
            )
        })?;
        let settings = Settings {
            report_policies: headers_format == HeaderFormat::IetfDraft11,
            ..Settings::default()
        };
        Ok(FilterConfig {
            limiter: Limiter::new(&config, settings),
            headers_format,
            domain: raw.domain,
            descriptors: raw.descriptors,
            response_headers: raw.response_headers,
            failure_mode_deny: raw.failure_mode_deny,
            global: raw.global,
            shared_slots: raw.shared_slots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
      "domain": "edge",
      "rules": "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
      "descriptors": [[{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}],
                      [{"generic_key": {"descriptor_value": "all"}}, {"remote_address": {}}]],
      "response_headers": true,
      "failure_mode_deny": false,
      "global": {"cluster": "ratelimit", "timeout_ms": 100, "domain": "edge"}
    }"#;

    #[test]
    fn the_documented_shape_parses() {
        let config = FilterConfig::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(config.domain, "edge");
        assert_eq!(config.descriptors.len(), 2);
        assert!(config.response_headers && !config.failure_mode_deny);
        assert_eq!(config.global.unwrap().cluster, "ratelimit");
    }

    #[test]
    fn bad_configurations_say_what_is_wrong() {
        let bad_rules = GOOD.replace("unit: minute", "unit: minutes");
        assert_eq!(
            FilterConfig::parse(bad_rules.as_bytes()).unwrap_err(),
            "rules: descriptors[0].rate_limit.unit: invalid rate limit unit 'minutes'"
        );
        let unknown = GOOD.replace("\"response_headers\"", "\"headers\"");
        assert!(
            FilterConfig::parse(unknown.as_bytes())
                .unwrap_err()
                .contains("unknown field `headers`")
        );
        let other_domain = GOOD.replace(
            "\"domain\": \"edge\",\n      \"rules\"",
            "\"domain\": \"api\",\n      \"rules\"",
        );
        assert!(
            FilterConfig::parse(other_domain.as_bytes())
                .unwrap_err()
                .contains("no domain 'api'")
        );
        assert!(FilterConfig::parse(b"not json").is_err());
        let concurrency = GOOD.replace(
            "{unit: minute, requests_per_unit: 3}",
            "{unit: minute, requests_per_unit: 3, algorithm: concurrency}",
        );
        assert_eq!(
            FilterConfig::parse(concurrency.as_bytes()).unwrap_err(),
            "rules: edge.user is a concurrency limit, which the filter cannot hold (its places are given back at stream end): use the rate limit service for it"
        );
    }
}
