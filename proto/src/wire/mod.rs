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
pub fn decode_request(buf: &[u8]) -> Result<Request, RequestError> {
    let mut request = Request::default();
    decode_request_into(buf, &mut request)?;
    Ok(request)
}

/// [`decode_request`] into `request`, replacing what it held but keeping its strings'
/// and vectors' allocations: a server that keeps a few requests and decodes into them
/// allocates nothing for a request no larger than one it decoded before. On an error,
/// `request` holds part of the message and is fit only to decode into again.
pub fn decode_request_into(mut buf: &[u8], request: &mut Request) -> Result<(), RequestError> {
    let Request {
        domain,
        descriptors,
        hits_addend,
    } = request;
    domain.clear();
    *hits_addend = 0;
    let mut used = 0;
    let mut invalid = None;
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            1 => string(wire_type, &mut buf, domain)?,
            2 => {
                let mut body = embedded(wire_type, &mut buf)?;
                let unit = descriptor(&mut body, slot(descriptors, used))?;
                if let (Some(unit), None) = (unit, &invalid) {
                    invalid = Some(InvalidRequest::OverrideUnit { index: used, unit });
                }
                used += 1;
            }
            3 => *hits_addend = varint(wire_type, &mut buf)? as u32,
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())?,
        }
    }
    descriptors.truncate(used);
    match invalid {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

/// The element at `index` of `items`, of which the first `index` are this message's: one
/// left from an earlier message, or a new one.
fn slot<T: Default>(items: &mut Vec<T>, index: usize) -> &mut T {
    if index == items.len() {
        items.push(T::default());
    }
    &mut items[index]
}

/// One descriptor into `descriptor`; the unit of its override when that unit is unknown.
fn descriptor(buf: &mut &[u8], descriptor: &mut Descriptor) -> Result<Option<i32>, RequestError> {
    let Descriptor {
        entries,
        limit: applied,
        hits_addend,
        negative_hits,
    } = descriptor;
    (*applied, *hits_addend, *negative_hits) = (None, None, false);
    let (mut used, mut limit): (usize, Option<(u32, i32)>) = (0, None);
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        match tag {
            1 => {
                let mut body = embedded(wire_type, buf)?;
                entry(&mut body, slot(entries, used))?;
                used += 1;
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
                let mut hits = hits_addend.unwrap_or_default();
                while body.has_remaining() {
                    let (tag, wire_type) = decode_key(&mut body)?;
                    match tag {
                        1 => hits = varint(wire_type, &mut body)?,
                        _ => skip_field(wire_type, tag, &mut body, DecodeContext::default())?,
                    }
                }
                *hits_addend = Some(hits);
            }
            4 => *negative_hits = varint(wire_type, buf)? != 0,
            _ => skip_field(wire_type, tag, buf, DecodeContext::default())?,
        }
    }
    entries.truncate(used);
    let Some((requests_per_unit, unit)) = limit else {
        return Ok(None);
    };
    match unit_from_pb(unit) {
        Some(known) => {
            *applied = Some(LimitOverride {
                requests_per_unit,
                unit: known,
            });
            Ok(None)
        }
        None => Ok(Some(unit)),
    }
}

fn entry(buf: &mut &[u8], entry: &mut Entry) -> Result<(), RequestError> {
    entry.key.clear();
    entry.value.clear();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        match tag {
            1 => string(wire_type, buf, &mut entry.key)?,
            2 => string(wire_type, buf, &mut entry.value)?,
            _ => skip_field(wire_type, tag, buf, DecodeContext::default())?,
        }
    }
    Ok(())
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

/// A string field into `into`, replacing what it held (the last of a repeated scalar wins).
fn string(wire_type: WireType, buf: &mut &[u8], into: &mut String) -> Result<(), RequestError> {
    let bytes = embedded(wire_type, buf)?;
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            into.clear();
            into.push_str(text);
            Ok(())
        }
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

        /// Decoding into a request that held another message (longer or shorter, with
        /// entries, overrides and addends of its own) leaves nothing of it behind.
        #[test]
        fn a_reused_request_decodes_as_a_new_one(
            before in pb_request(),
            after in pb_request(),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = after.encode_to_vec();
            let bytes = &bytes[..cut.index(bytes.len() + 1)];
            let mut reused = decode_request(&before.encode_to_vec()).unwrap_or_default();
            let ours = decode_request_into(bytes, &mut reused).map(|()| reused);
            prop_assert_eq!(ours, decode_request(bytes));
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
