//! The debug listener: `/`, `/rlconfig`, `/stats`, `/debug/pprof/`.
//!
//! `/stats` is streamed a few hundred statistics at a time, so a scrape holds no more
//! than one chunk of text however many statistics there are.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};

use crate::backend::Backend;
use crate::service::Service;

const PATHS: [(&str, &str); 4] = [
    ("/debug/pprof/", "what profiling this server offers"),
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out every statistic and its value"),
    ("/", "this list"),
];

/// Statistics rendered into one chunk of the `/stats` body.
const LINES_PER_CHUNK: usize = 1024;

/// A debug response body: whole, or streamed.
pub type Body = BoxBody<Bytes, Infallible>;

/// The debug routes as a service for [`crate::serve::serve`].
#[derive(Clone, Debug)]
pub struct Debug(pub Arc<Service>);

impl hyper::service::Service<Request<Incoming>> for Debug {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        std::future::ready(Ok(route(&self.0, request.uri().path())))
    }
}

fn route(service: &Service, path: &str) -> Response<Body> {
    // `/stats/` is `/stats`, as the routes always answered.
    let path = match path.strip_suffix('/') {
        Some(trimmed) if !trimmed.is_empty() && trimmed != "/debug/pprof" => trimmed,
        _ => path,
    };
    match path {
        "/" => {
            let mut out = String::new();
            for (path, help) in PATHS {
                let _ = writeln!(out, "{path}: {help}");
            }
            text(StatusCode::OK, out)
        }
        "/rlconfig" => text(StatusCode::OK, service.limiter.describe()),
        "/stats" => stats(service),
        _ if path == "/debug/pprof" || path.starts_with("/debug/pprof/") => text(
            StatusCode::OK,
            "No profiles are built into this server. For a CPU profile in pprof-compatible form, run\n\
             `perf record -g -p <pid>` on the host and convert it with `pprof -raw` or open it with\n\
             `perf report`; memory in use by counters is in /stats (ratelimit.memory.*).\n"
                .to_owned(),
        ),
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n".to_owned()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Every statistic, one `name: value` line each: the registry's, sorted, then the
/// service's own gauges and timers.
fn stats(service: &Service) -> Response<Body> {
    let mut lines = service.limiter.stats().lines().into_iter();
    let mut gauges = Some(gauges(service));
    let chunks = std::iter::from_fn(move || {
        let mut out = String::new();
        lines
            .by_ref()
            .take(LINES_PER_CHUNK)
            .for_each(|line| line.write(&mut out));
        if out.is_empty() {
            out = gauges.take()?;
        }
        Some(Ok::<_, Infallible>(Frame::data(Bytes::from(out))))
    });
    let body = StreamBody::new(futures_util::stream::iter(chunks));
    let mut response = text(StatusCode::OK, String::new());
    *response.body_mut() = BodyExt::boxed(body);
    response
}

/// The lines that are not in the statistics registry.
fn gauges(service: &Service) -> String {
    let mut out = String::new();
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
        Backend::Remote(_) => {}
    }
    out
}
