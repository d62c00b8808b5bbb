//! The HTTP API: `POST /operations` and `GET /health`, every answer a JSON body.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use ratelimit_core::{HeaderFormat, Retry};
use ratelimit_sidecar::serve::Peer;
use serde::Serialize;
use serde_json::json;
use warp::Filter;
use warp::http::Response;
use warp::http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use warp::http::{HeaderMap, HeaderValue, Method, StatusCode};

use crate::batch::{self, Batch, Problem, Rejection};
use crate::idempotency::{self, Claim};
use crate::kafka::{BrokerHealth, Kafka, MessageMeta, ProduceError};
use crate::limits::{LimitHeaders, Limits, Verdict};

/// The answer the original service gave for an accepted batch; clients match on it.
pub const ACCEPTED_MESSAGE: &str = "Operations processed successfully";

/// Everything a request needs.
pub struct App {
    /// Rate limits.
    pub limits: Limits,
    /// LIMIT_RESPONSE_HEADERS_FORMAT.
    pub headers_format: HeaderFormat,
    /// The producer.
    pub kafka: Arc<Kafka>,
    /// Remembered answers for `Idempotency-Key`.
    pub idempotency: idempotency::Store,
    /// `MAX_BODY_BYTES`.
    pub max_body_bytes: usize,
    /// `MAX_OPERATIONS`.
    pub max_operations: usize,
}

type Reply = Response<Bytes>;

/// The service as one warp filter.
pub fn routes(
    app: Arc<App>,
) -> impl Filter<Extract = (Reply,), Error = Infallible> + Clone + Send + Sync + 'static {
    warp::method()
        .and(warp::path::full())
        .and(warp::header::headers_cloned())
        .and(warp::ext::optional::<Peer>().map(|peer: Option<Peer>| peer.map(|Peer(addr)| addr)))
        .and(warp::body::stream())
        .then(
            move |method, path: warp::path::FullPath, headers, peer, body| {
                let app = app.clone();
                async move {
                    // The work runs to its end even if the client goes away, so an
                    // acknowledged batch is always remembered for its idempotency key.
                    let task = tokio::spawn(async move {
                        match path.as_str() {
                            "/operations" if method == Method::POST => {
                                post_operations(&app, &headers, peer, body).await
                            }
                            "/health" if method == Method::GET => health(&app),
                            "/operations" => not_allowed("POST"),
                            "/health" => not_allowed("GET"),
                            _ => message(
                                StatusCode::NOT_FOUND,
                                "no such route; the routes are POST /operations and GET /health",
                            ),
                        }
                    });
                    task.await.unwrap_or_else(|error| {
                        tracing::error!(%error, "request handler failed");
                        message(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
                    })
                }
            },
        )
        // Only a body taken twice rejects, which the filter above never does.
        .recover(|rejection: warp::Rejection| async move {
            tracing::error!(?rejection, "request rejected by the HTTP layer");
            Ok::<_, Infallible>(message(StatusCode::INTERNAL_SERVER_ERROR, "internal error"))
        })
        .unify()
}

fn health(app: &App) -> Reply {
    let kafka = app.kafka.health();
    #[derive(Serialize)]
    struct Health<'a> {
        status: &'static str,
        kafka: &'a BrokerHealth,
    }
    let (status, code) = if kafka.is_up() {
        ("UP", StatusCode::OK)
    } else {
        ("DOWN", StatusCode::SERVICE_UNAVAILABLE)
    };
    json_reply(
        code,
        &Health {
            status,
            kafka: &kafka,
        },
    )
}

/// The answer for an acknowledged batch; `message` comes first, as the original
/// service's answer did.
#[derive(Serialize)]
struct Accepted<'a> {
    message: &'static str,
    id: &'a str,
    count: u64,
    partition: i32,
    offset: i64,
}

async fn post_operations<S, B>(
    app: &App,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    body: S,
) -> Reply
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    let received = SystemTime::now();
    if !is_json(headers) {
        return message(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        );
    }
    let body = match read_body(headers, body, app.max_body_bytes).await {
        Ok(body) => body,
        Err(BodyError::TooLarge(text)) => return message(StatusCode::PAYLOAD_TOO_LARGE, &text),
        Err(BodyError::Unreadable(text)) => return invalid(&[Problem::body(text)]),
    };
    // Header and body problems are reported together.
    let mut problems = Vec::new();
    let client_id = client_id(headers, peer).map_err(|p| problems.push(p)).ok();
    let key = idempotency_key(headers)
        .map_err(|p| problems.push(p))
        .ok()
        .flatten();
    let batch = match batch::parse(&body, app.max_operations) {
        Ok(batch) => Some(batch),
        Err(Rejection::Invalid(found)) => {
            problems.extend(found);
            None
        }
        Err(Rejection::TooMany { count, max }) => {
            return message(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("{count} operations in one request; MAX_OPERATIONS is {max}"),
            );
        }
    };
    let (Some(batch), Some(client_id), true) = (batch, client_id, problems.is_empty()) else {
        return invalid(&problems);
    };
    let pending = match &key {
        None => None,
        Some(key) => match app.idempotency.claim(key, &body, Instant::now()) {
            Claim::New(pending) => Some(pending),
            Claim::Replay(answer) => {
                let mut reply = Response::new(answer);
                reply.headers_mut().insert(CONTENT_TYPE, json_type());
                reply
                    .headers_mut()
                    .insert("idempotent-replayed", HeaderValue::from_static("true"));
                return reply;
            }
            Claim::InProgress => {
                return message(
                    StatusCode::CONFLICT,
                    "a request with this Idempotency-Key is still being processed; retry later",
                );
            }
            Claim::Mismatch => {
                return message(
                    StatusCode::CONFLICT,
                    "this Idempotency-Key was used before with a different body; use a new key for a new batch",
                );
            }
        },
    };
    let reply = limit_and_produce(app, &body, &batch, &client_id, key.as_deref(), received).await;
    // An unfinished claim is released when dropped, so a refused batch can be retried.
    if let Some(pending) = pending
        && reply.status() == StatusCode::OK
    {
        pending.finish(reply.body().clone(), Instant::now());
    }
    reply
}

/// The `Idempotency-Key` header, if any.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    match headers.get("idempotency-key").map(HeaderValue::to_str) {
        None => Ok(None),
        Some(Ok(key)) if idempotency::valid_key(key) => Ok(Some(key.to_owned())),
        Some(_) => Err(Problem::header(
            "Idempotency-Key",
            format!(
                "must be 1 to {} visible ASCII characters",
                idempotency::MAX_KEY_LEN
            ),
        )),
    }
}

/// The rate-limit check, then the message, for a valid batch.
async fn limit_and_produce(
    app: &App,
    body: &Bytes,
    batch: &Batch,
    client_id: &str,
    key: Option<&str>,
    received: SystemTime,
) -> Reply {
    // A known outage is answered before the batch counts against any limit.
    if let Err(error) = app.kafka.available() {
        return message(StatusCode::SERVICE_UNAVAILABLE, &error.to_string());
    }
    let limit_headers = match app
        .limits
        .check(client_id, batch, &app.headers_format)
        .await
    {
        Verdict::Allow(headers) => headers,
        Verdict::Deny { headers, retry } => {
            let text = match retry {
                Retry::After(_) => "rate limit exceeded; nothing was recorded",
                Retry::Never => {
                    "the batch holds more operations than a limit allows in a whole window; split it. Nothing was recorded"
                }
            };
            let mut reply = message(StatusCode::TOO_MANY_REQUESTS, text);
            add_limit_headers(reply.headers_mut(), headers);
            if let Retry::After(seconds) = retry {
                reply.headers_mut().insert(RETRY_AFTER, seconds.into());
            }
            return reply;
        }
        Verdict::Unavailable => {
            return message(
                StatusCode::SERVICE_UNAVAILABLE,
                "the rate-limit service is unavailable; nothing was recorded",
            );
        }
    };
    let id = key.map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
    let received_at = humantime::format_rfc3339_millis(received).to_string();
    let meta = MessageMeta {
        request_id: &id,
        client_id,
        received_at: &received_at,
    };
    let mut reply = match app.kafka.produce(body, meta).await {
        Ok(ack) => json_reply(
            StatusCode::OK,
            &Accepted {
                message: ACCEPTED_MESSAGE,
                id: &id,
                count: batch.count,
                partition: ack.partition,
                offset: ack.offset,
            },
        ),
        Err(error @ ProduceError::TooLarge(_)) => json_reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            &json!({"message": format!("{error}; nothing was recorded"), "id": id}),
        ),
        Err(error @ (ProduceError::Unavailable(_) | ProduceError::QueueFull)) => {
            tracing::warn!(%error, id, "batch refused");
            json_reply(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"message": error.to_string(), "id": id}),
            )
        }
        Err(ProduceError::Unacknowledged(why)) => {
            tracing::warn!(error = why, id, "batch not acknowledged");
            json_reply(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({
                    "message": format!(
                        "the broker did not acknowledge the operations ({why}); they may or may not have been recorded. Retry with the header Idempotency-Key: {id}; the id is also the message key, so consumers can drop a duplicate"
                    ),
                    "id": id,
                }),
            )
        }
    };
    add_limit_headers(reply.headers_mut(), limit_headers);
    reply
}

/// Why a body was not read.
enum BodyError {
    /// Over the size limit: 413.
    TooLarge(String),
    /// The connection broke or the framing was bad: 400.
    Unreadable(String),
}

/// Reads the body, refusing more than `max` bytes (413) before reading them when the
/// length is announced.
async fn read_body<S, B>(headers: &HeaderMap, mut body: S, max: usize) -> Result<Bytes, BodyError>
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    let too_large = || {
        BodyError::TooLarge(format!(
            "the body is larger than MAX_BODY_BYTES ({max} bytes)"
        ))
    };
    let announced = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if announced.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let mut buffer = BytesMut::with_capacity(announced.unwrap_or(0));
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(|error| {
            BodyError::Unreadable(format!("the body could not be read: {error}"))
        })?;
        if buffer.len() + chunk.remaining() > max {
            return Err(too_large());
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            buffer.extend_from_slice(part);
            let n = part.len();
            chunk.advance(n);
        }
    }
    Ok(buffer.freeze())
}

pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// The `X-Client-Id` header, else the peer's IP address.
pub fn client_id(headers: &HeaderMap, peer: Option<SocketAddr>) -> Result<String, Problem> {
    match headers.get("x-client-id").map(HeaderValue::to_str) {
        Some(Ok(id))
            if (1..=255).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(id.to_owned())
        }
        Some(_) => Err(Problem::header(
            "X-Client-Id",
            "must be 1 to 255 visible ASCII characters",
        )),
        None => Ok(peer.map_or_else(|| "unknown".to_owned(), |p| p.ip().to_string())),
    }
}

fn add_limit_headers(headers: &mut HeaderMap, pairs: LimitHeaders) {
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) = (
            warp::http::HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value),
        ) {
            headers.insert(name, value);
        }
    }
}

fn invalid(problems: &[Problem]) -> Reply {
    #[derive(Serialize)]
    struct Body<'a> {
        message: &'static str,
        errors: &'a [Problem],
    }
    json_reply(
        StatusCode::BAD_REQUEST,
        &Body {
            message: "the operations are not valid; nothing was recorded",
            errors: problems,
        },
    )
}

fn not_allowed(allow: &'static str) -> Reply {
    let mut reply = message(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("this route takes {allow} only"),
    );
    reply
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    reply
}

fn message(status: StatusCode, text: &str) -> Reply {
    json_reply(status, &json!({ "message": text }))
}

fn json_reply(status: StatusCode, body: &impl Serialize) -> Reply {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut reply = Response::new(Bytes::from(bytes));
    *reply.status_mut() = status;
    reply.headers_mut().insert(CONTENT_TYPE, json_type());
    reply
}

fn json_type() -> HeaderValue {
    HeaderValue::from_static("application/json")
}
