//! The limit blocks of a rule: `rate_limit`, `rate_limits` and each block's fields
//! (`unit`, `unit_multiplier`, `algorithm`, `burst`, `name`, `replaces`).

use yaml_serde::{Mapping, Value};

use super::decode::{Cx, describe, join};
use super::{Algorithm, ConfigError, ConfigErrorKind, Limit, RateLimitRule};
use crate::rules::unit::{Unit, Window};

/// A decoded part, or why it is refused.
type Decoded<T> = Result<T, ConfigError>;

impl Cx<'_> {
    /// `rate_limit:`: one block; an empty one is a whitelist (with a warning).
    pub(super) fn rate_limit(&self, map: &Mapping, path: &str) -> Decoded<Option<RateLimitRule>> {
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
    pub(super) fn rate_limits(&self, map: &Mapping, path: &str) -> Decoded<Vec<RateLimitRule>> {
        let path = join(path, "rate_limits");
        let items = self.list(map, "rate_limits", &path, "a list of rate_limit maps")?;
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
}
