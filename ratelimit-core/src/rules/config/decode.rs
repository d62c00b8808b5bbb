//! YAML text to [`DomainConfig`], with envoyproxy/ratelimit's checks in its order:
//! parse, then a walk over every map key, then field types and rule semantics.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;
use yaml_serde::{Mapping, Value};

use super::{
    Algorithm, ConfigError, ConfigErrorKind, DescriptorRule, DomainConfig, Limit, Metadata,
    RateLimitRule,
};
use crate::rules::unit::{Unit, Window};

/// Every field name the schema knows, at any depth (envoyproxy/ratelimit checks one flat
/// list, so a known field in the wrong place is ignored rather than rejected).
const KNOWN_KEYS: [&str; 20] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "rate_limits",
    "unit",
    "unit_multiplier",
    "algorithm",
    "burst",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// A domain and its warnings, or every error found.
pub(super) type Decoded = Result<(DomainConfig, Vec<String>), Vec<ConfigError>>;

/// Parses and validates one file; also returns its warnings. On failure, every error
/// found, in file order: all those of the key pass when it finds any (unknown keys, lists
/// of non-maps, unsupported values), else those of the field pass (one per descriptor
/// rule at most: a rule in error is left out and the next one read). An error found after
/// the parse is given the line and column of the node it names.
pub(super) fn decode_file(file: &str, text: &str) -> Decoded {
    // A byte-order mark is skipped, as envoyproxy/ratelimit's decoder skips it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    decode(file, text).map_err(|errors| locate_errors(text, errors))
}

/// Gives each error found after the parse the line and column, in `text`, of the node it
/// names (of the first collection too deep, for [`ConfigErrorKind::TooDeep`]).
pub(super) fn locate_errors(text: &str, errors: Vec<ConfigError>) -> Vec<ConfigError> {
    errors
        .into_iter()
        .map(|mut error| {
            if error.location.is_none() {
                error.location = match error.kind {
                    ConfigErrorKind::TooDeep(max) => super::nesting::too_deep(text, max),
                    _ if error.path.is_empty() => None,
                    _ => super::position::locate(text, &error.path),
                };
            }
            error
        })
        .collect()
}

fn decode(file: &str, text: &str) -> Decoded {
    let mut root = parse_first_document(file, text).map_err(|e| vec![e])?;
    // `<<: *anchor` merges, as in envoyproxy/ratelimit's decoder.
    root.apply_merge().map_err(|e| {
        vec![ConfigError::new(
            file,
            "",
            ConfigErrorKind::Yaml(e.to_string()),
        )]
    })?;
    decode_document(file, &root, super::position::plain_scalars(text))
}

/// Validates one parsed document (a file's, or rules built in code), after the parse:
/// the same passes, errors and warnings for either. `plain` holds the scalars written
/// without quotes, as written, by path ([`super::position::plain_scalars`]).
pub(super) fn decode_document(file: &str, root: &Value, plain: HashMap<String, String>) -> Decoded {
    let max = super::nesting::MAX_DEPTH;
    if depth(root) > max {
        return Err(vec![ConfigError::new(
            file,
            "",
            ConfigErrorKind::TooDeep(max),
        )]);
    }
    let cx = Cx {
        file,
        plain,
        warnings: RefCell::new(Vec::new()),
        errors: RefCell::new(Vec::new()),
    };
    cx.check_keys(root, &mut String::new());
    if !cx.errors.borrow().is_empty() {
        return Err(cx.errors.into_inner());
    }
    let domain = cx.domain(root);
    let mut errors = cx.errors.into_inner();
    match domain {
        Ok(domain) if errors.is_empty() => Ok((domain, cx.warnings.into_inner())),
        Ok(_) => Err(errors),
        Err(error) => {
            errors.push(error);
            Err(errors)
        }
    }
}

impl Cx<'_> {
    /// The second pass, on a file whose keys are all known: the domain and its rules.
    fn domain(&self, root: &Value) -> Result<DomainConfig, ConfigError> {
        let root = match root {
            Value::Null => &Mapping::new(),
            Value::Mapping(map) => map,
            other => {
                return Err(self.wrong_type("", "a map with 'domain' and 'descriptors'", other));
            }
        };
        let domain = self.string_field(root, "domain", "")?.unwrap_or_default();
        if domain.is_empty() {
            return Err(self.error("domain", ConfigErrorKind::EmptyDomain));
        }
        let descriptors = self.rules(root, "", &format!("{domain}."))?;
        Ok(DomainConfig {
            domain,
            descriptors,
        })
    }
}

/// The key envoyproxy/ratelimit uses to detect duplicates: `domain.parent_value.key_value`.
pub(super) fn composite_key(domain: &str, parents: &str, rule: &DescriptorRule) -> String {
    let mut key = if parents.is_empty() {
        format!("{domain}.")
    } else {
        parents.to_owned()
    };
    key.push_str(&rule.key);
    if let Some(value) = &rule.value {
        key.push('_');
        key.push_str(value);
    }
    key
}

/// Only the first YAML document of a file is read, as envoyproxy/ratelimit does.
fn parse_first_document(file: &str, text: &str) -> Result<Value, ConfigError> {
    if let Some(location) = super::nesting::too_deep(text, super::nesting::MAX_DEPTH) {
        let kind = ConfigErrorKind::TooDeep(super::nesting::MAX_DEPTH);
        let mut error = ConfigError::new(file, "", kind);
        error.location = Some(location);
        return Err(error);
    }
    let Some(document) = yaml_serde::Deserializer::from_str(text).next() else {
        return Ok(Value::Null);
    };
    Value::deserialize(document).map_err(|e| {
        let mut error = ConfigError::new(file, "", ConfigErrorKind::Yaml(e.to_string()));
        error.location = e.location().map(|l| (l.line(), l.column()));
        error
    })
}

struct Cx<'a> {
    file: &'a str,
    plain: HashMap<String, String>,
    warnings: RefCell<Vec<String>>,
    /// Errors found so far, when reading goes on past them.
    errors: RefCell<Vec<ConfigError>>,
}

impl Cx<'_> {
    fn report(&self, error: ConfigError) {
        self.errors.borrow_mut().push(error);
    }

    fn error(&self, path: &str, kind: ConfigErrorKind) -> ConfigError {
        ConfigError::new(self.file, path, kind)
    }

    fn wrong_type(&self, path: &str, expected: &'static str, found: &Value) -> ConfigError {
        self.error(
            path,
            ConfigErrorKind::WrongType {
                expected,
                found: describe(found),
            },
        )
    }

    /// The first pass: map keys must be known strings, lists must hold maps, and leaves
    /// must be strings, integers, booleans or null. `metadata` is free-form. Every error
    /// is reported; what is under a node in error is not looked at.
    fn check_keys(&self, value: &Value, path: &mut String) {
        match value {
            Value::Mapping(map) => {
                for (key, child) in map {
                    let Value::String(key) = key else {
                        self.report(self.error(path, ConfigErrorKind::NonStringKey(describe(key))));
                        continue;
                    };
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(key);
                    if !KNOWN_KEYS.contains(&key.as_str()) {
                        self.report(self.error(path, ConfigErrorKind::UnknownKey(key.clone())));
                    } else if key != "metadata" {
                        self.check_keys(child, path);
                    }
                    path.truncate(len);
                }
            }
            Value::Sequence(items) => {
                for (index, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{index}]"));
                    if matches!(item, Value::Mapping(_)) {
                        self.check_keys(item, path);
                    } else {
                        self.report(
                            self.error(path, ConfigErrorKind::ListOfNonMap(describe(item))),
                        );
                    }
                    path.truncate(len);
                }
            }
            Value::Number(n) if n.is_f64() => {
                self.report(self.error(path, ConfigErrorKind::UnsupportedValue("float")));
            }
            Value::Tagged(_) => {
                self.report(self.error(path, ConfigErrorKind::UnsupportedValue("tagged")));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
        }
    }

    fn rules(
        &self,
        map: &Mapping,
        path: &str,
        parents: &str,
    ) -> Result<Vec<DescriptorRule>, ConfigError> {
        let path = join(path, "descriptors");
        let items = match map.get("descriptors") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Sequence(items)) => items,
            Some(other) => return Err(self.wrong_type(&path, "a list of descriptors", other)),
        };
        let mut seen = HashSet::new();
        let mut rules = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let path = format!("{path}[{index}]");
            let Value::Mapping(item) = item else {
                self.report(self.error(&path, ConfigErrorKind::ListOfNonMap(describe(item))));
                continue;
            };
            // A rule in error is reported and left out; the next one is read.
            match self.rule(item, &path, parents, &mut seen) {
                Ok(rule) => rules.push(rule),
                Err(error) => self.report(error),
            }
        }
        Ok(rules)
    }

    fn rule(
        &self,
        map: &Mapping,
        path: &str,
        parents: &str,
        seen: &mut HashSet<String>,
    ) -> Result<DescriptorRule, ConfigError> {
        let key = self.string_field(map, "key", path)?.unwrap_or_default();
        let value = self
            .string_field(map, "value", path)?
            .filter(|v| !v.is_empty());
        let mut rule = DescriptorRule {
            key,
            value,
            rate_limit: None,
            rate_limits: Vec::new(),
            shadow_mode: self.bool_field(map, "shadow_mode", path)?,
            quota_mode: self.bool_field(map, "quota_mode", path)?,
            detailed_metric: self.bool_field(map, "detailed_metric", path)?,
            value_to_metric: self.bool_field(map, "value_to_metric", path)?,
            share_threshold: self.bool_field(map, "share_threshold", path)?,
            metadata: None,
            descriptors: Vec::new(),
        };
        if rule.key.is_empty() {
            return Err(self.error(&join(path, "key"), ConfigErrorKind::EmptyKey));
        }
        let composite = composite_key("", parents, &rule);
        if !seen.insert(composite.clone()) {
            return Err(self.error(path, ConfigErrorKind::DuplicateKey(composite)));
        }
        rule.rate_limit = self.rate_limit(map, path)?;
        rule.rate_limits = self.rate_limits(map, path)?;
        if rule.rate_limit.is_some() && !rule.rate_limits.is_empty() {
            return Err(self.error(
                &join(path, "rate_limits"),
                ConfigErrorKind::RateLimitAndRateLimits,
            ));
        }
        let leased = |r: &RateLimitRule| {
            matches!(
                r.limit,
                Limit::Counted {
                    algorithm: Algorithm::Concurrency,
                    ..
                }
            )
        };
        if let Some(value) = &rule.value
            && rule.rate_limit.iter().chain(&rule.rate_limits).any(leased)
        {
            return Err(self.error(
                &join(path, "value"),
                ConfigErrorKind::ConcurrencyWithValue(format!("{}_{value}", rule.key)),
            ));
        }
        if rule.share_threshold && !rule.value.as_deref().is_some_and(|v| v.contains('*')) {
            let shown = match &rule.value {
                Some(value) => format!("{}_{value}", rule.key),
                None => rule.key.clone(),
            };
            return Err(self.error(
                &join(path, "share_threshold"),
                ConfigErrorKind::ShareThresholdWithoutWildcard(shown),
            ));
        }
        if let Some(metadata) = map.get("metadata") {
            rule.metadata =
                Some(metadata_value(metadata).map_err(|m| {
                    self.error(&join(path, "metadata"), ConfigErrorKind::Metadata(m))
                })?);
        }
        rule.descriptors = self.rules(map, path, &format!("{composite}."))?;
        Ok(rule)
    }

    fn rate_limit(&self, map: &Mapping, path: &str) -> Result<Option<RateLimitRule>, ConfigError> {
        let path = join(path, "rate_limit");
        let block = match map.get("rate_limit") {
            None => return Ok(None),
            Some(Value::Null) => {
                self.warnings.borrow_mut().push(format!(
                    "{}: {path} is empty, so this descriptor is not limited (a whitelist); were `unit` and `requests_per_unit` meant to be indented under it?",
                    self.file
                ));
                return Ok(None);
            }
            Some(Value::Mapping(block)) => block,
            Some(other) => return Err(self.wrong_type(&path, "a rate_limit map", other)),
        };
        self.limit_block(block, &path).map(Some)
    }

    /// `rate_limits:`: a list of blocks, each a `rate_limit` without `unlimited`.
    fn rate_limits(&self, map: &Mapping, path: &str) -> Result<Vec<RateLimitRule>, ConfigError> {
        let path = join(path, "rate_limits");
        let items = match map.get("rate_limits") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Sequence(items)) => items,
            Some(other) => return Err(self.wrong_type(&path, "a list of rate_limit maps", other)),
        };
        let mut rules: Vec<RateLimitRule> = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let path = format!("{path}[{index}]");
            let Value::Mapping(block) = item else {
                return Err(self.error(&path, ConfigErrorKind::ListOfNonMap(describe(item))));
            };
            let rule = self.limit_block(block, &path)?;
            if rule.limit == Limit::Unlimited {
                return Err(self.error(
                    &join(&path, "unlimited"),
                    ConfigErrorKind::UnlimitedInRateLimits,
                ));
            }
            if let Some(name) = &rule.name
                && rules.iter().any(|other| other.name.as_ref() == Some(name))
            {
                return Err(self.error(
                    &join(&path, "name"),
                    ConfigErrorKind::DuplicateLimitName(name.clone()),
                ));
            }
            rules.push(rule);
        }
        Ok(rules)
    }

    /// One limit block, at `path`.
    fn limit_block(&self, block: &Mapping, path: &str) -> Result<RateLimitRule, ConfigError> {
        let path = path.to_owned();
        let unit_name = self.string_field(block, "unit", &path)?.unwrap_or_default();
        let requests_per_unit = self.u32_field(block, "requests_per_unit", &path)?;
        let unlimited = self.bool_field(block, "unlimited", &path)?;
        let name = self
            .string_field(block, "name", &path)?
            .filter(|n| !n.is_empty());
        let unit = Unit::parse(&unit_name);
        let limit = match (unlimited, unit) {
            (true, Some(_)) => {
                return Err(self.error(&join(&path, "unit"), ConfigErrorKind::UnlimitedWithUnit));
            }
            (true, None) => Limit::Unlimited,
            (false, Some(unit)) => Limit::Counted {
                window: Window::new(unit, self.multiplier(block, &path)?),
                requests_per_unit,
                algorithm: self.algorithm(block, &path, requests_per_unit)?,
            },
            (false, None) => {
                return Err(self.error(
                    &join(&path, "unit"),
                    ConfigErrorKind::InvalidUnit(unit_name),
                ));
            }
        };
        let replaces = self.replaces(block, &path, name.as_deref())?;
        Ok(RateLimitRule {
            limit,
            name,
            replaces,
        })
    }

    /// `unit_multiplier`: 1 when absent, never 0.
    fn multiplier(&self, block: &Mapping, path: &str) -> Result<u32, ConfigError> {
        if !block.contains_key("unit_multiplier") {
            return Ok(1);
        }
        match self.u32_field(block, "unit_multiplier", path)? {
            0 => Err(self.error(
                &join(path, "unit_multiplier"),
                ConfigErrorKind::ZeroUnitMultiplier,
            )),
            n => Ok(n),
        }
    }

    /// `algorithm` and, for a token bucket, `burst`.
    fn algorithm(
        &self,
        block: &Mapping,
        path: &str,
        requests_per_unit: u32,
    ) -> Result<Algorithm, ConfigError> {
        let name = self.string_field(block, "algorithm", path)?;
        let has_burst = block.get("burst").is_some_and(|b| !b.is_null());
        let algorithm = match name.as_deref() {
            None | Some("fixed_window") => Algorithm::FixedWindow,
            Some("sliding_window") => Algorithm::SlidingWindow,
            Some("concurrency") => Algorithm::Concurrency,
            Some("token_bucket") => Algorithm::TokenBucket {
                burst: match has_burst {
                    true => self.u32_field(block, "burst", path)?,
                    false => requests_per_unit,
                },
            },
            Some(other) => {
                return Err(self.error(
                    &join(path, "algorithm"),
                    ConfigErrorKind::UnknownAlgorithm(other.to_owned()),
                ));
            }
        };
        if has_burst && !matches!(algorithm, Algorithm::TokenBucket { .. }) {
            return Err(self.error(
                &join(path, "burst"),
                ConfigErrorKind::BurstWithoutTokenBucket,
            ));
        }
        Ok(algorithm)
    }

    fn replaces(
        &self,
        block: &Mapping,
        path: &str,
        own_name: Option<&str>,
    ) -> Result<Vec<String>, ConfigError> {
        let path = join(path, "replaces");
        let items = match block.get("replaces") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Sequence(items)) => items,
            Some(other) => return Err(self.wrong_type(&path, "a list of {name: ...} maps", other)),
        };
        let mut names = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let path = format!("{path}[{index}]");
            let Value::Mapping(item) = item else {
                return Err(self.error(&path, ConfigErrorKind::ListOfNonMap(describe(item))));
            };
            let name = self.string_field(item, "name", &path)?.unwrap_or_default();
            if name.is_empty() {
                return Err(self.error(&path, ConfigErrorKind::EmptyReplaces));
            }
            if Some(name.as_str()) == own_name {
                return Err(self.error(&path, ConfigErrorKind::ReplacesSelf));
            }
            names.push(name);
        }
        Ok(names)
    }

    /// Strings, and scalars written without quotes (`key: 0x10`) as written (as upstream
    /// reads them into a string). Null or absent is `None`.
    fn string_field(
        &self,
        map: &Mapping,
        field: &str,
        path: &str,
    ) -> Result<Option<String>, ConfigError> {
        let written = || self.plain.get(&join(path, field)).cloned();
        match map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            // `0x10` and `True` are read as written, not as the number or boolean.
            Some(Value::Number(n)) => Ok(Some(written().unwrap_or_else(|| n.to_string()))),
            Some(Value::Bool(b)) => Ok(Some(written().unwrap_or_else(|| b.to_string()))),
            Some(other) => Err(self.wrong_type(&join(path, field), "string", other)),
        }
    }

    fn bool_field(&self, map: &Mapping, field: &str, path: &str) -> Result<bool, ConfigError> {
        let at = join(path, field);
        match map.get(field) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) if self.plain.contains_key(&at) => super::yaml11::boolean(s)
                .ok_or_else(|| self.wrong_type(&at, "bool", &Value::String(s.clone()))),
            Some(other) => Err(self.wrong_type(&at, "bool", other)),
        }
    }

    fn u32_field(&self, map: &Mapping, field: &str, path: &str) -> Result<u32, ConfigError> {
        let at = join(path, field);
        let number = match map.get(field) {
            None | Some(Value::Null) => return Ok(0),
            Some(Value::Number(n)) => n.as_i64(),
            Some(Value::String(s)) if self.plain.contains_key(&at) => super::yaml11::integer(s),
            Some(_) => None,
        };
        number
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.wrong_type(&at, "uint32", map.get(field).unwrap_or(&Value::Null)))
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// How deeply collections nest in `value` (a scalar is 0), as the parse-time check counts.
fn depth(value: &Value) -> usize {
    match value {
        Value::Sequence(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Mapping(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        Value::Tagged(tagged) => depth(&tagged.value),
        _ => 0,
    }
}

/// A short rendering of a YAML value for messages: scalars as written, containers by kind.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a map".to_owned(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

fn metadata_value(value: &Value) -> Result<Metadata, String> {
    Ok(match value {
        Value::Null => Metadata::Null,
        Value::Bool(b) => Metadata::Bool(*b),
        Value::Number(n) => Metadata::Number(n.as_f64().unwrap_or_default()),
        Value::String(s) => Metadata::String(s.clone()),
        Value::Sequence(items) => {
            Metadata::List(items.iter().map(metadata_value).collect::<Result<_, _>>()?)
        }
        Value::Mapping(map) => {
            let mut out = BTreeMap::new();
            for (key, child) in map {
                // A number or boolean key is read as its text, as upstream reads it.
                let key = match key {
                    Value::String(key) => key.clone(),
                    Value::Number(_) | Value::Bool(_) => describe(key),
                    other => return Err(format!("key {} is not a string", describe(other))),
                };
                out.insert(key, metadata_value(child)?);
            }
            Metadata::Map(out)
        }
        Value::Tagged(t) => return Err(format!("tagged value {} has no Struct form", t.tag)),
    })
}
