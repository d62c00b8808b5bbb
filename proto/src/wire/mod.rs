//! A `RateLimitRequest` decoded from its protobuf bytes straight into the core's
//! [`Request`], for the server's hot path: no envoy-types message is built and then
//! taken apart, so a one-descriptor request costs three allocations (domain, key, value)
//! and the two vectors instead of twice as many.
//!
//! It accepts exactly what prost's generated decoder followed by
//! [`request_from_pb`](crate::envoy::request_from_pb) accepts, with the same result: the
//! last of a repeated scalar wins, a repeated embedded message is merged, unknown fields
//! are skipped, strings must be UTF-8, and an override with an unknown unit is refused
//! once the whole message has decoded. The property tests hold it to that.

mod response;

pub use response::encode_response;

use prost::DecodeError;
use prost::bytes::Buf;
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
use ratelimit_core::{Descriptor, Entry, LimitOverride, Request};

use crate::envoy::InvalidRequest;
use crate::envoy::client::unit_from_pb;

/// Why bytes are not a request the core can take.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RequestError {
    /// Not a `RateLimitRequest` (with prost's words where prost finds the fault).
    #[error("{0}")]
    Decode(String),
    /// A valid message the core cannot take.
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
}

impl From<DecodeError> for RequestError {
    fn from(error: DecodeError) -> RequestError {
        RequestError::Decode(error.to_string())
    }
}

fn malformed(what: impl Into<String>) -> RequestError {
    RequestError::Decode(format!(
        "failed to decode Protobuf message: {}",
        what.into()
    ))
}

/// Decodes a `RateLimitRequest` into the core's request.
pub fn decode_request(mut buf: &[u8]) -> Result<Request, RequestError> {
    let mut request = Request::default();
    let mut invalid = None;
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            1 => request.domain = string(wire_type, &mut buf)?,
            2 => {
                let mut body = embedded(wire_type, &mut buf)?;
                let index = request.descriptors.len();
                let (descriptor, unit) = descriptor(&mut body)?;
                if let (Some(unit), None) = (unit, &invalid) {
                    invalid = Some(InvalidRequest::OverrideUnit { index, unit });
                }
                request.descriptors.push(descriptor);
            }
            3 => request.hits_addend = varint(wire_type, &mut buf)? as u32,
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())?,
        }
    }
    match invalid {
        Some(error) => Err(error.into()),
        None => Ok(request),
    }
}

/// One descriptor, and the unit of its override when that unit is unknown.
fn descriptor(buf: &mut &[u8]) -> Result<(Descriptor, Option<i32>), RequestError> {
    let mut descriptor = Descriptor::default();
    let mut limit: Option<(u32, i32)> = None;
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        match tag {
            1 => {
                let mut body = embedded(wire_type, buf)?;
                descriptor.entries.push(entry(&mut body)?);
            }
            2 => {
                let mut body = embedded(wire_type, buf)?;
                let (mut requests, mut unit) = limit.unwrap_or_default();
                while body.has_remaining() {
                    let (tag, wire_type) = decode_key(&mut body)?;
                    match tag {
                        1 => requests = varint(wire_type, &mut body)? as u32,
                        2 => unit = varint(wire_type, &mut body)? as i32,
                        _ => skip_field(wire_type, tag, &mut body, DecodeContext::default())?,
                    }
                }
                limit = Some((requests, unit));
            }
            3 => {
                let mut body = embedded(wire_type, buf)?;
                let mut hits = descriptor.hits_addend.unwrap_or_default();
                while body.has_remaining() {
                    let (tag, wire_type) = decode_key(&mut body)?;
                    match tag {
                        1 => hits = varint(wire_type, &mut body)?,
                        _ => skip_field(wire_type, tag, &mut body, DecodeContext::default())?,
                    }
                }
                descriptor.hits_addend = Some(hits);
            }
            4 => descriptor.negative_hits = varint(wire_type, buf)? != 0,
            _ => skip_field(wire_type, tag, buf, DecodeContext::default())?,
        }
    }
    let Some((requests_per_unit, unit)) = limit else {
        return Ok((descriptor, None));
    };
    match unit_from_pb(unit) {
        Some(known) => {
            descriptor.limit = Some(LimitOverride {
                requests_per_unit,
                unit: known,
            });
            Ok((descriptor, None))
        }
        None => Ok((descriptor, Some(unit))),
    }
}

fn entry(buf: &mut &[u8]) -> Result<Entry, RequestError> {
    let mut entry = Entry::default();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        match tag {
            1 => entry.key = string(wire_type, buf)?,
            2 => entry.value = string(wire_type, buf)?,
            _ => skip_field(wire_type, tag, buf, DecodeContext::default())?,
        }
    }
    Ok(entry)
}

/// A length-delimited field's bytes, taken off `buf`.
fn embedded<'a>(wire_type: WireType, buf: &mut &'a [u8]) -> Result<&'a [u8], RequestError> {
    expect(wire_type, WireType::LengthDelimited)?;
    let len = decode_varint(buf)?;
    if len > buf.len() as u64 {
        return Err(malformed("buffer underflow"));
    }
    let (body, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(body)
}

fn string(wire_type: WireType, buf: &mut &[u8]) -> Result<String, RequestError> {
    let bytes = embedded(wire_type, buf)?;
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text.to_owned()),
        Err(_) => Err(malformed("invalid string value: data is not UTF-8 encoded")),
    }
}

fn varint(wire_type: WireType, buf: &mut &[u8]) -> Result<u64, RequestError> {
    expect(wire_type, WireType::Varint)?;
    Ok(decode_varint(buf)?)
}

fn expect(actual: WireType, expected: WireType) -> Result<(), RequestError> {
    if actual == expected {
        return Ok(());
    }
    Err(malformed(format!(
        "invalid wire type: {actual:?} (expected {expected:?})"
    )))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry as PbEntry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::google::protobuf::UInt64Value;
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::envoy::request_from_pb;

    /// What prost's generated decoder and the conversion make of `bytes`.
    fn reference(bytes: &[u8]) -> Result<Request, String> {
        let pb = RateLimitRequest::decode(bytes).map_err(|e| e.to_string())?;
        request_from_pb(pb).map_err(|e| e.to_string())
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), "[a-z]{1,6}", "\\PC{0,4}"]
    }

    fn pb_descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
        (
            proptest::collection::vec((text(), text()), 0..3),
            proptest::option::of((any::<u32>(), -1i32..10)),
            proptest::option::of(any::<u64>()),
            any::<bool>(),
        )
            .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| PbEntry { key, value })
                    .collect(),
                limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                    requests_per_unit,
                    unit,
                }),
                hits_addend: hits.map(|value| UInt64Value { value }),
                is_negative_hits: negative,
            })
    }

    fn pb_request() -> impl Strategy<Value = RateLimitRequest> {
        (
            text(),
            proptest::collection::vec(pb_descriptor(), 0..4),
            any::<u32>(),
        )
            .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
                domain,
                descriptors,
                hits_addend,
            })
    }

    proptest! {
        /// Every request prost encodes decodes to what prost and the conversion make of it.
        #[test]
        fn encoded_requests_decode_as_through_prost(request in pb_request()) {
            let bytes = request.encode_to_vec();
            let ours = decode_request(&bytes).map_err(|e| e.to_string());
            prop_assert_eq!(ours, reference(&bytes));
        }

        /// Concatenated messages (a repeated field merged, a scalar replaced), cut short,
        /// or with bytes flipped: accepted exactly when prost accepts them, with the same
        /// request.
        #[test]
        fn any_bytes_decode_as_through_prost(
            a in pb_request(),
            b in pb_request(),
            cut in any::<prop::sample::Index>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        ) {
            let mut bytes = a.encode_to_vec();
            bytes.extend(b.encode_to_vec());
            for (at, byte) in flips {
                if !bytes.is_empty() {
                    let i = at.index(bytes.len());
                    bytes[i] = byte;
                }
            }
            let end = if bytes.is_empty() { 0 } else { cut.index(bytes.len() + 1) };
            let bytes = &bytes[..end];
            let ours = decode_request(bytes);
            match reference(bytes) {
                Ok(request) => prop_assert_eq!(ours, Ok(request)),
                Err(_) => prop_assert!(ours.is_err(), "{:?}", ours),
            }
        }
    }

    #[test]
    fn an_unknown_unit_is_refused_with_the_descriptors_index() {
        let mut request = RateLimitRequest::default();
        request.descriptors.push(RateLimitDescriptor::default());
        request.descriptors.push(RateLimitDescriptor {
            limit: Some(RateLimitOverride {
                requests_per_unit: 1,
                unit: 42,
            }),
            ..RateLimitDescriptor::default()
        });
        let error = decode_request(&request.encode_to_vec()).unwrap_err();
        assert_eq!(
            error,
            RequestError::Invalid(InvalidRequest::OverrideUnit { index: 1, unit: 42 })
        );
    }
}
