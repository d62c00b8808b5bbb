//! A drop-in replacement for envoyproxy/ratelimit: Envoy's RLS v3 over gRPC, the HTTP
//! `/json` facade, health, a debug server and hot-reloaded YAML rules, deciding with
//! [`ratelimit_core`].

pub mod backend;
pub mod bounds;
pub mod cli;
pub mod dashboard;
pub mod debug;
pub mod explain;
pub mod grpc;
pub mod health;
pub mod http;
pub mod json;
pub mod listeners;
pub mod metadata;
pub mod outage;
pub mod provider;
pub mod rlqs;
pub mod runner;
pub mod service;
pub mod settings;
pub mod sinks;
pub mod tls;
pub mod traces;
pub mod uds;
pub mod workers;
pub mod xds;

// The intake reaches these through the sidecar until it stands on the kit alone.
pub use ratelimit_service_kit::{logging, serve, watch};
