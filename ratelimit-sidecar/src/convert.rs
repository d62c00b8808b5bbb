//! Envoy's RLS v3 messages to and from the core's types.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus as PbStatus, RateLimit, rate_limit::Unit as PbUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ratelimit_core::{Code, Descriptor, Entry, LimitOverride, Request, Response, Unit};

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
    })
}

/// The response unit numbering, which the request override shares (WEEK is 7).
pub fn unit_from_pb(unit: i32) -> Option<Unit> {
    match PbUnit::try_from(unit).ok()? {
        PbUnit::Unknown => None,
        PbUnit::Second => Some(Unit::Second),
        PbUnit::Minute => Some(Unit::Minute),
        PbUnit::Hour => Some(Unit::Hour),
        PbUnit::Day => Some(Unit::Day),
        PbUnit::Week => Some(Unit::Week),
        PbUnit::Month => Some(Unit::Month),
        PbUnit::Year => Some(Unit::Year),
    }
}

fn unit_to_pb(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn code_to_pb(code: Code) -> PbCode {
    match code {
        Code::Ok => PbCode::Ok,
        Code::OverLimit => PbCode::OverLimit,
    }
}

/// Names of the `RateLimit-*` headers, when they are enabled.
#[derive(Clone, Debug)]
pub struct HeaderNames {
    /// `LIMIT_LIMIT_HEADER`.
    pub limit: String,
    /// `LIMIT_REMAINING_HEADER`.
    pub remaining: String,
    /// `LIMIT_RESET_HEADER`.
    pub reset: String,
}

/// The Envoy response for a core response.
pub fn response_to_pb(response: &Response, headers: Option<&HeaderNames>) -> RateLimitResponse {
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
    let response_headers_to_add = match (headers, response.headers) {
        (Some(names), Some(values)) => vec![
            header(&names.limit, values.limit.to_string()),
            header(&names.remaining, values.remaining.to_string()),
            header(&names.reset, values.reset.to_string()),
        ],
        _ => Vec::new(),
    };
    RateLimitResponse {
        overall_code: code_to_pb(response.overall_code) as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    }
}
