//! The HTTP API: `POST /operations` and `GET /health`, every answer a JSON body.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use ratelimit_core::{HeaderFormat, Retry};
use ratelimit_sidecar::serve::{Peer, PeerCertificate};
use serde::Serialize;
use serde_json::json;
use warp::Filter;
use warp::http::Response;
use warp::http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use warp::http::{HeaderMap, HeaderValue, Method, StatusCode};

use crate::auth::keys::valid_client_id;
use crate::auth::{self, Auth, Caller, Client, Scopes};
use crate::batch::{self, Batch, Problem, Rejection};
use crate::files::{Followed, LastLoad};
use crate::idempotency::{self, Claim};
use crate::kafka::{BrokerHealth, Kafka, MessageMeta, ProduceError};
use crate::limits::{LimitHeaders, Limits, Verdict};
use crate::metrics::Metrics;

/// The answer the original service gave for an accepted batch; clients match on it.
pub const ACCEPTED_MESSAGE: &str = "Operations processed successfully";

/// Everything a request needs.
pub struct App {
    /// Who may send.
    pub auth: Arc<Auth>,
    /// Rate limits.
    pub limits: Arc<Limits>,
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
    /// Statistics.
    pub metrics: Metrics,
    /// The followed files, by the name `/health` gives them.
    pub files: Vec<(&'static str, Arc<Followed>)>,
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
        .and(warp::ext::optional::<PeerCertificate>())
        .and(warp::body::stream())
        .then(
            move |method, path: warp::path::FullPath, headers, peer, certificate, body| {
                let app = app.clone();
                async move {
                    // The work runs to its end even if the client goes away, so an
                    // acknowledged batch is always remembered for its idempotency key.
                    let task = tokio::spawn(async move {
                        match path.as_str() {
                            "/operations" if method == Method::POST => {
                                let connection = Connection { peer, certificate };
                                let reply =
                                    post_operations(&app, &headers, connection, body).await;
                                app.metrics.answered(reply.status());
                                reply
                            }
                            "/health" if method == Method::GET => health(&app),
                            "/metrics" if method == Method::GET => metrics(&app),
                            "/operations" => not_allowed("POST"),
                            "/health" | "/metrics" => not_allowed("GET"),
                            _ => message(
                                StatusCode::NOT_FOUND,
                                "no such route; the routes are POST /operations, GET /health and GET /metrics",
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
        /// The last load of each followed file.
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        files: BTreeMap<&'static str, LastLoad>,
    }
    let (status, code) = if kafka.is_up() {
        ("UP", StatusCode::OK)
    } else {
        ("DOWN", StatusCode::SERVICE_UNAVAILABLE)
    };
    let files = app
        .files
        .iter()
        .filter_map(|(name, file)| Some((*name, file.last()?)))
        .collect();
    json_reply(
        code,
        &Health {
            status,
            kafka: &kafka,
            files,
        },
    )
}

fn metrics(app: &App) -> Reply {
    let mut reply = Response::new(Bytes::from(app.metrics.render(app.limits.stats())));
    reply.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    reply
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

/// What the connection says about the client.
struct Connection {
    /// Its address.
    peer: Option<SocketAddr>,
    /// Its certificate, over mutual TLS.
    certificate: Option<PeerCertificate>,
}

async fn post_operations<S, B>(
    app: &App,
    headers: &HeaderMap,
    connection: Connection,
    body: S,
) -> Reply
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    let received = SystemTime::now();
    let caller = app.auth.caller(headers, connection.certificate.as_ref());
    if let Caller::Refused(refusal) = caller {
        let mut reply = message(StatusCode::UNAUTHORIZED, refusal.message());
        reply
            .headers_mut()
            .insert(WWW_AUTHENTICATE, refusal.challenge());
        return reply;
    }
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
    // A malformed X-Client-Id is refused even when a key names the client instead.
    let named = client_header(headers).map_err(|p| problems.push(p));
    let client = match (caller, named) {
        (Caller::Client(client), _) => Some(client),
        (_, Ok(named)) => Some(Client {
            id: named
                .map_or_else(|| peer_id(connection.peer), str::to_owned)
                .into(),
            scopes: Scopes::ALL,
        }),
        (_, Err(())) => None,
    };
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
    let (Some(batch), Some(client), true) = (batch, client, problems.is_empty()) else {
        return invalid(&problems);
    };
    if let Some(kind) = auth::forbidden(client.scopes, &batch) {
        return message(
            StatusCode::FORBIDDEN,
            &format!(
                "client `{}` may not send {kind} operations (its scopes: {}); nothing was recorded",
                client.id,
                client.scopes.describe()
            ),
        );
    }
    let id = key
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let message_key = idempotency::scoped(&client.id, &id);
    let pending = match &key {
        None => None,
        Some(_) => match app.idempotency.claim(&message_key, &body).await {
            Ok(Claim::New(pending)) => Some(pending),
            Ok(Claim::Replay(answer)) => {
                app.metrics.idempotent_replays.add(1);
                let mut reply = Response::new(answer);
                reply.headers_mut().insert(CONTENT_TYPE, json_type());
                reply
                    .headers_mut()
                    .insert("idempotent-replayed", HeaderValue::from_static("true"));
                return reply;
            }
            Ok(Claim::InProgress) => {
                return message(
                    StatusCode::CONFLICT,
                    "a request with this Idempotency-Key is still being processed; retry later",
                );
            }
            Ok(Claim::Mismatch) => {
                return message(
                    StatusCode::CONFLICT,
                    "this Idempotency-Key was used before with a different body; use a new key for a new batch",
                );
            }
            Err(error) => {
                tracing::warn!(%error, "the idempotency store failed");
                return message(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!(
                        "the idempotency store is unavailable ({error}); nothing was recorded"
                    ),
                );
            }
        },
    };
    let batch_id = BatchId {
        id: &id,
        key: &message_key,
        client_id: &client.id,
    };
    let reply = limit_and_produce(app, &body, &batch, batch_id, received).await;
    // An unfinished claim is released when dropped, so a refused batch can be retried.
    if let Some(pending) = pending
        && reply.status() == StatusCode::OK
    {
        pending.finish(reply.body().clone()).await;
    }
    reply
}

/// How a batch is named: its id, its message key, and its client.
#[derive(Clone, Copy)]
struct BatchId<'a> {
    id: &'a str,
    key: &'a str,
    client_id: &'a str,
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
    batch_id: BatchId<'_>,
    received: SystemTime,
) -> Reply {
    // A known outage is answered before the batch counts against any limit.
    if let Err(error) = app.kafka.available() {
        return message(StatusCode::SERVICE_UNAVAILABLE, &error.to_string());
    }
    let limit_headers = match app
        .limits
        .check(batch_id.client_id, batch, &app.headers_format)
        .await
    {
        Verdict::Allow(headers) => headers,
        Verdict::Deny { headers, retry } => {
            app.metrics.limit_refusals.add(1);
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
    let id = batch_id.id;
    let received_at = humantime::format_rfc3339_millis(received).to_string();
    let meta = MessageMeta {
        key: batch_id.key,
        request_id: id,
        client_id: batch_id.client_id,
        received_at: &received_at,
    };
    let started = Instant::now();
    let produced = app.kafka.produce(body, meta).await;
    if produced.is_ok() {
        app.metrics.produced(started.elapsed(), batch.count);
    }
    let mut reply = match produced {
        Ok(ack) => json_reply(
            StatusCode::OK,
            &Accepted {
                message: ACCEPTED_MESSAGE,
                id,
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
    Ok(client_header(headers)?.map_or_else(|| peer_id(peer), str::to_owned))
}

/// The `X-Client-Id` header, if any, checked.
fn client_header(headers: &HeaderMap) -> Result<Option<&str>, Problem> {
    match headers.get("x-client-id").map(HeaderValue::to_str) {
        Some(Ok(id)) if valid_client_id(id) => Ok(Some(id)),
        Some(_) => Err(Problem::header(
            "X-Client-Id",
            "must be 1 to 255 visible ASCII characters",
        )),
        None => Ok(None),
    }
}

/// A client named by its address.
fn peer_id(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "unknown".to_owned(), |p| p.ip().to_string())
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
