//! The HTTP listener: `/json` and `/healthcheck`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use futures_util::Stream;
use ratelimit_service_kit::body::{BodyError, read_bounded};
use warp::http::{HeaderMap, StatusCode};
use warp::path::FullPath;
use warp::reply::{Reply, Response, with_header, with_status};
use warp::{Filter, Rejection};

use crate::backend::BackendError;
use crate::decider::{Call, Decider, DecisionError, Transport};
use ratelimit_proto::envoy::request_from_pb;
use ratelimit_proto::json::{parse_request, render_response};

/// `/json` (any method) and `/healthcheck` (any method), each at exactly that path, as
/// upstream's router matches them (`/json/` is not `/json`); everything else is 404.
pub fn routes(
    service: Arc<Decider>,
    max_body: u64,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let with_service = warp::any().map(move || Arc::clone(&service));
    let json = exactly("/json")
        .and(warp::header::optional::<u64>("content-length"))
        .and(warp::body::stream())
        .and(warp::header::headers_cloned())
        .and(with_service.clone())
        .then(
            move |length: Option<u64>, body, headers: HeaderMap, service: Arc<Decider>| async move {
                match read_body(length, body, max_body).await {
                    Ok(body) => json(&service, &body, &headers).await,
                    Err(refused) => refused,
                }
            },
        );
    let health = exactly("/healthcheck")
        .and(with_service)
        .map(|service: Arc<Decider>| healthcheck(&service));
    json.or(health).unify().recover(rejection).unify()
}

/// Requests whose path is `path`, byte for byte.
fn exactly(path: &'static str) -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::path::full()
        .and_then(move |full: FullPath| async move {
            match full.as_str() == path {
                true => Ok(()),
                false => Err(warp::reject::not_found()),
            }
        })
        .untuple_one()
}

/// The whole body, with a `Content-Length` or chunked (as upstream reads any body), or
/// the answer when it is over `max` bytes or cannot be read.
async fn read_body<B: Buf>(
    length: Option<u64>,
    body: impl Stream<Item = Result<B, warp::Error>>,
    max: u64,
) -> Result<Bytes, Response> {
    read_bounded(length, body, max).await.map_err(|e| match e {
        BodyError::TooLarge => text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Payload Too Large: the body exceeds MAX_JSON_BODY_BYTES\n".to_owned(),
        ),
        BodyError::Read(e) => text(
            StatusCode::BAD_REQUEST,
            format!("Bad Request: reading the body: {e}\n"),
        ),
    })
}

async fn json(decider: &Arc<Decider>, body: &[u8], headers: &HeaderMap) -> Response {
    let request = match parse_request(body) {
        Ok(request) => request_from_pb(request),
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("Bad Request: {e}\n")),
    };
    let span = decider.span(Transport::Json, headers, &request);
    let call = Call {
        request,
        transport: Transport::Json,
        deadline: None,
        span,
    };
    match decider.decide(call).made().await {
        Ok(decided) => {
            let response = decider.answer(&decided);
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let body = with_header(
                render_response(&response),
                "content-type",
                "application/json",
            );
            with_status(body, status).into_response()
        }
        Err(DecisionError::Backend(e @ BackendError::Key(_))) => {
            text(StatusCode::BAD_REQUEST, format!("Bad Request: {e}\n"))
        }
        Err(DecisionError::Backend(e)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Server Error: {e}\n"),
        ),
        Err(DecisionError::Overloaded(e)) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Service Unavailable: {e}\n"),
        ),
        Err(e) => text(StatusCode::BAD_REQUEST, format!("Bad Request: {e}\n")),
    }
}

fn healthcheck(service: &Decider) -> Response {
    match service.health.failing() {
        None => text(StatusCode::OK, "OK".to_owned()),
        // Upstream's is a bare 500. The component is named in a header, which
        // clients reading the status alone ignore.
        Some(component) => {
            let bare = with_status(warp::reply(), StatusCode::INTERNAL_SERVER_ERROR);
            with_header(bare, "x-unhealthy", component).into_response()
        }
    }
}

/// A plain-text answer; an error also says `X-Content-Type-Options: nosniff`, as Go's
/// `http.Error` (upstream's error answers) does.
fn text(status: StatusCode, body: String) -> Response {
    let mut response = with_status(
        with_header(body, "content-type", "text/plain; charset=utf-8"),
        status,
    )
    .into_response();
    if !status.is_success() {
        let nosniff = warp::http::HeaderValue::from_static("nosniff");
        response
            .headers_mut()
            .insert("x-content-type-options", nosniff);
    }
    response
}

async fn rejection(rejection: Rejection) -> Result<Response, Infallible> {
    Ok(if rejection.is_not_found() {
        text(StatusCode::NOT_FOUND, "404 page not found\n".to_owned())
    } else {
        text(
            StatusCode::BAD_REQUEST,
            format!("Bad Request: {rejection:?}\n"),
        )
    })
}
