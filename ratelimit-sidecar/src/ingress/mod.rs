//! Where requests come in: the listeners of every worker ([`listeners`]), gRPC
//! connections on hyper ([`connections`]), the open-file limit ([`descriptors`]),
//! `ShouldRateLimit` framed by hand ([`grpc`]), the HTTP routes ([`http`]) with `/json`
//! (its JSON form is `ratelimit_proto::json`), gRPC over a unix socket ([`uds`]) and the
//! listeners' TLS ([`tls`]). The workers they run on are [`crate::runtime`]'s.

pub(crate) mod connections;
pub(crate) mod descriptors;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod listeners;
pub(crate) mod tls;
pub(crate) mod uds;
