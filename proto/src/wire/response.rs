//! A core [`Response`] encoded straight into the bytes of the `RateLimitResponse` that
//! [`response_to_pb`](crate::envoy::response_to_pb) builds, for the server's hot path:
//! no envoy-types message is built, measured and dropped. The bytes are prost's, field for
//! field (fields in number order, defaults left out); the property tests hold it to that.

use prost::bytes::BufMut;
use prost::encoding::{WireType, encode_varint, encoded_len_varint};
use ratelimit_core::{CurrentLimit, DescriptorStatus, HeaderFormat, Response};

use crate::envoy::client::{code_to_pb, unit_to_pb};

/// Appends `response` to `buf` as the `RateLimitResponse` of `response_to_pb(response,
/// headers)`, encoded.
pub fn encode_response(response: &Response, headers: Option<&HeaderFormat>, buf: &mut impl BufMut) {
    varint_field(1, code_to_pb(response.overall_code) as u64, buf);
    for status in &response.statuses {
        message_field(2, status_len(status), buf);
        encode_status(status, buf);
    }
    let Some(format) = headers else { return };
    for (key, value) in response.header_pairs(format) {
        let len = string_len(&key) + string_len(&value);
        message_field(3, len, buf);
        string_field(1, &key, buf);
        string_field(2, &value, buf);
    }
}

fn encode_status(status: &DescriptorStatus, buf: &mut impl BufMut) {
    varint_field(1, code_to_pb(status.code) as u64, buf);
    if let Some(limit) = &status.current_limit {
        message_field(2, limit_len(limit), buf);
        varint_field(1, u64::from(limit.requests_per_unit), buf);
        varint_field(2, unit_to_pb(limit.unit) as u64, buf);
        string_field(3, limit.name.as_deref().unwrap_or_default(), buf);
    }
    varint_field(3, u64::from(status.limit_remaining), buf);
    if let Some(seconds) = status.duration_until_reset {
        let seconds = duration_seconds(seconds);
        message_field(4, varint_len(seconds), buf);
        varint_field(1, seconds, buf);
    }
}

fn status_len(status: &DescriptorStatus) -> usize {
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |limit| message_len(limit_len(limit)));
    let reset = status.duration_until_reset.map_or(0, |seconds| {
        message_len(varint_len(duration_seconds(seconds)))
    });
    varint_len(code_to_pb(status.code) as u64)
        + limit
        + varint_len(u64::from(status.limit_remaining))
        + reset
}

fn limit_len(limit: &CurrentLimit) -> usize {
    varint_len(u64::from(limit.requests_per_unit))
        + varint_len(unit_to_pb(limit.unit) as u64)
        + string_len(limit.name.as_deref().unwrap_or_default())
}

/// `google.protobuf.Duration.seconds` of a reset in `seconds`, as an int64's varint.
fn duration_seconds(seconds: u64) -> u64 {
    i64::try_from(seconds).unwrap_or(i64::MAX) as u64
}

/// Every field of these messages has a number below 16: its key is one byte.
const KEY: usize = 1;

// The lengths of fields as they are encoded (nothing for a default value).

fn varint_len(value: u64) -> usize {
    if value == 0 {
        0
    } else {
        KEY + encoded_len_varint(value)
    }
}

fn string_len(value: &str) -> usize {
    if value.is_empty() {
        0
    } else {
        message_len(value.len())
    }
}

fn message_len(len: usize) -> usize {
    KEY + encoded_len_varint(len as u64) + len
}

fn varint_field(tag: u8, value: u64, buf: &mut impl BufMut) {
    if value != 0 {
        key(tag, WireType::Varint, buf);
        varint(value, buf);
    }
}

fn string_field(tag: u8, value: &str, buf: &mut impl BufMut) {
    if !value.is_empty() {
        message_field(tag, value.len(), buf);
        buf.put_slice(value.as_bytes());
    }
}

/// The key and length of a length-delimited field, whose bytes follow.
fn message_field(tag: u8, len: usize, buf: &mut impl BufMut) {
    key(tag, WireType::LengthDelimited, buf);
    varint(len as u64, buf);
}

/// A field's key: one byte, as every field number here is below 16.
fn key(tag: u8, wire_type: WireType, buf: &mut impl BufMut) {
    debug_assert!(tag < 16, "field {tag} has a key of more than one byte");
    buf.put_u8(tag << 3 | wire_type as u8);
}

/// A varint; most values here (codes, units, lengths) take one byte.
fn varint(value: u64, buf: &mut impl BufMut) {
    match u8::try_from(value) {
        Ok(byte) if byte < 0x80 => buf.put_u8(byte),
        _ => encode_varint(value, buf),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;
    use ratelimit_core::{Code, HeaderNames, Policy, RateLimitHeaders, Unit};

    use super::*;
    use crate::envoy::response_to_pb;

    fn code() -> impl Strategy<Value = Code> {
        prop_oneof![Just(Code::Ok), Just(Code::OverLimit)]
    }

    fn unit() -> impl Strategy<Value = Unit> {
        prop_oneof![
            Just(Unit::Second),
            Just(Unit::Minute),
            Just(Unit::Hour),
            Just(Unit::Day),
            Just(Unit::Week),
            Just(Unit::Month),
            Just(Unit::Year),
        ]
    }

    /// Numbers at the edges as well as anywhere: 0 (left out), one varint byte, many.
    fn number() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0), 1u64..128, 128u64..20_000, any::<u64>()]
    }

    fn status() -> impl Strategy<Value = DescriptorStatus> {
        let limit = (number(), unit(), proptest::option::of("\\PC{0,200}")).prop_map(
            |(requests, unit, name)| CurrentLimit {
                requests_per_unit: requests as u32,
                unit,
                name: name.map(Into::into),
            },
        );
        (
            code(),
            proptest::option::of(limit),
            number(),
            proptest::option::of(number()),
        )
            .prop_map(|(code, current_limit, remaining, reset)| DescriptorStatus {
                code,
                current_limit,
                limit_remaining: remaining as u32,
                duration_until_reset: reset,
                metadata: None,
            })
    }

    fn response() -> impl Strategy<Value = Response> {
        let headers =
            (number(), number(), number()).prop_map(|(limit, remaining, reset)| RateLimitHeaders {
                limit: limit as u32,
                remaining: remaining as u32,
                reset,
            });
        let policy = ("[a-z]{1,8}", number(), number(), any::<bool>()).prop_map(
            |(name, quota, remaining, over)| Policy {
                name,
                quota,
                window: 60,
                remaining,
                reset: quota / 2,
                over,
            },
        );
        (
            code(),
            proptest::collection::vec(status(), 0..20),
            proptest::option::of(headers),
            proptest::collection::vec(policy, 0..3),
        )
            .prop_map(|(overall_code, statuses, headers, policies)| Response {
                overall_code,
                statuses: statuses.into(),
                headers,
                policies,
            })
    }

    fn format() -> impl Strategy<Value = Option<HeaderFormat>> {
        prop_oneof![
            Just(None),
            Just(Some(HeaderFormat::RateLimit(HeaderNames::default()))),
            Just(Some(HeaderFormat::IetfDraft11)),
        ]
    }

    proptest! {
        /// The bytes are those prost encodes for `response_to_pb`, for any response and
        /// header format.
        #[test]
        fn a_response_encodes_as_prost_encodes_its_message(response in response(), format in format()) {
            let mut direct = Vec::new();
            encode_response(&response, format.as_ref(), &mut direct);
            let reference = response_to_pb(&response, format.as_ref()).encode_to_vec();
            prop_assert_eq!(direct, reference);
        }
    }
}
