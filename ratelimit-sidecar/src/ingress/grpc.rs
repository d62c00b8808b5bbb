//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, framed here.
//!
//! [`connections`](crate::ingress::connections) hands this method's calls straight
//! here, past tonic's router. A request is one length-prefixed protobuf message and an
//! answer is one message and `grpc-status: 0`, so reading the body once and answering
//! with a finished body skips the streaming codec that a unary call does not need.
//! It answers a body that is not a `RateLimitRequest` with `INVALID_ARGUMENT` (the
//! generated prost codec says `INTERNAL`, which reads as the server's fault), and other
//! malformed calls as tonic's own server does, with the same codes and messages, except
//! that a body ending inside a message is always `Unexpected EOF decoding stream.`:
//! tonic lets a lone length prefix, or a message cut short by trailers, pass.

use std::convert::Infallible;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::{BodyExt, Either};
use hyper::body::{Frame, Incoming};
use prost::Message;
use tonic::Status;
use tonic::codegen::http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use tonic::codegen::{Body, StdError, http};

use ratelimit_core::Request;
use ratelimit_proto::envoy::InvalidRequest;
use ratelimit_proto::wire::{self, RequestError};

use crate::backend::BackendError;
use crate::service::{Decided, Service as Decider, ServiceError};

/// The method's path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The largest request message, as tonic's default.
const MAX_MESSAGE: usize = 4 * 1024 * 1024;
/// A message's prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// The answer to one `ShouldRateLimit` call.
pub type Call = Pin<Box<dyn Future<Output = Result<http::Response<Reply>, Infallible>> + Send>>;

/// A call's body: the answer, or tonic's body of an error status.
pub type Reply = Either<Answer, tonic::body::Body>;

/// Answers one `ShouldRateLimit` call: the decision, or the call's error status.
///
/// Each way of deciding is its own future, boxed, so that a request carries only its
/// own: a decision on the memory store waits for nothing, while a remote store's
/// future holds the store's call, and a traced one the span's work too.
pub fn call(service: Arc<Decider>, request: http::Request<Incoming>) -> Call {
    if let Err(status) = refuse_compressed(request.headers()) {
        return Box::pin(std::future::ready(Ok(refused(status))));
    }
    let (parts, body) = request.into_parts();
    // A decision that is not traced decodes the message straight into the core's
    // request, and its answer is encoded straight from the core's response; one that
    // also waits for nothing reads no header.
    if service.decides_now() {
        return Box::pin(async move {
            let result = async {
                let (request, _) = read_request(body, to_core).await?;
                frame_decided(&service, service.should_rate_limit_grpc_now(request))
            };
            answered(result.await)
        });
    }
    if service.decodes_to_core() {
        return Box::pin(async move {
            let result = async {
                let (request, trailers) = read_request(body, to_core).await?;
                let headers = with_trailers(parts.headers, trailers);
                let decided = service.should_rate_limit_grpc_decoded(request, &headers);
                frame_decided(&service, decided.await)
            };
            answered(result.await)
        });
    }
    Box::pin(async move {
        let result = async {
            let (request, trailers) = read_request(body, to_pb).await?;
            let headers = with_trailers(parts.headers, trailers);
            let response = service.should_rate_limit_grpc(request, &headers).await;
            let response = response.map_err(|error| status(&error))?;
            frame(|buf| response.encode_raw(buf))
        };
        answered(result.await)
    })
}

/// The answer's message of a decision, framed, or the call's error status.
fn frame_decided(
    service: &Decider,
    decided: Result<Decided, ServiceError>,
) -> Result<Bytes, Status> {
    let decided = decided.map_err(|error| status(&error))?;
    frame(|buf| service.encode(&decided, buf))
}

/// The response to a call: its answer, or its error status.
fn answered(result: Result<Bytes, Status>) -> Result<http::Response<Reply>, Infallible> {
    Ok(match result {
        Ok(message) => answer(message).map(Either::Left),
        Err(status) => refused(status),
    })
}

fn refused(status: Status) -> http::Response<Reply> {
    status.into_http().map(Either::Right)
}

/// A call's headers and its trailers, which the service reads as one map.
fn with_trailers(mut headers: HeaderMap, trailers: Option<HeaderMap>) -> HeaderMap {
    headers.extend(trailers.unwrap_or_default());
    headers
}

/// A message as envoy-types' request.
fn to_pb(message: &[u8]) -> Result<RateLimitRequest, Status> {
    RateLimitRequest::decode(message).map_err(not_a_request)
}

/// A message as the core's request, or the reason the core cannot take it (which the
/// service counts as it counts every request error).
fn to_core(message: &[u8]) -> Result<Result<Request, InvalidRequest>, Status> {
    match wire::decode_request(message) {
        Ok(request) => Ok(Ok(request)),
        Err(RequestError::Invalid(invalid)) => Ok(Err(invalid)),
        Err(RequestError::Decode(error)) => Err(not_a_request(error)),
    }
}

fn not_a_request(error: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("the body is not a RateLimitRequest: {error}"))
}

/// No compression is enabled, so a request that says it is compressed is refused as
/// tonic refuses it.
fn refuse_compressed(headers: &HeaderMap) -> Result<(), Status> {
    // A name made once: looking a `&str` up parses and classifies it on every call.
    static GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
    match headers.get(&GRPC_ENCODING).map(HeaderValue::as_bytes) {
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

/// The first message of `body`, and its trailers. Later messages, which a unary call
/// should not carry, are decoded and dropped, as tonic does. At most one message is
/// buffered, and a message is at most [`MAX_MESSAGE`] bytes.
async fn read_request<B, T>(
    body: B,
    decode: fn(&[u8]) -> Result<T, Status>,
) -> Result<(T, Option<HeaderMap>), Status>
where
    B: Body,
    B::Error: Into<StdError>,
{
    let mut body = pin!(body);
    let (mut first, mut trailers, mut pending) = (None, None, BytesMut::new());
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => match Status::from_error(error.into()) {
                // As in tonic, a request the client cancelled ends there.
                status if status.code() == tonic::Code::Cancelled => break,
                status => return Err(status),
            },
        };
        match frame.into_data() {
            // A frame that starts on a message boundary is decoded where it lies.
            Ok(mut data) if pending.is_empty() => {
                let data = data.copy_to_bytes(data.remaining());
                let used = decode_messages(&data, &mut first, decode)?;
                pending.extend_from_slice(&data[used..]);
            }
            Ok(mut data) => {
                pending.extend_from_slice(&data.copy_to_bytes(data.remaining()));
                let used = decode_messages(&pending, &mut first, decode)?;
                let _ = pending.split_to(used);
            }
            Err(frame) => trailers = frame.into_trailers().ok().or(trailers),
        }
    }
    if !pending.is_empty() {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    let request = first.ok_or_else(|| Status::internal("Missing request message."))?;
    Ok((request, trailers))
}

/// Decodes the complete messages at the start of `bytes` (keeping the first in `first`)
/// and returns how many bytes they took.
fn decode_messages<T>(
    bytes: &[u8],
    first: &mut Option<T>,
    decode: fn(&[u8]) -> Result<T, Status>,
) -> Result<usize, Status> {
    let mut at = 0;
    while let Some(prefix) = bytes.get(at..at + PREFIX) {
        match prefix[0] {
            0 => {}
            // https://grpc.github.io/grpc/core/md_doc_compression.html: INTERNAL.
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ));
            }
            flag => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1), while sending request"
                )));
            }
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {MAX_MESSAGE} bytes"
            )));
        }
        let Some(message) = bytes.get(at + PREFIX..at + PREFIX + len) else {
            break;
        };
        let request = decode(message)?;
        first.get_or_insert(request);
        at += PREFIX + len;
    }
    Ok(at)
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
fn answer(message: Bytes) -> http::Response<Answer> {
    let body = Answer {
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
pub struct Answer {
    message: Option<Bytes>,
    trailers_due: bool,
}

impl Body for Answer {
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
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
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
fn status(error: &ServiceError) -> Status {
    match error {
        ServiceError::Invalid(e) => Status::invalid_argument(e.to_string()),
        ServiceError::Request(e) if e.is_invalid_argument() => {
            Status::invalid_argument(e.to_string())
        }
        ServiceError::Request(e) => Status::unknown(e.to_string()),
        ServiceError::Backend(e @ BackendError::Key(_)) => Status::invalid_argument(e.to_string()),
        ServiceError::Backend(e) => Status::unavailable(e.to_string()),
        ServiceError::Overloaded(e) => Status::resource_exhausted(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use http_body_util::StreamBody;
    use tonic::Code;

    use super::*;

    fn request(domain: &str) -> RateLimitRequest {
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

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&(message.len() as u32).to_be_bytes());
        bytes.extend_from_slice(message);
        bytes
    }

    /// A body of these frames: data, then the trailers if any.
    fn body(
        chunks: Vec<Vec<u8>>,
        trailers: Option<HeaderMap>,
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<bytes::Bytes>, Infallible>>> {
        let frames = chunks
            .into_iter()
            .map(|chunk| Ok(Frame::data(chunk.into())))
            .chain(trailers.map(|t| Ok(Frame::trailers(t))));
        StreamBody::new(futures_util::stream::iter(frames))
    }

    async fn read(chunks: Vec<Vec<u8>>) -> Result<RateLimitRequest, Status> {
        read_request(body(chunks, None), to_pb)
            .await
            .map(|(r, _)| r)
    }

    #[tokio::test]
    async fn a_request_split_anywhere_reads_whole_and_later_messages_are_dropped() {
        let mut bytes = framed(&request("first").encode_to_vec());
        bytes.extend(framed(&request("second").encode_to_vec()));
        // One byte per frame: the prefix and the message both arrive in pieces.
        let chunks = bytes.iter().map(|b| vec![*b]).collect();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-trailer", HeaderValue::from_static("t"));
        let (first, got) = read_request(body(chunks, Some(trailers)), to_pb)
            .await
            .unwrap();
        assert_eq!(first, request("first"));
        assert_eq!(got.unwrap()["x-trailer"], "t");
        assert_eq!(read(vec![bytes]).await.unwrap(), request("first"));
    }

    #[tokio::test]
    async fn malformed_calls_get_tonics_codes_and_ours_for_a_bad_message() {
        let cases: [(Vec<u8>, Code, &str); 6] = [
            (vec![], Code::Internal, "Missing request message."),
            (
                framed(b"\x0a\x05ab")[..8].to_vec(),
                Code::Internal,
                "Unexpected EOF",
            ),
            (
                [&[1u8][..], &framed(b"")[1..]].concat(),
                Code::Internal,
                "compressed-flag",
            ),
            (
                [&[7u8][..], &framed(b"")[1..]].concat(),
                Code::Internal,
                "flag: 7",
            ),
            (
                vec![0, 0, 0x40, 0, 1],
                Code::OutOfRange,
                "found 4194305 bytes, the limit is: 4194304 bytes",
            ),
            (
                framed(b"\xff\xff"),
                Code::InvalidArgument,
                "not a RateLimitRequest",
            ),
        ];
        for (bytes, code, message) in cases {
            let error = read(vec![bytes.clone()]).await.unwrap_err();
            assert_eq!(error.code(), code, "{bytes:?}: {error:?}");
            assert!(error.message().contains(message), "{bytes:?}: {error:?}");
        }
    }

    #[tokio::test]
    async fn a_cancelled_body_ends_the_request_and_other_body_errors_fail_it() {
        let message = framed(&request("sent").encode_to_vec());
        for (error, expected) in [
            (Status::cancelled("gone"), Ok(request("sent"))),
            (Status::unavailable("reset"), Err(Code::Unavailable)),
        ] {
            let frames = [
                Ok(Frame::data(bytes::Bytes::from(message.clone()))),
                Err(error),
            ];
            let body = StreamBody::new(futures_util::stream::iter(frames));
            let read = read_request(body, to_pb).await.map(|(r, _)| r);
            assert_eq!(read.map_err(|e| e.code()), expected);
        }
    }

    proptest::proptest! {
        /// However a body is cut into frames, it reads as it does whole: the same request
        /// or the same error.
        #[test]
        fn frames_do_not_change_what_a_body_reads_as(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            valid in proptest::prelude::any::<bool>(),
            cuts in proptest::collection::vec(0usize..80, 0..6),
        ) {
            let bytes = if valid { framed(&request(&format!("{bytes:?}")).encode_to_vec()) } else { bytes };
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < bytes.len()).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                chunks.push(bytes[from..cut].to_vec());
                from = cut;
            }
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let whole = runtime.block_on(read(vec![bytes.clone()]));
            let split = runtime.block_on(read(chunks));
            match (whole, split) {
                (Ok(a), Ok(b)) => proptest::prop_assert_eq!(a, b),
                (Err(a), Err(b)) => {
                    proptest::prop_assert_eq!(a.code(), b.code());
                    proptest::prop_assert_eq!(a.message(), b.message());
                }
                (a, b) => proptest::prop_assert!(false, "{a:?} whole, {b:?} split"),
            }
            if valid {
                proptest::prop_assert!(runtime.block_on(read(vec![bytes])).is_ok());
            }
        }
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
