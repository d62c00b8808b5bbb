//! The one edge between the core's types and Envoy's RLS v3 messages.
//!
//! At the root: the request and response as plain prost messages, wire-compatible with
//! `envoy.service.ratelimit.v3` and free of any gRPC transport, so that the proxy-wasm
//! filter can encode its callout on wasm32; [`client`] converts them. With the `envoy`
//! feature, [`envoy`] converts envoy-types' messages, for the server and for clients,
//! with the same code.
#![allow(missing_docs)] // generated code

include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.rs"));

#[macro_use]
mod edge;
#[cfg(feature = "envoy")]
pub mod envoy;
#[cfg(feature = "envoy")]
pub mod json;
#[cfg(feature = "envoy")]
pub mod wire;
#[cfg(feature = "xds")]
pub mod xds;

/// The core's types to and from this crate's minimal messages.
pub mod client {
    use crate::{
        RateLimitDescriptor, RateLimitRequest, RateLimitResponse, UInt64Value,
        rate_limit_descriptor, rate_limit_response,
    };

    client_edge!();
}

/// The gRPC service and method the messages belong to.
pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The method of [`SERVICE`].
pub const METHOD: &str = "ShouldRateLimit";

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Bytes written by envoy-types' full messages decode here, and back.
    #[test]
    fn a_request_round_trips_with_known_bytes() {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![rate_limit_descriptor::Entry {
                    key: "user".into(),
                    value: "a".into(),
                }],
                limit: None,
                hits_addend: None,
                is_negative_hits: false,
            }],
            hits_addend: 1,
        };
        // domain=1 "edge"; descriptors=2 { entries=1 { key=1 "user", value=2 "a" } }; hits_addend=3 1
        let expected: &[u8] = &[
            0x0a, 4, b'e', b'd', b'g', b'e', 0x12, 11, 0x0a, 9, 0x0a, 4, b'u', b's', b'e', b'r',
            0x12, 1, b'a', 0x18, 1,
        ];
        assert_eq!(request.encode_to_vec(), expected);
        assert_eq!(RateLimitRequest::decode(expected).unwrap(), request);
    }
}
