//! Rate-limit configuration: the YAML schema of envoyproxy/ratelimit, loaded and validated.

mod build;
mod decode;
mod error;
mod events;
mod limit_block;
mod nesting;
mod position;
mod yaml11;

use std::collections::BTreeMap;

pub use build::{Domain, RateLimit, Rule};
pub use error::{ConfigError, ConfigErrorKind};

use crate::rules::unit::Window;

/// A validated set of domains, ready to be compiled by [`crate::Limiter`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    domains: Vec<DomainConfig>,
    warnings: Vec<String>,
}

/// The rules of one domain.
#[derive(Clone, Debug, PartialEq)]
pub struct DomainConfig {
    /// The domain name requests refer to.
    pub domain: String,
    /// Top-level descriptor rules, in file order.
    pub descriptors: Vec<DescriptorRule>,
}

/// One entry of a `descriptors` list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DescriptorRule {
    /// The descriptor key this rule matches.
    pub key: String,
    /// The value it matches; `None` matches any value (each value counted on its own).
    /// May hold `*` wildcards.
    pub value: Option<String>,
    /// The limit; `None` with no children whitelists the descriptor.
    pub rate_limit: Option<RateLimitRule>,
    /// `rate_limits:`, several limits that all apply (never together with `rate_limit`).
    pub rate_limits: Vec<RateLimitRule>,
    /// Over-limit results of this rule are reported but answered `OK`.
    pub shadow_mode: bool,
    /// This rule takes part in quota mode (see [`crate::Settings::quota_mode`]).
    pub quota_mode: bool,
    /// Statistics are kept per runtime value of every entry.
    pub detailed_metric: bool,
    /// Statistics include the runtime value of this entry.
    pub value_to_metric: bool,
    /// All values matching the wildcard share one counter.
    pub share_threshold: bool,
    /// Free-form metadata attached to the rule.
    pub metadata: Option<Metadata>,
    /// Rules for the next entry of the descriptor.
    pub descriptors: Vec<DescriptorRule>,
}

/// A `rate_limit` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitRule {
    /// What the rule allows.
    pub limit: Limit,
    /// Name another rule can replace; also reported in `current_limit.name`.
    pub name: Option<String>,
    /// Names of the limits this rule replaces when both match one request.
    pub replaces: Vec<String>,
}

/// The allowance of a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `unlimited: true`: never counted, always `OK`.
    Unlimited,
    /// `requests_per_unit` hits per window, counted by `algorithm`; 0 blocks everything.
    Counted {
        /// The window the hits are counted in (`unit` times `unit_multiplier`).
        window: Window,
        /// Hits allowed per window (a token bucket's refill per window).
        requests_per_unit: u32,
        /// How hits are counted.
        algorithm: Algorithm,
    },
}

/// How a limit counts hits (`algorithm:`; `fixed_window` unless the rule says otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Algorithm {
    /// One counter per window, as envoyproxy/ratelimit counts.
    #[default]
    FixedWindow,
    /// The current window plus the previous one weighted by how much of it a window-long
    /// interval ending now still covers.
    SlidingWindow,
    /// A GCRA token bucket holding `burst` tokens, refilled at `requests_per_unit` per
    /// window.
    TokenBucket {
        /// Tokens when full (`burst`; `requests_per_unit` unless given).
        burst: u32,
    },
    /// At most `requests_per_unit` requests in flight at once: a place is taken when a
    /// request starts and given back by its refund at stream end (Envoy's
    /// `is_negative_hits`), or lapses `unit` × `unit_multiplier` (the lease) after it was
    /// taken. The rule's own entry has no value: the request's value there names it.
    Concurrency,
}

impl Algorithm {
    /// The name in the YAML (`sliding_window`).
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

/// Rule metadata, shaped like a protobuf `Struct` value.
#[derive(Clone, Debug, PartialEq)]
pub enum Metadata {
    /// `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// Any number (protobuf `Struct` numbers are doubles).
    Number(f64),
    /// A string.
    String(String),
    /// A list.
    List(Vec<Metadata>),
    /// A map with string keys.
    Map(BTreeMap<String, Metadata>),
}

impl Config {
    /// Loads YAML files given as `(name, text)` pairs, in the order given.
    ///
    /// With `merge_domains` false a domain may appear in one file only (envoyproxy/ratelimit's
    /// default); with it true, the descriptors of files sharing a domain are concatenated and
    /// must still be unique. The whole set is rejected on an error: the first one found
    /// (see [`Config::check_files`] for all of them).
    pub fn from_files<I, N, T>(files: I, merge_domains: bool) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (N, T)>,
        N: AsRef<str>,
        T: AsRef<str>,
    {
        Config::check_files(files, merge_domains).map_err(|errors| {
            errors
                .into_iter()
                .next()
                .expect("a failed check has an error")
        })
    }

    /// [`Config::from_files`], reporting every error found rather than the first: each
    /// file is read even when one before it failed, and within a file, see the order in
    /// which errors are found in `decode`.
    pub fn check_files<I, N, T>(files: I, merge_domains: bool) -> Result<Config, Vec<ConfigError>>
    where
        I: IntoIterator<Item = (N, T)>,
        N: AsRef<str>,
        T: AsRef<str>,
    {
        let decoded = files.into_iter().map(|(name, text)| {
            let name = name.as_ref();
            (name.to_owned(), decode::decode_file(name, text.as_ref()))
        });
        Config::assemble(decoded, merge_domains)
    }

    /// Joins decoded files (or domains built in code) into one configuration, with the
    /// checks across files: duplicate domains, or duplicate keys of merged ones.
    fn assemble(
        decoded: impl IntoIterator<Item = (String, decode::Decoded)>,
        merge_domains: bool,
    ) -> Result<Config, Vec<ConfigError>> {
        let mut config = Config::default();
        let mut errors = Vec::new();
        let mut top_keys: Vec<std::collections::HashSet<String>> = Vec::new();
        for (name, decoded) in decoded {
            let name = name.as_str();
            let file = match decoded {
                Ok((file, warnings)) => {
                    config.warnings.extend(warnings);
                    file
                }
                Err(found) => {
                    errors.extend(found);
                    continue;
                }
            };
            match config.domains.iter().position(|d| d.domain == file.domain) {
                Some(_) if !merge_domains => errors.push(ConfigError::new(
                    name,
                    "domain",
                    ConfigErrorKind::DuplicateDomain(file.domain),
                )),
                Some(i) => {
                    for (index, rule) in file.descriptors.into_iter().enumerate() {
                        let composite = decode::composite_key(&file.domain, "", &rule);
                        if top_keys[i].insert(composite.clone()) {
                            config.domains[i].descriptors.push(rule);
                        } else {
                            errors.push(ConfigError::new(
                                name,
                                &format!("descriptors[{index}]"),
                                ConfigErrorKind::DuplicateKey(composite),
                            ));
                        }
                    }
                }
                None => {
                    top_keys.push(
                        file.descriptors
                            .iter()
                            .map(|rule| decode::composite_key(&file.domain, "", rule))
                            .collect(),
                    );
                    config.domains.push(file);
                }
            }
        }
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(errors)
        }
    }

    /// Loads one YAML file.
    pub fn from_yaml(name: &str, text: &str) -> Result<Config, ConfigError> {
        Config::from_files([(name, text)], false)
    }

    /// The domains, in the order their first file was given.
    pub fn domains(&self) -> &[DomainConfig] {
        &self.domains
    }

    /// The first rule with a limit of `algorithm` (its statistics key, `domain.key_value`),
    /// for a host that cannot run that algorithm to refuse the rules by name.
    pub fn rule_using(&self, algorithm: &str) -> Option<String> {
        fn walk(rules: &[DescriptorRule], at: &str, algorithm: &str) -> Option<String> {
            rules.iter().find_map(|rule| {
                let mut here = format!("{at}.{}", rule.key);
                if let Some(value) = &rule.value {
                    here = format!("{here}_{value}");
                }
                let uses = |r: &RateLimitRule| match r.limit {
                    Limit::Counted { algorithm: a, .. } => a.as_str() == algorithm,
                    Limit::Unlimited => false,
                };
                match rule.rate_limit.iter().chain(&rule.rate_limits).any(uses) {
                    true => Some(here),
                    false => walk(&rule.descriptors, &here, algorithm),
                }
            })
        }
        let mut domains = self.domains.iter();
        domains.find_map(|d| walk(&d.descriptors, &d.domain, algorithm))
    }

    /// What is accepted, as envoyproxy/ratelimit accepts it, but is most likely a mistake
    /// (an empty `rate_limit:`, which makes a whitelist), each naming file and path.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}
