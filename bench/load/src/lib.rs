//! Load benchmark helpers: see `run.sh`, `instructions.sh` and `src/bin/`: the load generator (`rls-load`), the floor (`rls-floor`) and tonic's do-nothing server (`rls-tonic`).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The request the benchmark sends: domain `bench`, one descriptor `client=<value>`.
pub fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "client".into(),
                value: value.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// Exits through `exit` on SIGTERM, from a thread of its own, so that the handlers
/// registered for the end of the process run: a build instrumented for profile-guided
/// optimisation (`pgo.sh`) writes its profile there, and a process killed outright
/// would not.
pub fn exit_on_sigterm() -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let mut terminate = runtime.block_on(async {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    })?;
    std::thread::spawn(move || {
        runtime.block_on(terminate.recv());
        std::process::exit(0)
    });
    Ok(())
}
