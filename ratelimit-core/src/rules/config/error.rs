//! Errors found while loading rate-limit YAML.

use std::fmt;

/// Why a configuration was rejected: the file, the YAML path inside it, the position when
/// the YAML parser knows it, and what is wrong.
///
/// `Display` gives one line an operator can act on, for example
/// `config/api.yaml: descriptors[1].rate_limit.unit: invalid rate limit unit 'minutes'`.
/// The message after the path is the text envoyproxy/ratelimit prints for the same
/// condition, so existing runbooks still match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name the caller passed with the text.
    pub file: String,
    /// Path of the offending node, such as `descriptors[0].descriptors[2].key`; empty for the
    /// whole document.
    pub path: String,
    /// 1-based line and column, when the YAML parser reported them (its message in
    /// [`ConfigErrorKind::Yaml`] names them too).
    pub location: Option<(usize, usize)>,
    /// What is wrong.
    pub kind: ConfigErrorKind,
}

/// The conditions under which a configuration is rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigErrorKind {
    /// The text is not valid YAML.
    #[error("error loading config file: {0}")]
    Yaml(String),
    /// Collections nested deeper than any rule file needs.
    #[error("error loading config file: collections are nested more than {0} levels deep")]
    TooDeep(usize),
    /// A value has the wrong type for its field (a list where a map belongs, `-1` as a count).
    #[error("error loading config file: cannot unmarshal {found} into {expected}")]
    WrongType {
        /// What the field takes.
        expected: &'static str,
        /// What the file has.
        found: String,
    },
    /// A map key is a number, list or other non-string.
    #[error("config error, key is not of type string: {0}")]
    NonStringKey(String),
    /// A field name that envoyproxy/ratelimit does not know (often a typo).
    #[error("config error, unknown key '{0}'")]
    UnknownKey(String),
    /// A list holds something other than maps.
    #[error("config error, yaml file contains list of type other than map: {0}")]
    ListOfNonMap(String),
    /// A value of a type the rules never take (a float, a tagged value).
    #[error("error checking config: {0} values are not allowed; quote it to make it a string")]
    UnsupportedValue(&'static str),
    /// `domain` is missing or empty (an empty file too).
    #[error("config file cannot have empty domain")]
    EmptyDomain,
    /// Two files define the same domain and merging is off.
    #[error("duplicate domain '{0}' in config file")]
    DuplicateDomain(String),
    /// A descriptor rule has no `key`.
    #[error("descriptor has empty key")]
    EmptyKey,
    /// The same `key` (and `value`) twice at one level.
    #[error("duplicate descriptor composite key '{0}'")]
    DuplicateKey(String),
    /// `unit` is missing or not one of second, minute, hour, day, week, month, year.
    #[error("invalid rate limit unit '{0}'")]
    InvalidUnit(String),
    /// `unlimited: true` together with a `unit`.
    #[error("should not specify rate limit unit when unlimited")]
    UnlimitedWithUnit,
    /// A `replaces` entry without a name.
    #[error("should not have an empty replaces entry")]
    EmptyReplaces,
    /// A rule whose `replaces` names its own `name`.
    #[error("replaces should not contain name of same descriptor")]
    ReplacesSelf,
    /// `share_threshold: true` on a value without `*`.
    #[error(
        "share_threshold can only be used with wildcard values (containing '*'), but found key '{0}'"
    )]
    ShareThresholdWithoutWildcard(String),
    /// `algorithm` is not fixed_window, sliding_window, token_bucket or concurrency.
    #[error(
        "unknown rate limit algorithm '{0}'; expected fixed_window, sliding_window, token_bucket or concurrency"
    )]
    UnknownAlgorithm(String),
    /// `burst` on a limit that is not a token bucket.
    #[error("burst only applies to algorithm: token_bucket")]
    BurstWithoutTokenBucket,
    /// A concurrency limit on a rule with a `value`: the request's value at that entry
    /// names its lease, so every request would share one.
    #[error(
        "a concurrency limit's entry '{0}' takes no value: the request's value there names the request (Envoy's x-request-id)"
    )]
    ConcurrencyWithValue(String),
    /// `unit_multiplier: 0`.
    #[error("unit_multiplier must be at least 1")]
    ZeroUnitMultiplier,
    /// Both `rate_limit` and `rate_limits` on one rule.
    #[error("a descriptor takes rate_limit or rate_limits, not both")]
    RateLimitAndRateLimits,
    /// `unlimited: true` inside `rate_limits`.
    #[error("unlimited does not go in rate_limits; use rate_limit: {{unlimited: true}}")]
    UnlimitedInRateLimits,
    /// Two limits of one `rate_limits` list with the same name.
    #[error("two limits in rate_limits are named '{0}'")]
    DuplicateLimitName(String),
    /// `metadata` that cannot become a protobuf `Struct`.
    #[error("error parsing metadata: {0}")]
    Metadata(String),
}

impl ConfigError {
    pub(crate) fn new(file: &str, path: &str, kind: ConfigErrorKind) -> ConfigError {
        ConfigError {
            file: file.to_owned(),
            path: path.to_owned(),
            location: None,
            kind,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        // YAML parser messages already end with their position.
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for ConfigError {}
