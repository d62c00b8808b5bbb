//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, framed here.
//!
//! [`connections`](crate::ingress::connections) hands this method's calls straight
//! here, past tonic's router. A request is one length-prefixed protobuf message and an
//! answer is one message and `grpc-status: 0`, so reading the body once and answering
//! with a finished body skips the streaming codec that a unary call does not need.
//! A call is one future, [`ShouldRateLimitCall`]: it reads the first message
//! ([`read`]), decodes it into the core's request (reusing a recycled one), hands it to
//! the [`Decider`] and frames its answer. The memory store answers at once, so that
//! future completes on the poll that read the message.
//!
//! It answers a body that is not a `RateLimitRequest` with `INVALID_ARGUMENT` (the
//! generated prost codec says `INTERNAL`, which reads as the server's fault), and other
//! malformed calls as tonic's own server does, with the same codes and messages, except
//! that a body ending inside a message is always `Unexpected EOF decoding stream.`:
//! tonic lets a lone length prefix, or a message cut short by trailers, pass.

pub(crate) mod headers;
mod read;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::Either;
use hyper::body::{Frame, Incoming};
use tonic::Status;
use tonic::codegen::http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use tonic::codegen::{Body, http};

use ratelimit_core::Request;
use ratelimit_proto::envoy::InvalidRequest;
use ratelimit_proto::wire::RequestError;

use crate::backend::BackendError;
use crate::decider::{
    Call, Decided, Decider, Decision, DecisionError, Transport, Waiting, buffers,
};
use headers::{grpc_timeout, header};
use read::Reader;

/// The method's path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// A message's prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// The response to a call, which is never an error of hyper's.
pub type Responded = Result<http::Response<ResponseBody>, Infallible>;

/// A call's response body: the answer, or tonic's body of an error status.
pub type ResponseBody = Either<AnswerBody, tonic::body::Body>;

/// Starts answering one `ShouldRateLimit` call: refused at once when its headers are not
/// those of a gRPC call, else read, decided and answered by the caller's deadline.
pub fn call(decider: Arc<Decider>, request: http::Request<Incoming>) -> ShouldRateLimitCall {
    let (stage, deadline) = match check_call(&request) {
        Ok(deadline) => {
            let (parts, body) = request.into_parts();
            // The headers are kept only for a trace span's parent.
            let headers = decider.traces.is_some().then(|| Box::new(parts.headers));
            let reading = Stage::Reading {
                body,
                reader: Reader::default(),
                headers,
            };
            (reading, deadline)
        }
        Err(refusal) => (Stage::Refused(Some(refusal)), None),
    };
    ShouldRateLimitCall {
        decider,
        deadline: deadline.map(|timeout| (Instant::now(), timeout)),
        stage,
        timer: None,
    }
}

/// One `ShouldRateLimit` call, answered by its caller's deadline (`grpc-timeout`), as
/// grpc-go answers one: once it has passed, `DEADLINE_EXCEEDED`, and the call is dropped
/// with what it holds. The timer is made only when the call has to wait, and only for a
/// call with a deadline.
pub struct ShouldRateLimitCall {
    decider: Arc<Decider>,
    /// When the call was asked, and the time its caller gives it.
    deadline: Option<(Instant, Duration)>,
    stage: Stage,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// Where a call is.
enum Stage {
    /// Refused on its headers: the refusal, taken by the first poll.
    Refused(Option<Refusal>),
    /// Reading its first message (and keeping its headers when tracing).
    Reading {
        body: Incoming,
        reader: Reader,
        headers: Option<Box<HeaderMap>>,
    },
    /// Waiting for its decision from a remote store.
    Deciding(Waiting),
}

impl Future for ShouldRateLimitCall {
    type Output = Responded;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Responded> {
        let this = self.get_mut();
        if let Poll::Ready(response) = this.advance(cx) {
            return Poll::Ready(Ok(response));
        }
        let Some((asked, timeout)) = this.deadline else {
            return Poll::Pending;
        };
        let timer = (this.timer)
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until((asked + timeout).into())));
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Ok(refused(Status::deadline_exceeded(format!(
            "the caller's grpc-timeout ({timeout:?}) passed before the call was answered"
        )))))
    }
}

impl ShouldRateLimitCall {
    /// Moves the call on as far as it can go: its response once it has one.
    fn advance(&mut self, cx: &mut Context<'_>) -> Poll<http::Response<ResponseBody>> {
        loop {
            match &mut self.stage {
                Stage::Refused(refusal) => {
                    return Poll::Ready(*refusal.take().expect("polled once"));
                }
                Stage::Reading {
                    body,
                    reader,
                    headers,
                } => {
                    let read = ready!(reader.poll_read(Pin::new(body), cx));
                    let request = match read.and_then(|message| to_core(&message, &self.decider)) {
                        Ok(request) => request,
                        Err(status) => return Poll::Ready(refused(status)),
                    };
                    let span = (headers.take())
                        .and_then(|headers| self.decider.span(Transport::Grpc, &headers, &request));
                    let deadline = self.deadline.map(|(_, timeout)| timeout);
                    let call = Call {
                        request,
                        transport: Transport::Grpc,
                        deadline,
                        span,
                    };
                    match self.decider.decide(call) {
                        Decision::Ready(decided) => {
                            return Poll::Ready(answered(frame_decided(&self.decider, decided)));
                        }
                        Decision::Waiting(waiting) => self.stage = Stage::Deciding(waiting),
                    }
                }
                Stage::Deciding(waiting) => {
                    let decided = ready!(waiting.as_mut().poll(cx));
                    return Poll::Ready(answered(frame_decided(&self.decider, decided)));
                }
            }
        }
    }
}

/// The answer's message of a decision, framed, or the call's error status.
fn frame_decided(
    decider: &Decider,
    decided: Result<Decided, DecisionError>,
) -> Result<Bytes, Status> {
    let decided = decided.map_err(|error| status(&error))?;
    let framed = frame(|buf| decider.encode(&decided, buf));
    buffers::recycle_request(decided.into_request());
    framed
}

/// The response to a call: its answer, or its error status.
fn answered(result: Result<Bytes, Status>) -> http::Response<ResponseBody> {
    match result {
        Ok(message) => answer(message).map(Either::Left),
        Err(status) => refused(status),
    }
}

fn refused(status: Status) -> http::Response<ResponseBody> {
    status.into_http().map(Either::Right)
}

/// A message as the core's request, or the reason the core cannot take it (which the
/// decider counts as it counts every request error).
fn to_core(message: &[u8], decider: &Decider) -> Result<Result<Request, InvalidRequest>, Status> {
    match buffers::decode(message, &decider.limiter.settings().bounds) {
        Ok(request) => Ok(Ok(request)),
        Err(RequestError::Invalid(invalid)) => Ok(Err(invalid)),
        Err(RequestError::Decode(error)) => Err(not_a_request(error)),
    }
}

fn not_a_request(error: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("the body is not a RateLimitRequest: {error}"))
}

/// The call's deadline, once its headers are those of a gRPC call grpc-go would take:
/// `POST`, a gRPC `content-type`, a well-formed `grpc-timeout`, and no compression.
/// Otherwise the status grpc-go answers it with (in an HTTP status of its own where
/// grpc-go sends one), which ends this call and no other on the connection.
fn check_call(request: &http::Request<Incoming>) -> Result<Option<Duration>, Refusal> {
    let headers = request.headers();
    let content_type = header(headers, &CONTENT_TYPE).map(HeaderValue::as_bytes);
    if !content_type.is_some_and(is_grpc) {
        let shown = String::from_utf8_lossy(content_type.unwrap_or_default());
        let message = format!("invalid gRPC request content-type \"{shown}\"");
        let status = Status::invalid_argument(message);
        return Err(with_http_status(
            status,
            http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ));
    }
    let deadline = grpc_timeout(headers).map_err(|malformed| {
        with_http_status(Status::internal(malformed), http::StatusCode::BAD_REQUEST)
    })?;
    if request.method() != http::Method::POST {
        let method = request.method().as_str();
        let message =
            format!("Received a HEADERS frame with :method {method:?} which should be POST");
        let status = Status::internal(message);
        return Err(with_http_status(
            status,
            http::StatusCode::METHOD_NOT_ALLOWED,
        ));
    }
    refuse_compressed(headers).map_err(|status| Box::new(refused(status)))?;
    Ok(deadline)
}

/// `application/grpc`, alone or with a subtype (`+proto`) or parameters (`;`).
fn is_grpc(content_type: &[u8]) -> bool {
    content_type
        .strip_prefix(b"application/grpc")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"+") || rest.starts_with(b";"))
}

/// A call refused before it is read.
type Refusal = Box<http::Response<ResponseBody>>;

/// `status` in a response of HTTP status `code` (a trailers-only gRPC answer).
fn with_http_status(status: Status, code: http::StatusCode) -> Refusal {
    let mut response = refused(status);
    *response.status_mut() = code;
    Box::new(response)
}

/// No compression is enabled, so a request that says it is compressed is refused as
/// tonic refuses it.
fn refuse_compressed(headers: &HeaderMap) -> Result<(), Status> {
    // A name made once: looking a `&str` up parses and classifies it on every call.
    static GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
    match header(headers, &GRPC_ENCODING).map(HeaderValue::as_bytes) {
        None | Some(b"identity") => Ok(()),
        Some(other) => {
            let other = match std::str::from_utf8(other) {
                Ok(name) => name.to_owned(),
                Err(_) => format!("{other:?}"),
            };
            let mut status = Status::unimplemented(format!(
                "Content is compressed with `{other}` which isn't supported"
            ));
            status.metadata_mut().insert(
                "grpc-accept-encoding",
                tonic::metadata::MetadataValue::from_static("identity"),
            );
            Err(status)
        }
    }
}

/// The message `write` appends, behind its prefix (uncompressed, its length).
fn frame(write: impl FnOnce(&mut BytesMut)) -> Result<Bytes, Status> {
    let mut message = BytesMut::with_capacity(128);
    message.put_bytes(0, PREFIX);
    write(&mut message);
    let len = message.len() - PREFIX;
    let prefix = u32::try_from(len)
        .map_err(|_| Status::resource_exhausted(format!("a response of {len} bytes")))?;
    message[1..PREFIX].copy_from_slice(&prefix.to_be_bytes());
    Ok(message.freeze())
}

/// The answer to a call: `message` (framed), then `grpc-status: 0`.
fn answer(message: Bytes) -> http::Response<AnswerBody> {
    let body = AnswerBody {
        message: Some(message),
        trailers_due: true,
    };
    let mut answer = http::Response::new(body);
    *answer.version_mut() = http::Version::HTTP_2;
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    answer
}

/// The body of an answer: the framed message, then `grpc-status: 0` (what tonic's
/// encoder sends after one message), with no size announced, as tonic announces none.
pub struct AnswerBody {
    message: Option<Bytes>,
    trailers_due: bool,
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if std::mem::take(&mut self.trailers_due) {
            let mut trailers = HeaderMap::with_capacity(1);
            // A name made once: a `&str` would be parsed on every answer.
            static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
            trailers.insert(&GRPC_STATUS, HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && !self.trailers_due
    }
}

/// envoyproxy/ratelimit answers its own request errors with `UNKNOWN` and the message;
/// an override with an unknown unit (which crashes upstream) or a request past the bounds
/// (which upstream does not check) is `INVALID_ARGUMENT`, and a
/// failing counter store `UNAVAILABLE` (upstream says `UNKNOWN`), so callers may retry.
fn status(error: &DecisionError) -> Status {
    match error {
        DecisionError::Invalid(e) => Status::invalid_argument(e.to_string()),
        DecisionError::Request(e) if e.is_invalid_argument() => {
            Status::invalid_argument(e.to_string())
        }
        DecisionError::Request(e) => Status::unknown(e.to_string()),
        DecisionError::Backend(e @ BackendError::Key(_)) => Status::invalid_argument(e.to_string()),
        DecisionError::Backend(e @ BackendError::CallerDeadline(_)) => {
            Status::deadline_exceeded(e.to_string())
        }
        DecisionError::Backend(e) => Status::unavailable(e.to_string()),
        DecisionError::Overloaded(e) => Status::resource_exhausted(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    use http_body_util::BodyExt;
    use prost::Message;
    use tonic::Code;

    use super::*;

    pub(super) fn request(domain: &str) -> RateLimitRequest {
        RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".into(),
                    value: "alice".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 3,
        }
    }

    pub(super) fn framed(message: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&(message.len() as u32).to_be_bytes());
        bytes.extend_from_slice(message);
        bytes
    }

    #[test]
    fn a_compressed_request_is_unimplemented_and_says_what_is_accepted() {
        let mut headers = HeaderMap::new();
        assert!(refuse_compressed(&headers).is_ok());
        headers.insert("grpc-encoding", HeaderValue::from_static("identity"));
        assert!(refuse_compressed(&headers).is_ok());
        headers.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        let error = refuse_compressed(&headers).unwrap_err();
        assert_eq!(error.code(), Code::Unimplemented);
        assert!(error.message().contains("`gzip`"), "{error:?}");
        assert_eq!(
            error.metadata().get("grpc-accept-encoding").unwrap(),
            "identity"
        );
    }

    #[tokio::test]
    async fn an_answer_is_one_framed_message_then_status_ok() {
        let response = RateLimitResponse {
            overall_code: 2,
            ..RateLimitResponse::default()
        };
        let answer = answer(frame(|buf| response.encode_raw(buf)).unwrap());
        assert_eq!(answer.headers()[CONTENT_TYPE], "application/grpc");
        // An exact size would make hyper send `content-length`, which tonic never sends.
        assert_eq!(answer.body().size_hint().exact(), None);
        let collected = answer.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
        let bytes = collected.to_bytes();
        assert_eq!(&bytes[..], &framed(&response.encode_to_vec())[..]);
    }
}
