//! The HTTP API: `POST /operations`, `GET /health` (and `/health/live`, `/health/ready`)
//! and `GET /metrics`, every answer but the metrics a JSON body (shaped in
//! [`crate::answer`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::{Buf, Bytes};
use futures_util::Stream;
use ratelimit_core::Retry;
use ratelimit_service_kit::serve::{Peer, PeerCertificate};
use warp::Filter;
use warp::http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use warp::http::{HeaderMap, HeaderValue, Method, Response};

use crate::answer::{
    self, ACCEPTED, Accepted, Failure, Kind, MAX_LISTED_PROBLEMS, Reply, add_limit_headers,
    json_type,
};
pub use crate::app::App;
use crate::auth::{self, Caller, Client, Scopes};
use crate::batch::{self, Batch, Rejection};
use crate::health;
use crate::idempotency::{self, Claim, Pending};
use crate::kafka::{Ack, MessageMeta, ProduceError, Unsettled};
use crate::limits::{LimitHeaders, Verdict};
use crate::problem::{self, Style};
use crate::request::{self, client_header, peer_id, read_body};
pub use crate::request::{client_id, idempotency_key, is_json};

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
            move |method,
                  path: warp::path::FullPath,
                  headers: HeaderMap,
                  peer,
                  certificate,
                  body| {
                let app = app.clone();
                let style = Style::of(&headers);
                async move {
                    // The work runs to its end even if the client goes away, so an
                    // acknowledged batch is always remembered for its idempotency key.
                    let task = tokio::spawn(async move {
                        let connection = Connection { peer, certificate };
                        let answer =
                            route(&app, &method, path.as_str(), &headers, connection, body).await;
                        answer.unwrap_or_else(|refusal| problem::render(refusal, style))
                    });
                    task.await.unwrap_or_else(|error| {
                        tracing::error!(%error, "request handler failed");
                        problem::render(Failure::new(Kind::Internal, "internal error"), style)
                    })
                }
            },
        )
        // Only a body taken twice rejects, which the filter above never does.
        .recover(|rejection: warp::Rejection| async move {
            tracing::error!(?rejection, "request rejected by the HTTP layer");
            Ok::<_, Infallible>(Failure::new(Kind::Internal, "internal error").into_reply())
        })
        .unify()
}

/// The answer to one request, or its refusal.
async fn route<S, B>(
    app: &App,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    connection: Connection,
    body: S,
) -> Result<Reply, Failure>
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    match path {
        "/operations" if method == Method::POST => {
            let answer = post_operations(app, headers, connection, body).await;
            app.metrics.answered(
                answer
                    .as_ref()
                    .map_or_else(|f| f.kind().status(), Reply::status),
            );
            answer
        }
        "/health" if method == Method::GET => Ok(health::health(app)),
        "/health/live" if method == Method::GET => Ok(health::live()),
        "/health/ready" if method == Method::GET => Ok(health::ready(app).await),
        "/metrics" if method == Method::GET => Ok(metrics(app)),
        "/operations" => Err(not_allowed("POST")),
        "/health" | "/health/live" | "/health/ready" | "/metrics" => Err(not_allowed("GET")),
        _ => Err(Failure::new(
            Kind::NotFound,
            "no such route; the routes are POST /operations, GET /health, GET /health/live, GET /health/ready and GET /metrics",
        )),
    }
}

fn metrics(app: &App) -> Reply {
    let mut reply = Response::new(Bytes::from(app.metrics.render(app.limits.stats())));
    reply.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    reply
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
) -> Result<Reply, Failure>
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    let received = SystemTime::now();
    let caller = app.auth.caller(headers, connection.certificate.as_ref());
    if let Caller::Refused(refusal) = caller {
        return Err(Failure::new(Kind::Unauthenticated, refusal.message())
            .with_header(WWW_AUTHENTICATE, refusal.challenge()));
    }
    if !is_json(headers) {
        return Err(Failure::new(
            Kind::UnsupportedMediaType,
            "Content-Type must be application/json",
        ));
    }
    let body = read_body(headers, body, app.max_body_bytes).await?;
    let Valid { client, key, batch } = validate(app, headers, caller, connection.peer, &body)?;
    if let Some(kind) = auth::forbidden(client.scopes, &batch) {
        return Err(Failure::new(
            Kind::Forbidden,
            format!(
                "client `{}` may not send {kind} operations (its scopes: {}); nothing was recorded",
                client.id,
                client.scopes.describe()
            ),
        ));
    }
    let id = key
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let message_key = idempotency::scoped(&client.id, &id);
    let (mut pending, earlier) = match claim(app, key.is_some(), &message_key, &body).await? {
        Claimed::Replay(reply) => return Ok(reply),
        Claimed::Held(pending, earlier) => (pending, earlier),
    };
    let batch_id = BatchId {
        id: &id,
        key: &message_key,
        client_id: &client.id,
    };
    let sending = Sending {
        body: &body,
        batch: &batch,
        id: batch_id,
        received,
    };
    let (answer, unsettled) = match earlier {
        _ if batch.count == 0 => (Ok(answer::nothing_to_do()), None),
        Some(note) => retry_unsure(app, &note, sending, pending.as_mut()).await,
        None => limit_and_produce(app, sending, pending.as_mut()).await,
    };
    // An unfinished claim is released when dropped, so a refused batch can be retried.
    match (pending, &answer, unsettled) {
        (Some(pending), Ok(reply), _) => pending.finish(reply.body().clone()).await,
        (Some(pending), Err(_), Some(unsettled)) => pending.unsure(unsettled.note()).await,
        // The 503 gives the id to retry with as Idempotency-Key: that retry must look too.
        (None, Err(_), Some(unsettled)) => {
            if let Ok(Claim::New(pending)) = app.idempotency.claim(&message_key, &body).await {
                pending.unsure(unsettled.note()).await;
            }
        }
        _ => {}
    }
    answer
}

/// A request that passed validation: who sent it, its idempotency key and its batch.
struct Valid {
    client: Client,
    key: Option<String>,
    batch: Batch,
}

/// Checks the headers and the body, reporting every problem of both together (400).
fn validate(
    app: &App,
    headers: &HeaderMap,
    caller: Caller,
    peer: Option<SocketAddr>,
    body: &[u8],
) -> Result<Valid, Failure> {
    let mut problems = Vec::new();
    // A malformed X-Client-Id is refused even when a key names the client instead.
    let named = client_header(headers).map_err(|p| problems.push(p));
    let client = match (caller, named) {
        (Caller::Client(client), _) => Some(client),
        (_, Ok(named)) => Some(Client {
            id: named.map_or_else(|| peer_id(peer), str::to_owned).into(),
            scopes: Scopes::ALL,
        }),
        (_, Err(())) => None,
    };
    let key = idempotency_key(headers)
        .map_err(|p| problems.push(p))
        .ok()
        .flatten();
    let parsed = if request::is_empty_array(body) {
        Ok(Batch::default())
    } else {
        batch::parse_capped(body, app.max_operations, &app.rules, MAX_LISTED_PROBLEMS)
    };
    let mut omitted = 0;
    let batch = match parsed {
        Ok(batch) => Some(batch),
        Err((Rejection::Invalid(found), more)) => {
            problems.extend(found);
            omitted = more;
            None
        }
        Err((Rejection::TooMany { count, max }, _)) => {
            return Err(Failure::new(
                Kind::TooLarge,
                format!("{count} operations in one request; MAX_OPERATIONS is {max}"),
            ));
        }
    };
    match (batch, client, problems.is_empty()) {
        (Some(batch), Some(client), true) => Ok(Valid { client, key, batch }),
        _ => {
            let malformed = request::is_malformed_json(body);
            Err(Failure::invalid(problems, malformed).with_omitted(omitted))
        }
    }
}

/// What the idempotency store said about a request.
enum Claimed<'a> {
    /// Go on, holding the key if there is one; with the note of an earlier attempt that
    /// was not acknowledged, if there was one.
    Held(Option<Pending<'a>>, Option<String>),
    /// The remembered answer.
    Replay(Reply),
}

/// Claims the request's key, when it has one (`keyed`), in the idempotency store.
async fn claim<'a>(
    app: &'a App,
    keyed: bool,
    message_key: &str,
    body: &[u8],
) -> Result<Claimed<'a>, Failure> {
    if !keyed {
        return Ok(Claimed::Held(None, None));
    }
    match app.idempotency.claim(message_key, body).await {
        Ok(Claim::New(pending)) => Ok(Claimed::Held(Some(pending), None)),
        Ok(Claim::Unsure(pending, note)) => Ok(Claimed::Held(Some(pending), Some(note))),
        Ok(Claim::Replay(answer)) => {
            app.metrics.idempotent_replays.add(1);
            // Only acceptances are remembered: the replay has the first answer's status.
            let mut reply = Response::new(answer);
            *reply.status_mut() = ACCEPTED;
            reply.headers_mut().insert(CONTENT_TYPE, json_type());
            reply
                .headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(Claimed::Replay(reply))
        }
        Ok(Claim::InProgress) => Err(Failure::new(
            Kind::KeyInUse,
            "a request with this Idempotency-Key is still being processed; retry later",
        )),
        Ok(Claim::Mismatch) => Err(Failure::new(
            Kind::KeyReused,
            "this Idempotency-Key was used before with a different body; use a new key for a new batch",
        )),
        Err(error) => {
            tracing::warn!(%error, "the idempotency store failed");
            Err(Failure::new(
                Kind::Unavailable,
                format!("the idempotency store is unavailable ({error}); nothing was recorded"),
            ))
        }
    }
}

/// How a batch is named: its id, its message key, and its client.
#[derive(Clone, Copy)]
struct BatchId<'a> {
    id: &'a str,
    key: &'a str,
    client_id: &'a str,
}

/// A valid batch on its way to the topic: its body, its operations, its names and when
/// it arrived.
#[derive(Clone, Copy)]
struct Sending<'a> {
    body: &'a Bytes,
    batch: &'a Batch,
    id: BatchId<'a>,
    received: SystemTime,
}

/// An answer, and where its batch may be when it was sent but not acknowledged.
type Outcome = (Result<Reply, Failure>, Option<Unsettled>);

/// The answer to a retry whose earlier attempt was not acknowledged: once that attempt
/// can no longer reach the topic, from the topic if it is there, else from producing the
/// batch now.
async fn retry_unsure(
    app: &App,
    note: &str,
    sending: Sending<'_>,
    pending: Option<&mut Pending<'_>>,
) -> Outcome {
    let (batch, batch_id) = (sending.batch, sending.id);
    let Some(earlier) = Unsettled::from_note(note) else {
        tracing::error!(
            note,
            key = batch_id.key,
            "unreadable note of an unacknowledged batch"
        );
        return (
            Err(not_settled(batch_id.id, "its record is unreadable")),
            None,
        );
    };
    match app.kafka.look_for(&earlier, batch_id.key).await {
        Ok(Some(ack)) => {
            tracing::info!(
                id = batch_id.id,
                partition = ack.partition,
                offset = ack.offset,
                "an unacknowledged batch was on the topic; answered from there"
            );
            (Ok(accepted(batch_id.id, batch, ack)), None)
        }
        Ok(None) => limit_and_produce(app, sending, pending).await,
        Err(why) => (Err(not_settled(batch_id.id, &why)), None),
    }
}

/// The 503 for a retry whose earlier attempt could not be looked for yet.
fn not_settled(id: &str, why: &str) -> Failure {
    tracing::warn!(id, why, "an unacknowledged batch cannot be looked for yet");
    Failure::new(
        Kind::Unacknowledged,
        format!(
            "an earlier attempt with this Idempotency-Key was not acknowledged and cannot be looked for on the topic yet ({why}); it may or may not have been recorded. Retry with the header Idempotency-Key: {id}"
        ),
    )
    .with_id(id)
}

/// The 202 for batch `id`, acknowledged at `ack`.
fn accepted(id: &str, batch: &Batch, ack: Ack) -> Reply {
    answer::accepted(&Accepted {
        id,
        count: batch.count,
        partition: ack.partition,
        offset: ack.offset,
    })
}

/// The rate-limit check, then the message, for a valid batch: noted in its held
/// idempotency key (`pending`) before it is produced.
async fn limit_and_produce(
    app: &App,
    sending: Sending<'_>,
    pending: Option<&mut Pending<'_>>,
) -> Outcome {
    let (batch, id) = (sending.batch, sending.id.id);
    let limit_headers = match check_limits(app, sending.id, batch).await {
        Ok(headers) => headers,
        Err(refusal) => return (Err(refusal), None),
    };
    // The limits counted the batch: a refusal now still says where they stand.
    let attempt = app.kafka.attempt(sending.id.key);
    if let Some(pending) = pending
        && let Err(error) = pending.attempt(&attempt.note()).await
    {
        tracing::warn!(%error, id, "the idempotency store did not take the attempt");
        let refusal = Failure::new(
            Kind::Unavailable,
            format!("the idempotency store is unavailable ({error}); nothing was recorded"),
        );
        return (Err(refusal.with_limit_headers(limit_headers)), None);
    }
    let received_at = humantime::format_rfc3339_millis(sending.received).to_string();
    let meta = MessageMeta {
        key: sending.id.key,
        request_id: id,
        client_id: sending.id.client_id,
        received_at: &received_at,
    };
    let started = Instant::now();
    let produced = app
        .kafka
        .produce(sending.body, meta, attempt.partition)
        .await;
    let ack = match produced {
        Ok(ack) => ack,
        Err(error) => {
            let unsettled = match &error {
                ProduceError::Unacknowledged(_, unsettled) => Some(unsettled.clone()),
                _ => None,
            };
            let refusal = produce_failure(error, id).with_limit_headers(limit_headers);
            return (Err(refusal), unsettled);
        }
    };
    app.metrics.produced(started.elapsed(), batch.count);
    let mut reply = accepted(id, batch, ack);
    add_limit_headers(reply.headers_mut(), limit_headers);
    (Ok(reply), None)
}

/// A known outage of the broker, then the batch against the client's limits: the
/// limits' headers when it may go, else the refusal.
async fn check_limits(
    app: &App,
    batch_id: BatchId<'_>,
    batch: &Batch,
) -> Result<LimitHeaders, Failure> {
    // A known outage is answered before the batch counts against any limit.
    if let Err(error) = app.kafka.available() {
        return Err(Failure::new(Kind::Unavailable, error.to_string()));
    }
    match app
        .limits
        .check(batch_id.client_id, batch, &app.headers_format)
        .await
    {
        Verdict::Allow(headers) => Ok(headers),
        Verdict::Deny {
            headers,
            retry,
            violated,
        } => {
            app.metrics.limit_refusals.add(1);
            Err(over_limit(headers, retry, violated))
        }
        Verdict::Unavailable => Err(Failure::new(
            Kind::Unavailable,
            "the rate-limit service is unavailable; nothing was recorded",
        )),
    }
}

/// The 429 for a batch over the `violated` limits, with their headers.
fn over_limit(headers: LimitHeaders, retry: Retry, violated: Vec<String>) -> Failure {
    let text = match retry {
        Retry::After(_) => "rate limit exceeded; nothing was recorded",
        Retry::Never => {
            "the batch holds more operations than a limit allows in a whole window; split it. Nothing was recorded"
        }
    };
    let refusal = Failure::new(Kind::QuotaExceeded, text)
        .with_limit_headers(headers)
        .with_violated(violated);
    match retry {
        Retry::After(seconds) => refusal.with_header(RETRY_AFTER, seconds.into()),
        Retry::Never => refusal,
    }
}

/// The refusal for a batch `id` the broker did not acknowledge.
fn produce_failure(error: ProduceError, id: &str) -> Failure {
    let refusal = match error {
        ProduceError::TooLarge(_) => {
            Failure::new(Kind::TooLarge, format!("{error}; nothing was recorded"))
        }
        ProduceError::Unavailable(_) | ProduceError::QueueFull => {
            tracing::warn!(%error, id, "batch refused");
            Failure::new(Kind::Unavailable, error.to_string())
        }
        ProduceError::Unacknowledged(why, _) => {
            tracing::warn!(error = why, id, "batch not acknowledged");
            Failure::new(
                Kind::Unacknowledged,
                format!(
                    "the broker did not acknowledge the operations ({why}); they may or may not have been recorded. Retry with the header Idempotency-Key: {id}: the retry looks for them on the topic before producing them again"
                ),
            )
        }
    };
    refusal.with_id(id)
}

fn not_allowed(allow: &'static str) -> Failure {
    Failure::new(
        Kind::MethodNotAllowed,
        format!("this route takes {allow} only"),
    )
    .with_header(ALLOW, HeaderValue::from_static(allow))
}
