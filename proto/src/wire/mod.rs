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
use ratelimit_core::{Descriptor, Entry, LimitOverride, Request, RequestBounds};

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

/// Decodes a `RateLimitRequest` into the core's request, with at most
/// `bounds.max_descriptors` descriptors of at most `bounds.max_entries` entries: past
/// either, decoding stops with [`InvalidRequest::Bounds`], having held no more (a 4 MiB
/// message of empty descriptors would otherwise decode to millions of them).
pub fn decode_request(buf: &[u8], bounds: &RequestBounds) -> Result<Request, RequestError> {
    let mut request = Request::default();
    decode_request_into(buf, &mut request, bounds)?;
    Ok(request)
}

/// [`decode_request`] into `request`, replacing what it held but keeping its strings'
/// and vectors' allocations: a server that keeps a few requests and decodes into them
/// allocates nothing for a request no larger than one it decoded before. On an error,
/// `request` holds part of the message and is fit only to decode into again.
pub fn decode_request_into(
    mut buf: &[u8],
    request: &mut Request,
    bounds: &RequestBounds,
) -> Result<(), RequestError> {
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
                if used == bounds.max_descriptors {
                    let max = bounds.max_descriptors;
                    RequestBounds::count("descriptors", used + 1, max).map_err(bounded)?;
                }
                let mut body = embedded(wire_type, &mut buf)?;
                let max_entries = bounds.max_entries;
                let unit = descriptor(&mut body, slot(descriptors, used), (used, max_entries))?;
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

/// Past a bound: the request is invalid.
fn bounded(error: ratelimit_core::RequestError) -> RequestError {
    RequestError::Invalid(InvalidRequest::Bounds(error))
}

/// One descriptor (the `index`th, of at most `max_entries` entries) into `descriptor`;
/// the unit of its override when that unit is unknown.
fn descriptor(
    buf: &mut &[u8],
    descriptor: &mut Descriptor,
    (index, max_entries): (usize, usize),
) -> Result<Option<i32>, RequestError> {
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
                if used == max_entries {
                    let field = format!("descriptors[{index}].entries");
                    RequestBounds::count(&field, used + 1, max_entries).map_err(bounded)?;
                }
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

    /// The default bounds, which the generated requests stay within.
    const BOUNDS: RequestBounds = RequestBounds::DEFAULT;

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
            let ours = decode_request(&bytes, &BOUNDS).map_err(|e| e.to_string());
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
            let ours = decode_request(bytes, &BOUNDS);
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
            let mut reused = decode_request(&before.encode_to_vec(), &BOUNDS).unwrap_or_default();
            let ours = decode_request_into(bytes, &mut reused, &BOUNDS).map(|()| reused);
            prop_assert_eq!(ours, decode_request(bytes, &BOUNDS));
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
        let error = decode_request(&request.encode_to_vec(), &BOUNDS).unwrap_err();
        assert_eq!(
            error,
            RequestError::Invalid(InvalidRequest::OverrideUnit { index: 1, unit: 42 })
        );
    }

    proptest! {
        /// Within the bounds a request decodes as through prost; past one, decoding stops
        /// with the bound's error naming the list (the first past its bound).
        #[test]
        fn descriptors_and_entries_past_their_bounds_are_refused(request in pb_request()) {
            let bounds = RequestBounds { max_descriptors: 2, max_entries: 1, ..BOUNDS };
            let bytes = request.encode_to_vec();
            let ours = decode_request(&bytes, &bounds);
            let entries = request.descriptors.iter().take(2).position(|d| d.entries.len() > 1);
            let past = match (request.descriptors.len() > 2, entries) {
                (_, Some(d)) => Some(format!("descriptors[{d}].entries")),
                (true, None) => Some("descriptors".to_owned()),
                (false, None) => None,
            };
            match past {
                None => prop_assert_eq!(ours.map_err(|e| e.to_string()), reference(&bytes)),
                Some(field) => {
                    let error = ratelimit_core::RequestError::TooMany { field, max: 0 };
                    let Err(RequestError::Invalid(InvalidRequest::Bounds(got))) = ours else {
                        return Err(TestCaseError::fail(format!("{ours:?}")));
                    };
                    let same = matches!((&got, &error), (
                        ratelimit_core::RequestError::TooMany { field: a, .. },
                        ratelimit_core::RequestError::TooMany { field: b, .. },
                    ) if a == b);
                    prop_assert!(same, "{:?} against {:?}", got, error);
                }
            }
        }
    }

    /// A 4 MiB message of empty descriptors (two bytes each) stops at the bound.
    #[test]
    fn millions_of_empty_descriptors_are_refused_at_the_bound() {
        let bytes: Vec<u8> = std::iter::repeat_n([0x12u8, 0], 2 << 20)
            .flatten()
            .collect();
        let error = decode_request(&bytes, &BOUNDS).unwrap_err();
        assert_eq!(
            error.to_string(),
            "descriptors has more than 256 items; at most 256 are allowed"
        );
    }
}
