//! A drop-in replacement for envoyproxy/ratelimit: Envoy's RLS v3 over gRPC, the HTTP
//! `/json` facade, health, a debug server and hot-reloaded rules, deciding with
//! [`ratelimit_core`].
//!
//! The folders are the seams: [`ingress`] is where requests come in (gRPC framing,
//! `/json`, the unix socket, the listeners, TLS), [`runtime`] the workers every part
//! runs on (one single-threaded runtime per core), [`rules`] where
//! rules come from (files, xDS), [`service`] the decision service and its outage
//! handling, [`backend`] where counters live, [`rlqs`] Envoy's quota service,
//! [`observe`] what the service tells about itself (statistics sinks, traces, health,
//! the debug server, the dashboard, explanations) and [`settings`] every setting.
//! [`runner`] starts them in order. What the sidecar shares with the workspace's other
//! services (the HTTP serve loop, TLS, the watcher, logging) is in
//! `ratelimit_service_kit`.

pub mod backend;
pub(crate) mod decider;
pub mod ingress;
pub(crate) mod observe;
pub(crate) mod rlqs;
pub mod rules;
pub mod runner;
pub mod runtime;
pub mod settings;
