//! The HTTP listener: `/json` and `/healthcheck`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use warp::http::{HeaderMap, StatusCode};
use warp::reply::{Reply, Response, with_header, with_status};
use warp::{Filter, Rejection};

use crate::backend::BackendError;
use crate::service::{Service, ServiceError};
use ratelimit_proto::json::{parse_request, render_response};

/// `/json` (any method) and `/healthcheck` (any method); everything else is 404.
pub fn routes(
    service: Arc<Service>,
    max_body: u64,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let with_service = warp::any().map(move || Arc::clone(&service));
    let json = warp::path!("json")
        .and(warp::body::content_length_limit(max_body))
        .and(warp::body::bytes())
        .and(warp::header::headers_cloned())
        .and(with_service.clone())
        .then(
            |body: Bytes, headers: HeaderMap, service: Arc<Service>| async move {
                json(&service, &body, &headers).await
            },
        );
    let health = warp::path!("healthcheck")
        .and(with_service)
        .map(|service: Arc<Service>| healthcheck(&service));
    json.or(health).unify().recover(rejection).unify()
}

async fn json(service: &Service, body: &[u8], headers: &HeaderMap) -> Response {
    let request = match parse_request(body) {
        Ok(request) => request,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("Bad Request: {e}\n")),
    };
    match service.should_rate_limit_json(request, headers).await {
        Ok(response) => {
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
        Err(ServiceError::Backend(e @ BackendError::Key(_))) => {
            text(StatusCode::BAD_REQUEST, format!("Bad Request: {e}\n"))
        }
        Err(ServiceError::Backend(e)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Server Error: {e}\n"),
        ),
        Err(ServiceError::Overloaded(e)) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Service Unavailable: {e}\n"),
        ),
        Err(e) => text(StatusCode::BAD_REQUEST, format!("Bad Request: {e}\n")),
    }
}

fn healthcheck(service: &Service) -> Response {
    match service.health.failing() {
        None => text(StatusCode::OK, "OK".to_owned()),
        Some(component) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unhealthy: {component}\n"),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response {
    with_status(
        with_header(body, "content-type", "text/plain; charset=utf-8"),
        status,
    )
    .into_response()
}

async fn rejection(rejection: Rejection) -> Result<Response, Infallible> {
    Ok(if rejection.is_not_found() {
        text(StatusCode::NOT_FOUND, "404 page not found\n".to_owned())
    } else if rejection.find::<warp::reject::PayloadTooLarge>().is_some() {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Payload Too Large: the body exceeds MAX_JSON_BODY_BYTES\n".to_owned(),
        )
    } else if rejection.find::<warp::reject::LengthRequired>().is_some() {
        text(
            StatusCode::LENGTH_REQUIRED,
            "Length Required: send a Content-Length header\n".to_owned(),
        )
    } else {
        text(
            StatusCode::BAD_REQUEST,
            format!("Bad Request: {rejection:?}\n"),
        )
    })
}
