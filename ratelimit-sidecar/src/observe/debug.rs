//! The debug listener: `/` (the live dashboard for browsers, the list of paths for
//! others), `/rlconfig`, `/stats`, `POST /explain`, `/dashboard.json`, `/debug/pprof/`.
//!
//! `/stats` is streamed a few hundred statistics at a time, so a scrape holds no more
//! than one chunk of text however many statistics there are.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};

use ratelimit_core::stats::Snapshot;

use crate::decider::Decider;

/// The index, sorted by path as upstream's is.
const PATHS: [(&str, &str); 6] = [
    (
        "/",
        "this list; a browser (Accept: text/html) gets the live dashboard",
    ),
    (
        "/dashboard.json",
        "what the dashboard shows: health, the last load, rules, counters, the counters nearest their limits",
    ),
    ("/debug/pprof/", "what profiling this server offers"),
    (
        "/explain",
        "POST a request in the /json shape: which rule each descriptor meets, its counter, and the answer it would get, without counting it",
    ),
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out every statistic and its value"),
];

/// Statistics rendered into one chunk of the `/stats` body.
const LINES_PER_CHUNK: usize = 1024;

/// A debug response body: whole, or streamed.
pub type Body = BoxBody<Bytes, Infallible>;

/// The debug routes as a service for [`ratelimit_service_kit::serve::serve`]: the decision service, and
/// the largest `/explain` body (MAX_JSON_BODY_BYTES).
#[derive(Clone, Debug)]
pub struct Debug(pub Arc<Decider>, pub u64);

impl hyper::service::Service<Request<Incoming>> for Debug {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let (service, max_body) = (Arc::clone(&self.0), self.1);
        Box::pin(async move {
            if request.uri().path() == "/explain" {
                return Ok(explain(&service, request, max_body).await);
            }
            let browser = request
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|accept| accept.to_str().ok())
                .is_some_and(|accept| accept.contains("text/html"));
            if request.uri().path() == "/" && browser {
                return Ok(typed(HTML, crate::observe::dashboard::PAGE.to_owned()));
            }
            Ok(route(&service, request.uri().path()))
        })
    }
}

/// `POST /explain`: the body is read up to `max_body` bytes.
async fn explain(service: &Decider, request: Request<Incoming>, max_body: u64) -> Response<Body> {
    if request.method() != hyper::Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST a request in the /json shape to /explain\n".to_owned(),
        );
    }
    let limit = usize::try_from(max_body).unwrap_or(usize::MAX);
    let body = match Limited::new(request.into_body(), limit).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Payload Too Large: the body exceeds MAX_JSON_BODY_BYTES\n".to_owned(),
            );
        }
    };
    match crate::observe::explain::explain(service, &body).await {
        Ok(json) => typed(JSON, json),
        Err((status, message)) => text(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message,
        ),
    }
}

fn route(service: &Decider, path: &str) -> Response<Body> {
    // `/stats/` is `/stats`, as the routes always answered.
    let path = match path.strip_suffix('/') {
        Some(trimmed) if !trimmed.is_empty() && trimmed != "/debug/pprof" => trimmed,
        _ => path,
    };
    match path {
        "/rlconfig" => text(StatusCode::OK, service.limiter.describe()),
        "/stats" => stats(service),
        "/dashboard.json" => typed(JSON, crate::observe::dashboard::data(service)),
        _ if path == "/debug/pprof" || path.starts_with("/debug/pprof/") => text(
            StatusCode::OK,
            "No profiles are built into this server. For a CPU profile in pprof-compatible form, run\n\
             `perf record -g -p <pid>` on the host and convert it with `pprof -raw` or open it with\n\
             `perf report`; memory in use by counters is in /stats (ratelimit.memory.*).\n"
                .to_owned(),
        ),
        // Upstream's index answers every path no other route takes.
        _ => {
            let mut out = String::new();
            for (path, help) in PATHS {
                let _ = writeln!(out, "{path}: {help}");
            }
            text(StatusCode::OK, out)
        }
    }
}

const JSON: &str = "application/json";
const HTML: &str = "text/html; charset=utf-8";

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A 200 of `content_type`.
fn typed(content_type: &'static str, body: String) -> Response<Body> {
    let mut response = text(StatusCode::OK, body);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// Every statistic, one `name: value` line each (a timer's count, total and maximum in
/// microseconds), sorted by name.
fn stats(service: &Decider) -> Response<Body> {
    let snapshot = service.limiter.stats().snapshot();
    let mut chunks = snapshot.samples.into_iter().peekable();
    let body = std::iter::from_fn(move || {
        chunks.peek()?;
        let chunk: Vec<_> = chunks.by_ref().take(LINES_PER_CHUNK).collect();
        let mut out = String::new();
        Snapshot::write_text(&chunk, &mut out);
        Some(Ok::<_, Infallible>(Frame::data(Bytes::from(out))))
    });
    let body = StreamBody::new(futures_util::stream::iter(body));
    let mut response = text(StatusCode::OK, String::new());
    *response.body_mut() = BodyExt::boxed(body);
    response
}
