//! Rules written in Rust: a typed builder for the YAML schema.
//!
//! A [`Domain`] is turned into the same document a YAML file parses to and validated by
//! the same passes, so rules built in code give the same [`Config`] and the same errors
//! (file, path, message, and the line and column of the node in [`Domain::to_yaml`]'s
//! text) as the YAML that [`Domain::to_yaml`] writes. [`Config::to_yaml_files`] writes
//! any configuration back out, for the sidecar or the proxy-wasm filter to load.

use yaml_serde::{Mapping, Value};

use super::decode::{self, Decoded};
use super::{Algorithm, Config, ConfigError, DescriptorRule, DomainConfig, Limit, Metadata};
use crate::rules::unit::Unit;

/// The rules of one domain, built in code: `domain:` and its `descriptors:`.
///
/// ```
/// use ratelimit_core::config::{Domain, RateLimit, Rule};
/// use ratelimit_core::Unit;
///
/// let config = Domain::new("api")
///     .rule(Rule::key("api_key").limit(RateLimit::per(Unit::Minute, 100).token_bucket().burst(20)))
///     .rule(Rule::key("path").value("/admin/*").limit(RateLimit::per(Unit::Second, 5)))
///     .build()?;
/// assert_eq!(config.domains()[0].descriptors.len(), 2);
/// # Ok::<(), ratelimit_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    name: String,
    source: Option<String>,
    rules: Vec<Rule>,
}

/// One entry of a `descriptors` list: a key, an optional value, its limits and the rules
/// for the next entry. Without a limit and without children it whitelists the descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    rate_limits: Vec<RateLimit>,
    flags: [(&'static str, bool); 5],
    metadata: Option<Metadata>,
    descriptors: Vec<Rule>,
}

/// A `rate_limit` block (or an entry of `rate_limits`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimit {
    unit: Option<Unit>,
    requests_per_unit: u32,
    unlimited: bool,
    unit_multiplier: Option<u32>,
    algorithm: Option<&'static str>,
    burst: Option<u32>,
    name: Option<String>,
    replaces: Vec<String>,
}

impl Domain {
    /// A domain named `name`, with no rules yet.
    pub fn new(name: impl Into<String>) -> Domain {
        Domain {
            name: name.into(),
            source: None,
            rules: Vec::new(),
        }
    }

    /// Adds a top-level rule, after those already added.
    pub fn rule(mut self, rule: Rule) -> Domain {
        self.rules.push(rule);
        self
    }

    /// Names the rules in errors, as a file name does: `<domain>.yaml` unless set, the
    /// name [`Config::to_yaml_files`] gives the domain's file.
    pub fn source(mut self, name: impl Into<String>) -> Domain {
        self.source = Some(name.into());
        self
    }

    /// The name errors give as the file.
    pub fn source_name(&self) -> String {
        self.source
            .clone()
            .unwrap_or_else(|| format!("{}.yaml", self.name))
    }

    /// The YAML file these rules are: loading it gives what [`Domain::build`] gives.
    pub fn to_yaml(&self) -> String {
        yaml_serde::to_string(&self.document()).expect("rules are plain YAML values")
    }

    /// Validates the rules as the YAML loader validates a file: the first error.
    pub fn build(&self) -> Result<Config, ConfigError> {
        Config::from_domains(std::slice::from_ref(self), false)
    }

    /// [`Domain::build`], reporting every error found, as [`Config::check_files`] does.
    pub fn check(&self) -> Result<Config, Vec<ConfigError>> {
        Config::check_domains(std::slice::from_ref(self), false)
    }

    fn decode(&self) -> Decoded {
        let source = self.source_name();
        decode::decode_document(&source, &self.document(), Default::default())
            .map_err(|errors| decode::locate_errors(&self.to_yaml(), errors))
    }

    fn document(&self) -> Value {
        let mut map = Mapping::new();
        map.insert("domain".into(), self.name.as_str().into());
        if !self.rules.is_empty() {
            map.insert("descriptors".into(), list(&self.rules, Rule::to_value));
        }
        Value::Mapping(map)
    }
}

impl Rule {
    /// A rule for descriptor entries with key `key` (any value, each counted on its own,
    /// until [`Rule::value`]).
    pub fn key(key: impl Into<String>) -> Rule {
        Rule {
            key: key.into(),
            value: None,
            rate_limit: None,
            rate_limits: Vec::new(),
            flags: [
                ("shadow_mode", false),
                ("quota_mode", false),
                ("detailed_metric", false),
                ("value_to_metric", false),
                ("share_threshold", false),
            ],
            metadata: None,
            descriptors: Vec::new(),
        }
    }

    /// Matches only this value; `*` in it matches any run of characters.
    pub fn value(mut self, value: impl Into<String>) -> Rule {
        self.value = Some(value.into());
        self
    }

    /// `rate_limit:`, the rule's one limit.
    pub fn limit(mut self, limit: RateLimit) -> Rule {
        self.rate_limit = Some(limit);
        self
    }

    /// `rate_limits:`, limits that all apply, added after those already listed.
    pub fn limits(mut self, limits: impl IntoIterator<Item = RateLimit>) -> Rule {
        self.rate_limits.extend(limits);
        self
    }

    /// `shadow_mode: true`: over-limit answers are reported but answered `OK`.
    pub fn shadow_mode(self) -> Rule {
        self.flag(0)
    }

    /// `quota_mode: true` (see [`crate::Settings::quota_mode`]).
    pub fn quota_mode(self) -> Rule {
        self.flag(1)
    }

    /// `detailed_metric: true`: statistics per runtime value of every entry.
    pub fn detailed_metric(self) -> Rule {
        self.flag(2)
    }

    /// `value_to_metric: true`: statistics include this entry's runtime value.
    pub fn value_to_metric(self) -> Rule {
        self.flag(3)
    }

    /// `share_threshold: true`: every value the wildcard matches shares one counter.
    pub fn share_threshold(self) -> Rule {
        self.flag(4)
    }

    /// `metadata:`, returned with the rule's statuses.
    pub fn metadata(mut self, metadata: Metadata) -> Rule {
        self.metadata = Some(metadata);
        self
    }

    /// A rule for the next entry of the descriptor, after those already added.
    pub fn child(mut self, rule: Rule) -> Rule {
        self.descriptors.push(rule);
        self
    }

    fn flag(mut self, which: usize) -> Rule {
        self.flags[which].1 = true;
        self
    }

    fn to_value(&self) -> Value {
        let mut map = Mapping::new();
        map.insert("key".into(), self.key.as_str().into());
        if let Some(value) = &self.value {
            map.insert("value".into(), value.as_str().into());
        }
        if let Some(limit) = &self.rate_limit {
            map.insert("rate_limit".into(), limit.to_value());
        }
        if !self.rate_limits.is_empty() {
            map.insert(
                "rate_limits".into(),
                list(&self.rate_limits, RateLimit::to_value),
            );
        }
        for (name, set) in self.flags {
            if set {
                map.insert(name.into(), true.into());
            }
        }
        if let Some(metadata) = &self.metadata {
            map.insert("metadata".into(), metadata_value(metadata));
        }
        if !self.descriptors.is_empty() {
            map.insert(
                "descriptors".into(),
                list(&self.descriptors, Rule::to_value),
            );
        }
        Value::Mapping(map)
    }
}

impl RateLimit {
    /// `requests_per_unit` hits per `unit`, counted in fixed windows until told otherwise.
    pub fn per(unit: Unit, requests_per_unit: u32) -> RateLimit {
        RateLimit {
            unit: Some(unit),
            requests_per_unit,
            unlimited: false,
            unit_multiplier: None,
            algorithm: None,
            burst: None,
            name: None,
            replaces: Vec::new(),
        }
    }

    /// `unlimited: true`: never counted, always `OK`.
    pub fn unlimited() -> RateLimit {
        RateLimit {
            unit: None,
            unlimited: true,
            ..RateLimit::per(Unit::Second, 0)
        }
    }

    /// `unit_multiplier`: windows of `multiplier` units (at least 1).
    pub fn unit_multiplier(mut self, multiplier: u32) -> RateLimit {
        self.unit_multiplier = Some(multiplier);
        self
    }

    /// `algorithm:`; a token bucket's burst is written as `burst`.
    pub fn algorithm(mut self, algorithm: Algorithm) -> RateLimit {
        self.algorithm = Some(algorithm.as_str());
        if let Algorithm::TokenBucket { burst } = algorithm {
            self.burst = Some(burst);
        }
        self
    }

    /// `algorithm: sliding_window`.
    pub fn sliding_window(self) -> RateLimit {
        self.algorithm(Algorithm::SlidingWindow)
    }

    /// `algorithm: token_bucket`, holding `requests_per_unit` tokens unless
    /// [`RateLimit::burst`] says otherwise.
    pub fn token_bucket(mut self) -> RateLimit {
        self.algorithm = Some(Algorithm::TokenBucket { burst: 0 }.as_str());
        self
    }

    /// `algorithm: concurrency`: at most `requests_per_unit` requests in flight, each
    /// place lapsing one window (the lease) after it was taken unless given back sooner.
    /// The rule's own entry takes no value: the request's value there names its lease.
    pub fn concurrency(self) -> RateLimit {
        self.algorithm(Algorithm::Concurrency)
    }

    /// `burst`: the tokens a token bucket holds when full (only for a token bucket).
    pub fn burst(mut self, burst: u32) -> RateLimit {
        self.burst = Some(burst);
        self
    }

    /// `name`: reported in statuses, and what another limit's `replaces` names.
    pub fn name(mut self, name: impl Into<String>) -> RateLimit {
        self.name = Some(name.into());
        self
    }

    /// `replaces: [{name}]`: this limit replaces the one named `name` when both match a
    /// request.
    pub fn replaces(mut self, name: impl Into<String>) -> RateLimit {
        self.replaces.push(name.into());
        self
    }

    fn to_value(&self) -> Value {
        let mut map = Mapping::new();
        if let Some(unit) = self.unit {
            let unit = unit.as_upper_str().to_ascii_lowercase();
            map.insert("unit".into(), unit.into());
            map.insert("requests_per_unit".into(), self.requests_per_unit.into());
        }
        if self.unlimited {
            map.insert("unlimited".into(), true.into());
        }
        if let Some(multiplier) = self.unit_multiplier {
            map.insert("unit_multiplier".into(), multiplier.into());
        }
        if let Some(algorithm) = self.algorithm {
            map.insert("algorithm".into(), algorithm.into());
        }
        if let Some(burst) = self.burst {
            map.insert("burst".into(), burst.into());
        }
        if let Some(name) = &self.name {
            map.insert("name".into(), name.as_str().into());
        }
        if !self.replaces.is_empty() {
            let names = self.replaces.iter().map(|name| {
                let mut entry = Mapping::new();
                entry.insert("name".into(), name.as_str().into());
                Value::Mapping(entry)
            });
            map.insert("replaces".into(), Value::Sequence(names.collect()));
        }
        Value::Mapping(map)
    }
}

impl Config {
    /// Validates domains built in code, as [`Config::from_files`] validates files (each
    /// domain named by [`Domain::source_name`]): the first error.
    pub fn from_domains(domains: &[Domain], merge_domains: bool) -> Result<Config, ConfigError> {
        Config::check_domains(domains, merge_domains).map_err(|errors| {
            errors
                .into_iter()
                .next()
                .expect("a failed check has an error")
        })
    }

    /// [`Config::from_domains`], reporting every error found, as [`Config::check_files`].
    pub fn check_domains(
        domains: &[Domain],
        merge_domains: bool,
    ) -> Result<Config, Vec<ConfigError>> {
        let decoded = domains
            .iter()
            .map(|domain| (domain.source_name(), domain.decode()));
        Config::assemble(decoded, merge_domains)
    }

    /// One YAML file per domain, `(<domain>.yaml, text)`: loading them with
    /// [`Config::from_files`] gives these rules back.
    pub fn to_yaml_files(&self) -> Vec<(String, String)> {
        self.domains()
            .iter()
            .map(|domain| (format!("{}.yaml", domain.domain), domain.to_yaml()))
            .collect()
    }
}

impl DomainConfig {
    /// These rules as a builder, to change or to write out.
    pub fn to_rules(&self) -> Domain {
        self.descriptors
            .iter()
            .map(Rule::from)
            .fold(Domain::new(&self.domain), Domain::rule)
    }

    /// These rules as a YAML file.
    pub fn to_yaml(&self) -> String {
        self.to_rules().to_yaml()
    }
}

impl From<&DescriptorRule> for Rule {
    fn from(rule: &DescriptorRule) -> Rule {
        let mut built = Rule::key(&rule.key);
        built.value.clone_from(&rule.value);
        built.rate_limit = rule.rate_limit.as_ref().map(limit_of);
        built.rate_limits = rule.rate_limits.iter().map(limit_of).collect();
        let flags = [
            rule.shadow_mode,
            rule.quota_mode,
            rule.detailed_metric,
            rule.value_to_metric,
            rule.share_threshold,
        ];
        for (flag, set) in built.flags.iter_mut().zip(flags) {
            flag.1 = set;
        }
        built.metadata.clone_from(&rule.metadata);
        built.descriptors = rule.descriptors.iter().map(Rule::from).collect();
        built
    }
}

fn limit_of(rule: &super::RateLimitRule) -> RateLimit {
    let mut limit = match rule.limit {
        Limit::Unlimited => RateLimit::unlimited(),
        Limit::Counted {
            window,
            requests_per_unit,
            algorithm,
        } => {
            let limit = RateLimit::per(window.unit(), requests_per_unit);
            let limit = match window.multiplier() {
                1 => limit,
                n => limit.unit_multiplier(n),
            };
            match algorithm {
                Algorithm::FixedWindow => limit,
                other => limit.algorithm(other),
            }
        }
    };
    limit.name.clone_from(&rule.name);
    limit.replaces.clone_from(&rule.replaces);
    limit
}

fn list<T>(items: &[T], to_value: impl Fn(&T) -> Value) -> Value {
    Value::Sequence(items.iter().map(to_value).collect())
}

fn metadata_value(metadata: &Metadata) -> Value {
    match metadata {
        Metadata::Null => Value::Null,
        Metadata::Bool(b) => Value::Bool(*b),
        Metadata::Number(n) => Value::Number((*n).into()),
        Metadata::String(s) => Value::String(s.clone()),
        Metadata::List(items) => list(items, metadata_value),
        Metadata::Map(map) => Value::Mapping(
            map.iter()
                .map(|(key, value)| (Value::String(key.clone()), metadata_value(value)))
                .collect(),
        ),
    }
}
