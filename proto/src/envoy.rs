//! envoy-types' RLS messages to and from the core's types: the server side (the
//! sidecar decodes requests and encodes responses) and, through the same code as the
//! minimal messages, the client side ([`client`]).

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus as PbStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ratelimit_core::{Descriptor, Entry, HeaderFormat, LimitOverride, Request, Response};

use self::client::{code_to_pb, unit_from_pb, unit_to_pb};

/// The core's types to and from envoy-types' messages, for a client of the service.
pub mod client {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse, rate_limit_response,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;

    client_edge!();
}

/// A request the core cannot take.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidRequest {
    /// A descriptor `limit` override with a unit the service does not know.
    #[error(
        "descriptor {index}: limit override has unit {unit}, which is not SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR"
    )]
    OverrideUnit {
        /// Position of the descriptor in the request.
        index: usize,
        /// The unit number sent.
        unit: i32,
    },
    /// More descriptors, or entries in one, than the bounds allow: the decoder stopped
    /// there rather than hold them.
    #[error(transparent)]
    Bounds(#[from] ratelimit_core::RequestError),
}

/// Moves the strings out of an Envoy request into the core's request.
pub fn request_from_pb(request: RateLimitRequest) -> Result<Request, InvalidRequest> {
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(index, d)| descriptor_from_pb(index, d))
        .collect::<Result<_, _>>()?;
    Ok(Request {
        domain: request.domain,
        descriptors,
        hits_addend: request.hits_addend,
    })
}

fn descriptor_from_pb(
    index: usize,
    descriptor: RateLimitDescriptor,
) -> Result<Descriptor, InvalidRequest> {
    let limit = descriptor
        .limit
        .map(|limit| {
            unit_from_pb(limit.unit)
                .map(|unit| LimitOverride {
                    requests_per_unit: limit.requests_per_unit,
                    unit,
                })
                .ok_or(InvalidRequest::OverrideUnit {
                    index,
                    unit: limit.unit,
                })
        })
        .transpose()?;
    Ok(Descriptor {
        entries: descriptor
            .entries
            .into_iter()
            .map(|e| Entry {
                key: e.key,
                value: e.value,
            })
            .collect(),
        limit,
        hits_addend: descriptor.hits_addend.map(|h| h.value),
        negative_hits: descriptor.is_negative_hits,
    })
}

/// The Envoy response for a core response.
pub fn response_to_pb(response: &Response, headers: Option<&HeaderFormat>) -> RateLimitResponse {
    let statuses = response
        .statuses
        .iter()
        .map(|status| PbStatus {
            code: code_to_pb(status.code) as i32,
            current_limit: status.current_limit.as_ref().map(|limit| RateLimit {
                name: limit.name.as_deref().unwrap_or_default().to_owned(),
                requests_per_unit: limit.requests_per_unit,
                unit: unit_to_pb(limit.unit) as i32,
            }),
            limit_remaining: status.limit_remaining,
            duration_until_reset: status.duration_until_reset.map(|seconds| PbDuration {
                seconds: i64::try_from(seconds).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            quota: None,
        })
        .collect();
    let response_headers_to_add = headers
        .map(|format| {
            response
                .header_pairs(format)
                .into_iter()
                .map(|(key, value)| HeaderValue {
                    key,
                    value,
                    raw_value: Vec::new(),
                })
                .collect()
        })
        .unwrap_or_default();
    RateLimitResponse {
        overall_code: code_to_pb(response.overall_code) as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use ratelimit_core::{
        Code, CurrentLimit, DescriptorStatus, HeaderNames, RateLimitHeaders, Unit,
    };

    use super::*;

    fn request() -> Request {
        let mut request = Request::new(
            "edge",
            vec![
                Descriptor::new([("user", "alice"), ("path", "/x")]).with_hits(3),
                Descriptor::new([("ip", "10.0.0.1")]),
            ],
        );
        request.descriptors[1].limit = Some(LimitOverride {
            requests_per_unit: 7,
            unit: Unit::Week,
        });
        request.hits_addend = 2;
        request
    }

    #[test]
    fn both_message_families_carry_the_same_request() {
        let request = request();
        let envoy = client::request_to_pb(&request);
        assert_eq!(request_from_pb(envoy.clone()).unwrap(), request);
        // The minimal messages write the same bytes, which the server reads back.
        let minimal = crate::client::request_to_pb(&request).encode_to_vec();
        assert_eq!(minimal, envoy.encode_to_vec());
        let decoded = RateLimitRequest::decode(minimal.as_slice()).unwrap();
        assert_eq!(request_from_pb(decoded).unwrap(), request);
    }

    #[test]
    fn a_response_round_trips_with_its_headers() {
        let statuses = vec![
            DescriptorStatus {
                code: Code::OverLimit,
                current_limit: Some(CurrentLimit {
                    requests_per_unit: 5,
                    unit: Unit::Minute,
                    name: Some("per-user".into()),
                }),
                limit_remaining: 0,
                duration_until_reset: Some(30),
                metadata: None,
            },
            DescriptorStatus::NO_LIMIT,
        ];
        // What a client reads back: the policies are the statuses' limits.
        let response = Response {
            overall_code: Code::OverLimit,
            headers: RateLimitHeaders::for_statuses(&statuses),
            policies: ratelimit_core::Policy::from_statuses(&statuses),
            statuses: statuses.into(),
        };
        let format = HeaderFormat::RateLimit(HeaderNames::default());
        let wire = response_to_pb(&response, Some(&format));
        let headers: Vec<(&str, &str)> = wire
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            headers,
            [
                ("RateLimit-Limit", "5"),
                ("RateLimit-Remaining", "0"),
                ("RateLimit-Reset", "30")
            ]
        );
        assert_eq!(client::response_from_pb(&wire), response);
        let minimal = crate::RateLimitResponse::decode(wire.encode_to_vec().as_slice()).unwrap();
        assert_eq!(crate::client::response_from_pb(&minimal), response);
    }
}
