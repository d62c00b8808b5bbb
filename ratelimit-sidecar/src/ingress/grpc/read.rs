//! Reading a unary call's request: the first length-prefixed message of its body,
//! decoded as soon as it is whole.
//!
//! The call is answered on that message, as grpc-go answers a unary call: nothing
//! after it is read or decoded, and the client's end of the stream is not waited for
//! (hyper resets a stream whose body is left unread once its answer is sent). A call
//! holds at most one message of at most [`MAX_MESSAGE`] bytes, and only until it is
//! whole. [`Reader`] is polled by hand, inside the call's own future, which hyper holds
//! in its stream's task without a box.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tonic::Status;
use tonic::codegen::{Body, StdError};

use super::PREFIX;

/// The largest request message, as tonic's default.
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A call's first message (its bytes, without the prefix), or the call's error status.
pub(super) type Read = Result<Bytes, Status>;

/// Reads the first message of a body. A message is at most [`MAX_MESSAGE`] bytes.
#[derive(Default)]
pub(super) struct Reader {
    /// The start of the message that frames have brought so far.
    pending: BytesMut,
}

impl Reader {
    /// Reads `body`'s frames until its first message is whole: then that message.
    pub(super) fn poll_read<B>(&mut self, mut body: Pin<&mut B>, cx: &mut Context<'_>) -> Poll<Read>
    where
        B: Body,
        B::Error: Into<StdError>,
    {
        loop {
            let frame = match ready!(body.as_mut().poll_frame(cx)) {
                None => return Poll::Ready(Err(self.ended())),
                Some(Ok(frame)) => frame,
                Some(Err(error)) => match Status::from_error(error.into()) {
                    // As in tonic, a request the client cancelled ends there.
                    status if status.code() == tonic::Code::Cancelled => {
                        return Poll::Ready(Err(self.ended()));
                    }
                    status => return Poll::Ready(Err(status)),
                },
            };
            // Trailers before a whole message end the body as its end does.
            let Ok(mut data) = frame.into_data() else {
                continue;
            };
            if let Some(read) = self.add(data.copy_to_bytes(data.remaining())) {
                return Poll::Ready(read);
            }
        }
    }

    /// Adds a frame's bytes: the first message once they complete it.
    fn add(&mut self, data: Bytes) -> Option<Read> {
        // A frame that starts on a message boundary is read where it lies, uncopied.
        if self.pending.is_empty() {
            return match message_len(&data) {
                Ok(Some(len)) => Some(Ok(data.slice(PREFIX..PREFIX + len))),
                Ok(None) => {
                    self.pending.extend_from_slice(&data);
                    None
                }
                Err(status) => Some(Err(status)),
            };
        }
        self.pending.extend_from_slice(&data);
        match message_len(&self.pending) {
            Ok(Some(len)) => {
                let mut whole = std::mem::take(&mut self.pending);
                whole.truncate(PREFIX + len);
                Some(Ok(whole.freeze().split_off(PREFIX)))
            }
            Ok(None) => None,
            Err(status) => Some(Err(status)),
        }
    }

    /// The body ended before its first message was whole: why there is none.
    fn ended(&self) -> Status {
        if self.pending.is_empty() {
            Status::internal("Missing request message.")
        } else {
            Status::internal("Unexpected EOF decoding stream.")
        }
    }
}

/// The length of the first message of `bytes` once it is whole; `None` while it is not.
/// The prefix is checked as soon as it has come, so a message too large is refused
/// before its bytes.
fn message_len(bytes: &[u8]) -> Result<Option<usize>, Status> {
    let Some(prefix) = bytes.get(..PREFIX) else {
        return Ok(None);
    };
    check_flag(prefix[0])?;
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {len} bytes, the limit is: {MAX_MESSAGE} bytes"
        )));
    }
    Ok((bytes.len() >= PREFIX + len).then_some(len))
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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::poll_fn;
    use std::pin::pin;

    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use futures_util::StreamExt;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use prost::Message;
    use tonic::Code;
    use tonic::codegen::http::header::HeaderMap;

    use super::super::tests::{framed, request};
    use super::*;

    /// The first message of `body`.
    async fn read_message<B>(body: B) -> Read
    where
        B: Body,
        B::Error: Into<StdError>,
    {
        let mut body = pin!(body);
        let mut reader = Reader::default();
        poll_fn(|cx| reader.poll_read(body.as_mut(), cx)).await
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
        decoded(read_message(body(chunks, None)).await)
    }

    fn decoded(read: Read) -> Result<RateLimitRequest, Status> {
        let not_a_request = |e| Status::invalid_argument(format!("not a RateLimitRequest: {e}"));
        RateLimitRequest::decode(&read?[..]).map_err(not_a_request)
    }

    #[tokio::test]
    async fn a_request_split_anywhere_reads_whole_and_later_bytes_are_not_read() {
        let mut bytes = framed(&request("first").encode_to_vec());
        let whole = bytes.len();
        // Not a message at all: never read, since the call is answered before it.
        bytes.extend([7, 0xff, 0xff, 0xff, 0xff]);
        // One byte per frame: the prefix and the message both arrive in pieces.
        let chunks = bytes.iter().map(|b| vec![*b]).collect();
        assert_eq!(read(chunks).await.unwrap(), request("first"));
        assert_eq!(read(vec![bytes.clone()]).await.unwrap(), request("first"));
        // Trailers before the message is whole end the body.
        let cut = body(vec![bytes[..whole - 1].to_vec()], Some(HeaderMap::new()));
        let error = read_message(cut).await.unwrap_err();
        assert_eq!(error.message(), "Unexpected EOF decoding stream.");
    }

    /// A call is answered on its first message, with the client's stream still open:
    /// a body that never ends is not waited for.
    #[tokio::test]
    async fn the_first_message_is_read_without_waiting_for_the_end_of_the_body() {
        let message = framed(&request("open").encode_to_vec());
        let frames = futures_util::stream::iter([Ok::<_, Infallible>(Frame::data(
            bytes::Bytes::from(message),
        ))])
        .chain(futures_util::stream::pending());
        let read = read_message(StreamBody::new(frames));
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), read).await;
        assert_eq!(
            decoded(read.expect("answered at once")).unwrap(),
            request("open")
        );
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
        let half = message[..message.len() / 2].to_vec();
        for (error, expected) in [
            (Status::cancelled("gone"), Code::Internal),
            (Status::unavailable("reset"), Code::Unavailable),
        ] {
            let frames = [
                Ok(Frame::data(bytes::Bytes::from(half.clone()))),
                Err(error),
            ];
            let body = StreamBody::new(futures_util::stream::iter(frames));
            let read = read_message(body).await;
            assert_eq!(read.map_err(|e| e.code()), Err(expected));
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
