//! Where requests come in: the listeners of every worker ([`listeners`], [`workers`]),
//! `ShouldRateLimit` framed by hand ([`grpc`]), the HTTP routes ([`http`]) with `/json`
//! ([`json`]), gRPC over a unix socket ([`uds`]) and the listeners' TLS ([`tls`]).

pub mod grpc;
pub mod http;
pub mod json;
pub mod listeners;
pub mod tls;
pub mod uds;
pub mod workers;
