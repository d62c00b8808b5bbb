//! The proto3 JSON mapping of `RateLimitRequest` and `RateLimitResponse`, for `/json`.
//!
//! Input accepts the lowerCamelCase names and the original proto names, enums by name or
//! number, 64-bit integers as numbers or strings, and rejects unknown fields, as Go's
//! protojson does. Output uses lowerCamelCase, enum names, `"42s"` durations and omits
//! zero values.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value as PbValue};
use serde_json::{Map, Value, json};

/// Why a `/json` body was refused; the message names the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct JsonError(String);

fn err(path: &str, message: impl std::fmt::Display) -> JsonError {
    if path.is_empty() {
        JsonError(message.to_string())
    } else {
        JsonError(format!("{path}: {message}"))
    }
}

/// Parses a `RateLimitRequest` from proto3 JSON.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(err("", "empty body: expected a JSON RateLimitRequest"));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| err("", format!("invalid JSON: {e}")))?;
    // A parsed `Value` keeps the last of a repeated key; protojson refuses the body.
    serde_json::from_slice::<Unique>(body).map_err(|e| err("", e))?;
    let object = fields(
        &value,
        "",
        &["domain", "descriptors", "hits_addend", "hitsAddend"],
    )?;
    let mut request = RateLimitRequest::default();
    for (name, value) in object {
        match name.as_str() {
            "domain" => request.domain = string(value, "domain")?,
            "descriptors" => {
                request.descriptors = list(value, "descriptors")?
                    .iter()
                    .enumerate()
                    .map(|(i, d)| descriptor(d, &format!("descriptors[{i}]")))
                    .collect::<Result<_, _>>()?;
            }
            _ => request.hits_addend = uint32(value, name)?,
        }
    }
    Ok(request)
}

fn descriptor(value: &Value, path: &str) -> Result<RateLimitDescriptor, JsonError> {
    let known = [
        "entries",
        "limit",
        "hits_addend",
        "hitsAddend",
        "is_negative_hits",
        "isNegativeHits",
    ];
    let mut out = RateLimitDescriptor::default();
    for (name, value) in fields(value, path, &known)? {
        let at = format!("{path}.{name}");
        match name.as_str() {
            "entries" => {
                out.entries = list(value, &at)?
                    .iter()
                    .enumerate()
                    .map(|(i, e)| entry(e, &format!("{at}[{i}]")))
                    .collect::<Result<_, _>>()?;
            }
            "limit" if value.is_null() => {}
            "limit" => out.limit = Some(limit(value, &at)?),
            "hits_addend" | "hitsAddend" if value.is_null() => {}
            "hits_addend" | "hitsAddend" => {
                out.hits_addend = Some(UInt64Value {
                    value: uint64(value, &at)?,
                })
            }
            _ => out.is_negative_hits = boolean(value, &at)?,
        }
    }
    Ok(out)
}

fn entry(value: &Value, path: &str) -> Result<Entry, JsonError> {
    let mut out = Entry::default();
    for (name, value) in fields(value, path, &["key", "value"])? {
        let at = format!("{path}.{name}");
        match name.as_str() {
            "key" => out.key = string(value, &at)?,
            _ => out.value = string(value, &at)?,
        }
    }
    Ok(out)
}

fn limit(value: &Value, path: &str) -> Result<RateLimitOverride, JsonError> {
    let mut out = RateLimitOverride::default();
    for (name, value) in fields(
        value,
        path,
        &["requests_per_unit", "requestsPerUnit", "unit"],
    )? {
        let at = format!("{path}.{name}");
        match name.as_str() {
            "unit" => out.unit = unit(value, &at)?,
            _ => out.requests_per_unit = uint32(value, &at)?,
        }
    }
    Ok(out)
}

fn fields<'a>(
    value: &'a Value,
    path: &str,
    known: &[&str],
) -> Result<&'a Map<String, Value>, JsonError> {
    let Value::Object(object) = value else {
        return Err(err(
            path,
            format!("expected an object, got {}", kind(value)),
        ));
    };
    if let Some(unknown) = object.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(err(path, format!("unknown field '{unknown}'")));
    }
    Ok(object)
}

/// Any JSON document in which no object names a key twice.
struct Unique;

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(from: D) -> Result<Unique, D::Error> {
        from.deserialize_any(Unique)
    }
}

impl<'de> serde::de::Visitor<'de> for Unique {
    type Value = Unique;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<Unique, A::Error> {
        while items.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.replace('_', "").to_ascii_lowercase()) {
                let message = format!("duplicate field '{key}'");
                return Err(serde::de::Error::custom(message));
            }
            map.next_value::<Unique>()?;
        }
        Ok(Unique)
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn string(value: &Value, path: &str) -> Result<String, JsonError> {
    match value {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        other => Err(err(path, format!("expected a string, got {}", kind(other)))),
    }
}

fn boolean(value: &Value, path: &str) -> Result<bool, JsonError> {
    match value {
        Value::Null => Ok(false),
        Value::Bool(b) => Ok(*b),
        other => Err(err(
            path,
            format!("expected a boolean, got {}", kind(other)),
        )),
    }
}

fn list<'a>(value: &'a Value, path: &str) -> Result<&'a [Value], JsonError> {
    match value {
        Value::Null => Ok(&[]),
        Value::Array(items) => Ok(items),
        other => Err(err(path, format!("expected an array, got {}", kind(other)))),
    }
}

fn uint64(value: &Value, path: &str) -> Result<u64, JsonError> {
    let parsed = match value {
        Value::Null => Some(0),
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| err(path, format!("expected an unsigned integer, got {value}")))
}

fn uint32(value: &Value, path: &str) -> Result<u32, JsonError> {
    u32::try_from(uint64(value, path)?)
        .map_err(|_| err(path, format!("{value} does not fit in 32 bits")))
}

fn unit(value: &Value, path: &str) -> Result<i32, JsonError> {
    let unit = match value {
        Value::Null => Some(Unit::Unknown),
        Value::String(name) => Unit::from_str_name(name),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .and_then(|n| Unit::try_from(n).ok()),
        _ => None,
    };
    unit.map(|u| u as i32).ok_or_else(|| {
        err(
            path,
            format!(
                "unknown unit {value}; expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR"
            ),
        )
    })
}

/// The proto3 JSON form of a response.
pub fn render_response(response: &RateLimitResponse) -> String {
    let mut out = Map::new();
    out.insert("overallCode".into(), code(response.overall_code));
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|status| {
            let mut s = Map::new();
            s.insert("code".into(), code(status.code));
            if let Some(limit) = &status.current_limit {
                let mut l = Map::new();
                if !limit.name.is_empty() {
                    l.insert("name".into(), json!(limit.name));
                }
                if limit.requests_per_unit != 0 {
                    l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                }
                let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
                if unit != Unit::Unknown {
                    l.insert("unit".into(), json!(unit.as_str_name()));
                }
                s.insert("currentLimit".into(), Value::Object(l));
            }
            if status.limit_remaining != 0 {
                s.insert("limitRemaining".into(), json!(status.limit_remaining));
            }
            if let Some(d) = &status.duration_until_reset {
                s.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(s)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(metadata) = &response.dynamic_metadata {
        out.insert("dynamicMetadata".into(), structure(metadata));
    }
    Value::Object(out).to_string()
}

/// A `google.protobuf.Struct` as proto3 JSON writes it: a plain object.
fn structure(s: &Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

fn value(v: &PbValue) -> Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => number(*n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value).collect()),
    }
}

/// A number as protojson writes it: a whole number without a fraction (`1`, not `1.0`).
fn number(n: f64) -> Value {
    // Whole numbers this side of 2^63 convert exactly; others keep their float form.
    const WHOLE: f64 = 9_223_372_036_854_775_808.0;
    match n.fract() == 0.0 && n.abs() < WHOLE {
        true => json!(n as i64),
        false => json!(n),
    }
}

fn code(code: i32) -> Value {
    json!(Code::try_from(code).unwrap_or(Code::Unknown).as_str_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_both_spellings_strings_for_numbers_and_enum_numbers() {
        let r = parse_request(
            br#"{"domain":"d","hits_addend":"2","descriptors":[{"entries":[{"key":"k","value":"v"}],
                 "hitsAddend":"5","limit":{"requests_per_unit":3,"unit":"HOUR"}},
                 {"entries":[],"limit":{"requestsPerUnit":"4","unit":7}}]}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].hits_addend, Some(UInt64Value { value: 5 }));
        assert_eq!(r.descriptors[0].limit.unwrap().unit, Unit::Hour as i32);
        assert_eq!(r.descriptors[1].limit.unwrap().requests_per_unit, 4);
        assert_eq!(r.descriptors[1].limit.unwrap().unit, Unit::Week as i32);
    }

    #[test]
    fn errors_name_the_field() {
        let e = |body: &str| parse_request(body.as_bytes()).unwrap_err().to_string();
        assert_eq!(e(""), "empty body: expected a JSON RateLimitRequest");
        assert!(e("}").starts_with("invalid JSON"));
        assert_eq!(e("[1,2]"), "expected an object, got an array");
        assert_eq!(e(r#"{"notAField":1}"#), "unknown field 'notAField'");
        assert_eq!(
            e(r#"{"domain":5}"#),
            "domain: expected a string, got a number"
        );
        assert_eq!(
            e(r#"{"descriptors":[{"entries":[{"key":1}]}]}"#),
            "descriptors[0].entries[0].key: expected a string, got a number"
        );
        assert_eq!(
            e(r#"{"hitsAddend":-1}"#),
            "hitsAddend: expected an unsigned integer, got -1"
        );
        assert_eq!(
            e(r#"{"hitsAddend":4294967296}"#),
            "hitsAddend: 4294967296 does not fit in 32 bits"
        );
        assert!(
            e(r#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#)
                .starts_with("descriptors[0].limit.unit: unknown unit")
        );
    }

    #[test]
    fn a_field_named_twice_is_refused_at_any_depth_and_in_either_spelling() {
        let e = |body: &str| parse_request(body.as_bytes()).unwrap_err().to_string();
        let entries = r#""entries":[{"key":"k","value":"v"}]"#;
        for (body, field) in [
            (r#"{"domain":"a","domain":"a"}"#.to_owned(), "domain"),
            (
                r#"{"hits_addend":1,"hitsAddend":1}"#.to_owned(),
                "hitsAddend",
            ),
            (
                format!(r#"{{"descriptors":[{{{entries},{entries}}}]}}"#),
                "entries",
            ),
            (
                r#"{"descriptors":[{"entries":[{"key":"k","key":"k"}]}]}"#.to_owned(),
                "key",
            ),
        ] {
            let message = e(&body);
            assert!(
                message.starts_with(&format!("duplicate field '{field}'")),
                "{body}: {message}"
            );
        }
        let once = format!(r#"{{"domain":"a","descriptors":[{{{entries}}},{{{entries}}}]}}"#);
        assert_eq!(parse_request(once.as_bytes()).unwrap().descriptors.len(), 2);
    }

    #[test]
    fn whole_numbers_in_metadata_are_written_without_a_fraction() {
        use envoy_types::pb::google::protobuf::value::Kind;
        let number = |n: f64| PbValue {
            kind: Some(Kind::NumberValue(n)),
        };
        let metadata = Struct {
            fields: [("a", 1.0), ("b", -3.0), ("c", 1.5)]
                .into_iter()
                .map(|(k, n)| (k.to_owned(), number(n)))
                .collect(),
        };
        let response = RateLimitResponse {
            dynamic_metadata: Some(metadata),
            ..RateLimitResponse::default()
        };
        let text = render_response(&response);
        assert!(text.contains(r#"{"a":1,"b":-3,"c":1.5}"#), "{text}");
    }
}
