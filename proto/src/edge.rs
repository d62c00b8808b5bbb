//! The client side of the edge, written once for both message families: the minimal
//! messages of this crate and envoy-types' (which share field names and numbers). The
//! macro expands where `RateLimitRequest`, `RateLimitResponse`, `RateLimitDescriptor`,
//! `rate_limit_descriptor`, `rate_limit_response` and `UInt64Value` name one family.

macro_rules! client_edge {
    () => {
        use rate_limit_response::rate_limit::Unit as PbUnit;
        use rate_limit_response::{Code as PbCode, DescriptorStatus as PbStatus};
        use ratelimit_core::{
            Code, CurrentLimit, DescriptorStatus, RateLimitHeaders, Request, Response, Unit,
        };

        /// The RLS request for a core request.
        // envoy-types' descriptor has fields the minimal one lacks.
        #[allow(clippy::needless_update)]
        pub fn request_to_pb(request: &Request) -> RateLimitRequest {
            RateLimitRequest {
                domain: request.domain.clone(),
                descriptors: request
                    .descriptors
                    .iter()
                    .map(|d| RateLimitDescriptor {
                        entries: d
                            .entries
                            .iter()
                            .map(|e| rate_limit_descriptor::Entry {
                                key: e.key.clone(),
                                value: e.value.clone(),
                            })
                            .collect(),
                        limit: d.limit.map(|l| rate_limit_descriptor::RateLimitOverride {
                            requests_per_unit: l.requests_per_unit,
                            unit: unit_to_pb(l.unit) as i32,
                        }),
                        hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                        is_negative_hits: d.negative_hits,
                    })
                    .collect(),
                hits_addend: request.hits_addend,
                ..Default::default()
            }
        }

        /// The core response for an RLS response: codes, limits, remaining and reset per
        /// descriptor, and the `RateLimit-*` values the core chooses from them. A limit
        /// with a unit the core does not know is left out.
        pub fn response_from_pb(response: &RateLimitResponse) -> Response {
            let statuses: ratelimit_core::Statuses =
                response.statuses.iter().map(status_from_pb).collect();
            Response {
                overall_code: code_from_pb(response.overall_code),
                headers: RateLimitHeaders::for_statuses(&statuses),
                policies: ratelimit_core::Policy::from_statuses(&statuses),
                statuses,
            }
        }

        fn status_from_pb(status: &PbStatus) -> DescriptorStatus {
            DescriptorStatus {
                code: code_from_pb(status.code),
                current_limit: status.current_limit.as_ref().and_then(|limit| {
                    Some(CurrentLimit {
                        requests_per_unit: limit.requests_per_unit,
                        unit: unit_from_pb(limit.unit)?,
                        name: (!limit.name.is_empty()).then(|| limit.name.as_str().into()),
                    })
                }),
                limit_remaining: status.limit_remaining,
                duration_until_reset: status
                    .duration_until_reset
                    .and_then(|d| u64::try_from(d.seconds).ok()),
                metadata: None,
            }
        }

        /// `OVER_LIMIT` is over; `OK` and `UNKNOWN` are not.
        pub fn code_from_pb(code: i32) -> Code {
            if code == PbCode::OverLimit as i32 {
                Code::OverLimit
            } else {
                Code::Ok
            }
        }

        /// The wire code of a core code.
        pub fn code_to_pb(code: Code) -> PbCode {
            match code {
                Code::Ok => PbCode::Ok,
                Code::OverLimit => PbCode::OverLimit,
            }
        }

        /// The unit numbering of responses, which limit overrides share (WEEK is 7).
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

        /// The wire unit of a core unit.
        pub fn unit_to_pb(unit: Unit) -> PbUnit {
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
    };
}
