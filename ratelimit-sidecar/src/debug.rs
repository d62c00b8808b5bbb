//! The debug listener: `/`, `/rlconfig`, `/stats`, `/debug/pprof/`.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use warp::Filter;
use warp::http::StatusCode;
use warp::reply::{Reply, Response, with_status};

use crate::service::{Backend, Service};

const PATHS: [(&str, &str); 4] = [
    ("/debug/pprof/", "what profiling this server offers"),
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out every statistic and its value"),
    ("/", "this list"),
];

/// The debug routes.
pub fn routes(
    service: Arc<Service>,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let with_service = warp::any().map(move || Arc::clone(&service));
    let index = warp::path::end().map(|| {
        let mut out = String::new();
        for (path, help) in PATHS {
            let _ = writeln!(out, "{path}: {help}");
        }
        out.into_response()
    });
    let rlconfig = warp::path!("rlconfig")
        .and(with_service.clone())
        .map(|s: Arc<Service>| s.limiter.describe().into_response());
    let stats = warp::path!("stats")
        .and(with_service)
        .map(|s: Arc<Service>| stats(&s).into_response());
    let pprof = warp::path("debug").and(warp::path("pprof")).map(|| {
        "No profiles are built into this server. For a CPU profile in pprof-compatible form, run\n\
         `perf record -g -p <pid>` on the host and convert it with `pprof -raw` or open it with\n\
         `perf report`; memory in use by counters is in /stats (ratelimit.memory.*).\n"
            .into_response()
    });
    index
        .or(rlconfig)
        .unify()
        .or(stats)
        .unify()
        .or(pprof)
        .unify()
        .recover(|_| async {
            Ok::<_, Infallible>(
                with_status("404 page not found\n", StatusCode::NOT_FOUND).into_response(),
            )
        })
        .unify()
}

/// Every statistic, one `name: value` line each, sorted.
fn stats(service: &Service) -> String {
    let mut out = String::new();
    for (name, value) in service.limiter.stats().snapshot() {
        let _ = writeln!(out, "{name}: {value}");
    }
    let (count, total_us, max_us) = service.response_time.read();
    let _ = writeln!(
        out,
        "ratelimit_server.ShouldRateLimit.response_time.count: {count}"
    );
    let _ = writeln!(
        out,
        "ratelimit_server.ShouldRateLimit.response_time.total_us: {total_us}"
    );
    let _ = writeln!(
        out,
        "ratelimit_server.ShouldRateLimit.response_time.max_us: {max_us}"
    );
    if let Some(cache) = service.limiter.local_cache() {
        let (entries, bytes) = cache.usage();
        let _ = writeln!(out, "ratelimit.localcache.entryCount: {entries}");
        let _ = writeln!(out, "ratelimit.localcache.bytes: {bytes}");
    }
    match &service.backend {
        Backend::Memory(store) => {
            let usage = store.usage();
            let _ = writeln!(out, "ratelimit.memory.counters: {}", usage.counters);
            let _ = writeln!(out, "ratelimit.memory.bytes: {}", usage.bytes);
            let _ = writeln!(out, "ratelimit.memory.evictions: {}", usage.evictions);
        }
        Backend::Redis(_) => {}
    }
    out
}
