//! The xDS configuration resource, `ratelimit.config.ratelimit.v3.RateLimitConfig`: to
//! the YAML rules the file loader reads (so both sources validate alike and fail with
//! the same messages), and from loaded rules (for a control plane serving files).

use std::collections::BTreeMap;

use ratelimit_core::config::{
    Algorithm, DescriptorRule, DomainConfig, Limit, Metadata, RateLimitRule,
};
use serde_json::{Map, Value, json};

#[allow(missing_docs, clippy::all)] // generated code
pub mod pb {
    include!(concat!(
        env!("OUT_DIR"),
        "/ratelimit.config.ratelimit.v3.rs"
    ));
}

use pb::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit};

/// The resource's type URL.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The resource as the YAML text of one rules file.
pub fn to_yaml(config: &RateLimitConfig) -> String {
    let document = json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor_yaml).collect::<Vec<_>>(),
    });
    yaml_serde::to_string(&document).expect("a JSON value is always YAML")
}

fn descriptor_yaml(rule: &RateLimitDescriptor) -> Value {
    let mut map = Map::new();
    map.insert("key".into(), rule.key.clone().into());
    if !rule.value.is_empty() {
        map.insert("value".into(), rule.value.clone().into());
    }
    if let Some(policy) = &rule.rate_limit {
        let unit = RateLimitUnit::try_from(policy.unit).unwrap_or(RateLimitUnit::Unknown);
        let mut limit = Map::new();
        if !policy.unlimited || unit != RateLimitUnit::Unknown {
            limit.insert("unit".into(), unit.as_str_name().into());
            limit.insert("requests_per_unit".into(), policy.requests_per_unit.into());
        }
        if policy.unlimited {
            limit.insert("unlimited".into(), true.into());
        }
        if !policy.name.is_empty() {
            limit.insert("name".into(), policy.name.clone().into());
        }
        if !policy.replaces.is_empty() {
            let replaces = policy.replaces.iter().map(|r| json!({"name": r.name}));
            limit.insert("replaces".into(), replaces.collect());
        }
        map.insert("rate_limit".into(), limit.into());
    }
    for (flag, set) in [
        ("shadow_mode", rule.shadow_mode),
        ("detailed_metric", rule.detailed_metric),
        ("quota_mode", rule.quota_mode),
    ] {
        if set {
            map.insert(flag.into(), true.into());
        }
    }
    if let Some(metadata) = &rule.metadata {
        let fields = metadata.fields.iter();
        let object = fields.map(|(k, v)| (k.clone(), struct_value(v))).collect();
        map.insert("metadata".into(), Value::Object(object));
    }
    if !rule.descriptors.is_empty() {
        let children = rule.descriptors.iter().map(descriptor_yaml).collect();
        map.insert("descriptors".into(), Value::Array(children));
    }
    Value::Object(map)
}

fn struct_value(value: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::ListValue(list)) => list.values.iter().map(struct_value).collect(),
        Some(Kind::StructValue(object)) => {
            let fields = object.fields.iter();
            Value::Object(fields.map(|(k, v)| (k.clone(), struct_value(v))).collect())
        }
    }
}

/// A loaded domain as a resource named `name`, with the rules it cannot carry
/// (`value_to_metric` and `share_threshold` have no field) named in the warnings.
pub fn from_domain(name: &str, domain: &DomainConfig) -> (RateLimitConfig, Vec<String>) {
    let mut warnings = Vec::new();
    let descriptors = domain
        .descriptors
        .iter()
        .map(|rule| descriptor_pb(rule, &domain.domain, &mut warnings))
        .collect();
    let config = RateLimitConfig {
        name: name.to_owned(),
        domain: domain.domain.clone(),
        descriptors,
    };
    (config, warnings)
}

fn descriptor_pb(
    rule: &DescriptorRule,
    path: &str,
    warnings: &mut Vec<String>,
) -> RateLimitDescriptor {
    let path = format!("{path}.{}", rule.key);
    if rule.value_to_metric || rule.share_threshold {
        warnings.push(format!(
            "{path}: value_to_metric and share_threshold have no xDS field and are dropped"
        ));
    }
    if rule.rate_limits.len() > 1 {
        warnings.push(format!(
            "{path}: rate_limits has no xDS field; only its first limit is kept"
        ));
    }
    let limit = rule.rate_limit.as_ref().or(rule.rate_limits.first());
    if let Some(RateLimitRule {
        limit: Limit::Counted {
            window, algorithm, ..
        },
        ..
    }) = limit
        && (window.multiplier() != 1 || *algorithm != Algorithm::FixedWindow)
    {
        warnings.push(format!(
            "{path}: unit_multiplier and algorithm have no xDS field; the limit is a fixed window of one unit"
        ));
    }
    RateLimitDescriptor {
        key: rule.key.clone(),
        value: rule.value.clone().unwrap_or_default(),
        rate_limit: limit.map(|limit| {
            let (unit, requests_per_unit, unlimited) = match limit.limit {
                Limit::Unlimited => (RateLimitUnit::Unknown, 0, true),
                Limit::Counted {
                    window,
                    requests_per_unit,
                    ..
                } => {
                    let name = window.unit().as_upper_str();
                    let unit = RateLimitUnit::from_str_name(name).unwrap_or(RateLimitUnit::Unknown);
                    (unit, requests_per_unit, false)
                }
            };
            RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit,
                unlimited,
                name: limit.name.clone().unwrap_or_default(),
                replaces: limit
                    .replaces
                    .iter()
                    .map(|name| RateLimitReplace { name: name.clone() })
                    .collect(),
            }
        }),
        descriptors: rule
            .descriptors
            .iter()
            .map(|child| descriptor_pb(child, &path, warnings))
            .collect(),
        shadow_mode: rule.shadow_mode,
        detailed_metric: rule.detailed_metric,
        quota_mode: rule.quota_mode,
        metadata: match &rule.metadata {
            Some(Metadata::Map(fields)) => Some(struct_of(fields)),
            _ => None,
        },
    }
}

fn struct_of(fields: &BTreeMap<String, Metadata>) -> prost_types::Struct {
    prost_types::Struct {
        fields: fields
            .iter()
            .map(|(k, v)| (k.clone(), value_of(v)))
            .collect(),
    }
}

fn value_of(metadata: &Metadata) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match metadata {
        Metadata::Null => Kind::NullValue(0),
        Metadata::Bool(b) => Kind::BoolValue(*b),
        Metadata::Number(n) => Kind::NumberValue(*n),
        Metadata::String(s) => Kind::StringValue(s.clone()),
        Metadata::List(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(value_of).collect(),
        }),
        Metadata::Map(fields) => Kind::StructValue(struct_of(fields)),
    };
    prost_types::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::Config;

    const RULES: &str = "domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-user}
    shadow_mode: true
    metadata: {team: payments, weight: 2}
    descriptors:
      - key: path
        value: /checkout
        rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: per-user}]}
  - key: internal
    rate_limit: {unlimited: true}
  - key: open
";

    /// Rules loaded from YAML, made a resource, and turned back into YAML load to the
    /// same configuration.
    #[test]
    fn rules_survive_the_resource_round_trip() {
        let loaded = Config::from_yaml("shop.yaml", RULES).unwrap();
        let (resource, warnings) = from_domain("shop", &loaded.domains()[0]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let again = Config::from_yaml("shop", &to_yaml(&resource)).unwrap();
        assert_eq!(again.domains(), loaded.domains());
    }

    #[test]
    fn an_unknown_unit_fails_as_it_does_in_a_file() {
        let resource = RateLimitConfig {
            name: "bad".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: Some(RateLimitPolicy {
                    requests_per_unit: 3,
                    ..RateLimitPolicy::default()
                }),
                ..RateLimitDescriptor::default()
            }],
        };
        let error = Config::from_yaml("bad", &to_yaml(&resource)).unwrap_err();
        assert!(error.to_string().contains("UNKNOWN"), "{error}");
    }
}
