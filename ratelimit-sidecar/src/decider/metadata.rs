//! `dynamic_metadata` of responses, as envoyproxy/ratelimit fills it when
//! `RESPONSE_DYNAMIC_METADATA` is on: the domain, each descriptor's entries (with its
//! limit override and hits addend when sent), the request's hits addend, and the
//! `metadata` of the rules of every descriptor that was not over its limit, merged in
//! order (the first value of a key wins; maps are merged).

use std::collections::{BTreeMap, HashMap};

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
use ratelimit_core::config::Metadata;
use ratelimit_core::{Code, Request, Response};

/// The metadata Struct for `request` and its `response`.
pub fn dynamic_metadata(request: &Request, response: &Response) -> Struct {
    let descriptors = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let entries = descriptor
                .entries
                .iter()
                .map(|e| string(format!("{}={}", e.key, e.value)))
                .collect();
            let mut fields = HashMap::from([("entries".to_owned(), list(entries))]);
            if let Some(limit) = descriptor.limit {
                let text = format!(
                    "requests_per_unit:{} unit:{}",
                    limit.requests_per_unit, limit.unit
                );
                fields.insert("limit".into(), string(text));
            }
            if let Some(hits) = descriptor.hits_addend {
                fields.insert("hitsAddend".into(), number(hits as f64));
            }
            structure(fields)
        })
        .collect();
    let mut fields = HashMap::from([
        ("domain".to_owned(), string(request.domain.clone())),
        ("descriptors".to_owned(), list(descriptors)),
    ]);
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".into(), number(f64::from(request.hits_addend)));
    }
    let mut merged = BTreeMap::new();
    for status in response
        .statuses
        .iter()
        .filter(|s| s.code != Code::OverLimit)
    {
        if let Some(Metadata::Map(map)) = status.metadata.as_deref() {
            merge(&mut merged, map);
        }
    }
    if !merged.is_empty() {
        fields.insert("metadata".into(), to_value(&Metadata::Map(merged)));
    }
    Struct { fields }
}

fn merge(into: &mut BTreeMap<String, Metadata>, from: &BTreeMap<String, Metadata>) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(Metadata::Map(existing)), Metadata::Map(more)) => merge(existing, more),
            (Some(_), _) => {}
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

fn to_value(metadata: &Metadata) -> Value {
    match metadata {
        Metadata::Null => Value {
            kind: Some(Kind::NullValue(0)),
        },
        Metadata::Bool(b) => Value {
            kind: Some(Kind::BoolValue(*b)),
        },
        Metadata::Number(n) => number(*n),
        Metadata::String(s) => string(s.clone()),
        Metadata::List(items) => list(items.iter().map(to_value).collect()),
        Metadata::Map(map) => {
            structure(map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect())
        }
    }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(fields: HashMap<String, Value>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::{Config, Descriptor, Limiter, MemoryStore, Settings, Unit, UnixMillis};

    fn field<'a>(s: &'a Struct, name: &str) -> &'a Kind {
        s.fields[name].kind.as_ref().unwrap()
    }

    #[test]
    fn passed_descriptors_contribute_their_rule_metadata_first_value_wins() {
        let yaml = "
domain: md
descriptors:
  - key: a
    metadata: {route: first, nested: {x: 1}}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    metadata: {route: second, nested: {y: 2}, extra: true}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: c
    metadata: {blocked: yes}
    rate_limit: {unit: minute, requests_per_unit: 0}
";
        let limiter = Limiter::new(
            &Config::from_yaml("md.yaml", yaml).unwrap(),
            Settings::default(),
        );
        let mut request = Request::new(
            "md",
            vec![
                Descriptor::new([("a", "1")]).with_hits(2),
                Descriptor::new([("b", "1")]),
                Descriptor::new([("c", "1")]),
                Descriptor::new([("z", "1")]).with_limit(3, Unit::Hour),
            ],
        );
        request.hits_addend = 4;
        let response = limiter
            .should_rate_limit(&request, &MemoryStore::default(), UnixMillis::from_secs(0))
            .unwrap();
        let s = dynamic_metadata(&request, &response);
        assert_eq!(field(&s, "domain"), &Kind::StringValue("md".into()));
        assert_eq!(field(&s, "hitsAddend"), &Kind::NumberValue(4.0));
        let Kind::ListValue(descriptors) = field(&s, "descriptors") else {
            panic!()
        };
        let Some(Kind::StructValue(first)) = &descriptors.values[0].kind else {
            panic!()
        };
        assert_eq!(field(first, "hitsAddend"), &Kind::NumberValue(2.0));
        let Some(Kind::StructValue(last)) = &descriptors.values[3].kind else {
            panic!()
        };
        assert_eq!(
            field(last, "limit"),
            &Kind::StringValue("requests_per_unit:3 unit:HOUR".into())
        );
        let Kind::StructValue(metadata) = field(&s, "metadata") else {
            panic!()
        };
        assert_eq!(field(metadata, "route"), &Kind::StringValue("first".into()));
        assert_eq!(field(metadata, "extra"), &Kind::BoolValue(true));
        assert!(
            !metadata.fields.contains_key("blocked"),
            "over-limit descriptors add nothing"
        );
        let Kind::StructValue(nested) = field(metadata, "nested") else {
            panic!()
        };
        assert_eq!(nested.fields.len(), 2, "maps are merged");
    }
}
