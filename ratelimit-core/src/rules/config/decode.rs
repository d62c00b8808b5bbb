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

pub(super) struct Cx<'a> {
    pub(super) file: &'a str,
    plain: HashMap<String, String>,
    pub(super) warnings: RefCell<Vec<String>>,
    /// Errors found so far, when reading goes on past them.
    errors: RefCell<Vec<ConfigError>>,
}

impl Cx<'_> {
    fn report(&self, error: ConfigError) {
        self.errors.borrow_mut().push(error);
    }

    /// The list at `field` of `map` (empty when absent or null), found at `path`.
    pub(super) fn list<'v>(
        &self,
        map: &'v Mapping,
        field: &str,
        path: &str,
        expected: &'static str,
    ) -> Result<&'v [Value], ConfigError> {
        match map.get(field) {
            None | Some(Value::Null) => Ok(&[]),
            Some(Value::Sequence(items)) => Ok(items),
            Some(other) => Err(self.wrong_type(path, expected, other)),
        }
    }

    pub(super) fn error(&self, path: &str, kind: ConfigErrorKind) -> ConfigError {
        ConfigError::new(self.file, path, kind)
    }

    pub(super) fn wrong_type(
        &self,
        path: &str,
        expected: &'static str,
        found: &Value,
    ) -> ConfigError {
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
        let items = self.list(map, "descriptors", &path, "a list of descriptors")?;
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

    /// Strings, and scalars written without quotes (`key: 0x10`) as written (as upstream
    /// reads them into a string). Null or absent is `None`.
    pub(super) fn string_field(
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

    pub(super) fn bool_field(
        &self,
        map: &Mapping,
        field: &str,
        path: &str,
    ) -> Result<bool, ConfigError> {
        let at = join(path, field);
        match map.get(field) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) if self.plain.contains_key(&at) => super::yaml11::boolean(s)
                .ok_or_else(|| self.wrong_type(&at, "bool", &Value::String(s.clone()))),
            Some(other) => Err(self.wrong_type(&at, "bool", other)),
        }
    }

    pub(super) fn u32_field(
        &self,
        map: &Mapping,
        field: &str,
        path: &str,
    ) -> Result<u32, ConfigError> {
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

pub(super) fn join(path: &str, field: &str) -> String {
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
pub(super) fn describe(value: &Value) -> String {
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
