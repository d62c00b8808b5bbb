//! Reading a unary call's request: the first length-prefixed message of its body,
//! decoded, and its trailers.
//!
//! [`Reader`] is polled by hand, so that a call that decides at once (the memory store)
//! is one plain future that hyper holds in its stream's task, without a box; every other
//! call awaits [`read_request`].

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tonic::Status;
use tonic::codegen::http::header::HeaderMap;
use tonic::codegen::{Body, StdError};

use super::PREFIX;

/// The largest request message, as tonic's default.
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A call's first message, decoded, and its trailers.
pub(super) type Read<T> = Result<(T, Option<HeaderMap>), Status>;

/// Reads the first message of a body, and its trailers. Later messages, which a unary
/// call should not carry, are decoded and dropped, as tonic does. At most one message is
/// buffered, and a message is at most [`MAX_MESSAGE`] bytes.
pub(super) struct Reader<T> {
    decode: fn(&[u8]) -> Result<T, Status>,
    first: Option<T>,
    trailers: Option<HeaderMap>,
    /// The start of a message that a frame cut short.
    pending: BytesMut,
}

impl<T> Reader<T> {
    pub(super) fn new(decode: fn(&[u8]) -> Result<T, Status>) -> Reader<T> {
        Reader {
            decode,
            first: None,
            trailers: None,
            pending: BytesMut::new(),
        }
    }

    /// Reads `body`'s frames until it ends: then the first message and the trailers.
    pub(super) fn poll_read<B>(
        &mut self,
        mut body: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> Poll<Read<T>>
    where
        B: Body,
        B::Error: Into<StdError>,
    {
        loop {
            let frame = match ready!(body.as_mut().poll_frame(cx)) {
                None => return Poll::Ready(self.finish()),
                Some(Ok(frame)) => frame,
                Some(Err(error)) => match Status::from_error(error.into()) {
                    // As in tonic, a request the client cancelled ends there.
                    status if status.code() == tonic::Code::Cancelled => {
                        return Poll::Ready(self.finish());
                    }
                    status => return Poll::Ready(Err(status)),
                },
            };
            let read = match frame.into_data() {
                Ok(mut data) => self.add(data.copy_to_bytes(data.remaining())),
                Err(frame) => {
                    self.trailers = frame.into_trailers().ok().or(self.trailers.take());
                    Ok(())
                }
            };
            if let Err(status) = read {
                return Poll::Ready(Err(status));
            }
        }
    }

    /// Decodes the messages `data` completes, and keeps what is left of it.
    fn add(&mut self, data: bytes::Bytes) -> Result<(), Status> {
        let Reader {
            decode,
            first,
            pending,
            ..
        } = self;
        if pending.is_empty() {
            // A frame that starts on a message boundary is decoded where it lies.
            let used = decode_messages(&data, first, *decode)?;
            pending.extend_from_slice(&data[used..]);
        } else {
            pending.extend_from_slice(&data);
            let used = decode_messages(pending, first, *decode)?;
            let _ = pending.split_to(used);
        }
        Ok(())
    }

    /// The body has ended: its first message, or why there is none.
    fn finish(&mut self) -> Read<T> {
        if !self.pending.is_empty() {
            return Err(Status::internal("Unexpected EOF decoding stream."));
        }
        let request = self.first.take();
        let request = request.ok_or_else(|| Status::internal("Missing request message."))?;
        Ok((request, self.trailers.take()))
    }
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
        check_flag(prefix[0])?;
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

/// A message's compression flag: no compression is enabled, so only 0 is taken.
fn check_flag(flag: u8) -> Result<(), Status> {
    match flag {
        0 => Ok(()),
        // https://grpc.github.io/grpc/core/md_doc_compression.html: INTERNAL.
        1 => Err(Status::internal(
            "protocol error: received message with compressed-flag but no grpc-encoding was specified",
        )),
        flag => Err(Status::internal(format!(
            "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1), while sending request"
        ))),
    }
}

/// The first message of `body`, decoded with `decode`, and its trailers.
pub(super) async fn read_request<B, T>(body: B, decode: fn(&[u8]) -> Result<T, Status>) -> Read<T>
where
    B: Body,
    B::Error: Into<StdError>,
{
    let mut body = pin!(body);
    let mut reader = Reader::new(decode);
    poll_fn(|cx| reader.poll_read(body.as_mut(), cx)).await
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use prost::Message;
    use tonic::Code;
    use tonic::codegen::http::header::HeaderValue;

    use super::super::tests::{framed, request};
    use super::super::to_pb;
    use super::*;

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
}
