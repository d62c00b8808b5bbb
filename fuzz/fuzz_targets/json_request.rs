//! The sidecar's `/json` body decoding on arbitrary bytes.
//!
//! Invariants: decoding never panics; a decoded request, written back as proto3 JSON
//! (both field spellings, 64-bit numbers as strings, enums as numbers), decodes to the
//! same request; converting it to the core's request fails exactly when a limit override
//! has an unknown unit, and otherwise keeps every field.
#![no_main]

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use libfuzzer_sys::fuzz_target;
use ratelimit_proto::envoy::client::unit_from_pb;
use ratelimit_proto::envoy::request_from_pb;
use ratelimit_proto::json::parse_request;
use serde_json::{Map, Value, json};

fuzz_target!(|data: &[u8]| {
    let Ok(request) = parse_request(data) else {
        return;
    };
    let written = write(&request).to_string();
    assert_eq!(
        parse_request(written.as_bytes()).as_ref(),
        Ok(&request),
        "{written}"
    );

    let valid_units = request
        .descriptors
        .iter()
        .all(|d| d.limit.is_none_or(|l| unit_from_pb(l.unit).is_some()));
    match request_from_pb(request.clone()) {
        Ok(core) => {
            assert!(valid_units);
            assert_eq!(core.domain, request.domain);
            assert_eq!(core.hits_addend, request.hits_addend);
            assert_eq!(core.descriptors.len(), request.descriptors.len());
            for (c, pb) in core.descriptors.iter().zip(&request.descriptors) {
                assert_eq!(c.hits_addend, pb.hits_addend.map(|h| h.value));
                assert_eq!(
                    c.limit.map(|l| l.requests_per_unit),
                    pb.limit.map(|l| l.requests_per_unit)
                );
                let entries: Vec<(&str, &str)> =
                    c.entries.iter().map(|e| (&*e.key, &*e.value)).collect();
                let pb_entries: Vec<(&str, &str)> =
                    pb.entries.iter().map(|e| (&*e.key, &*e.value)).collect();
                assert_eq!(entries, pb_entries);
            }
        }
        Err(error) => {
            assert!(!valid_units, "{error}");
            let _ = error.to_string();
        }
    }
});

/// The proto3 JSON form of `request`, every field written.
fn write(request: &RateLimitRequest) -> Value {
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut out = Map::new();
            let entries: Vec<Value> = d
                .entries
                .iter()
                .map(|e| json!({"key": e.key, "value": e.value}))
                .collect();
            out.insert("entries".into(), entries.into());
            if let Some(limit) = d.limit {
                out.insert(
                    "limit".into(),
                    json!({"requestsPerUnit": limit.requests_per_unit, "unit": limit.unit}),
                );
            }
            if let Some(hits) = &d.hits_addend {
                out.insert("hitsAddend".into(), hits.value.to_string().into());
            }
            let negative = if i % 2 == 0 {
                "isNegativeHits"
            } else {
                "is_negative_hits"
            };
            out.insert(negative.into(), d.is_negative_hits.into());
            Value::Object(out)
        })
        .collect();
    json!({"domain": request.domain, "descriptors": descriptors, "hits_addend": request.hits_addend})
}
