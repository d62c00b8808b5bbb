//! gRPC over a unix socket from any client.
//!
//! gRPC's C core (Python, Ruby, C++, PHP) names a `unix:` target in `:authority` by its
//! percent-encoded path (`tmp%2Frl.sock`), which is not a valid URI authority; the HTTP/2
//! server resets such a stream before the service sees it. [`AuthorityFix`] reads the
//! client's side of a unix-socket connection and, from the first request whose
//! `:authority` is not valid, re-encodes every header block with `:authority: localhost`
//! instead (a dynamic table size update of 0 first, so the server's decoder and this
//! encoder stay in step). Connections whose authorities are valid pass through untouched;
//! their header blocks are only decoded, to follow the client's dynamic table.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use fluke_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame sent on: the HTTP/2 default, which the server accepts.
const MAX_FRAME: usize = 16_384;
/// What replaces an `:authority` that is not a valid URI authority.
const AUTHORITY: &[u8] = b"localhost";

/// A unix-socket stream whose incoming header blocks carry only valid `:authority` values.
pub struct AuthorityFix<S> {
    inner: S,
    /// Bytes read from the client, not yet examined.
    input: BytesMut,
    /// Bytes ready for the server.
    output: BytesMut,
    preface_left: usize,
    /// A header block waiting for its CONTINUATION frames: stream, flags, fragment.
    pending: Option<(u32, u8, Vec<u8>)>,
    decoder: Decoder<'static>,
    /// Set once a block was rewritten: every later block is re-encoded by it.
    encoder: Option<Encoder<'static>>,
    /// The client sent something that is not HTTP/2 as expected: pass everything on.
    passthrough: bool,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    /// Wraps the server side of an accepted unix-socket connection.
    pub fn new(inner: S) -> AuthorityFix<S> {
        AuthorityFix {
            inner,
            input: BytesMut::new(),
            output: BytesMut::new(),
            preface_left: PREFACE_LEN,
            pending: None,
            decoder: Decoder::new(),
            encoder: None,
            passthrough: false,
            eof: false,
        }
    }

    /// Moves every complete frame from `input` to `output`, rewriting header blocks.
    fn process(&mut self) {
        if self.preface_left > 0 {
            let n = self.preface_left.min(self.input.len());
            self.output.extend_from_slice(&self.input.split_to(n));
            self.preface_left -= n;
        }
        while !self.passthrough && self.preface_left == 0 {
            if self.input.len() < FRAME_HEADER_LEN {
                return;
            }
            let length = usize::from(self.input[0]) << 16
                | usize::from(self.input[1]) << 8
                | usize::from(self.input[2]);
            if self.input.len() < FRAME_HEADER_LEN + length {
                return;
            }
            let kind = self.input[3];
            let flags = self.input[4];
            let stream =
                u32::from_be_bytes([self.input[5], self.input[6], self.input[7], self.input[8]])
                    & 0x7fff_ffff;
            let frame = self.input.split_to(FRAME_HEADER_LEN + length);
            match (kind, self.pending.take()) {
                (HEADERS, None) => match fragment(&frame[FRAME_HEADER_LEN..], flags) {
                    Some(part) if flags & END_HEADERS != 0 => {
                        self.block(stream, flags, part.to_vec(), &frame);
                    }
                    Some(part) => self.pending = Some((stream, flags, part.to_vec())),
                    None => self.give_up(&frame),
                },
                (CONTINUATION, Some((id, first, mut block))) if id == stream => {
                    block.extend_from_slice(&frame[FRAME_HEADER_LEN..]);
                    if flags & END_HEADERS != 0 {
                        self.block(id, first, block, &frame);
                    } else {
                        self.pending = Some((id, first, block));
                    }
                }
                (_, None) => self.output.extend_from_slice(&frame),
                (_, Some(_)) => self.give_up(&frame),
            }
        }
        if self.passthrough {
            let rest = self.input.split();
            self.output.extend_from_slice(&rest);
        }
    }

    /// A complete header block of `stream`; `last` is its final frame, passed on as it
    /// came (with any earlier ones) when nothing needs rewriting.
    fn block(&mut self, stream: u32, flags: u8, block: Vec<u8>, last: &[u8]) {
        let Ok(headers) = self.decoder.decode(&block) else {
            // The server will refuse it too; nothing more here can be followed.
            self.passthrough = true;
            self.emit(stream, flags, &block);
            return;
        };
        let bad = headers.iter().any(|(name, value)| {
            name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err()
        });
        if self.encoder.is_none() && !bad {
            // Untouched: the frames as the client sent them (a single HEADERS frame, or
            // the first one rebuilt with its CONTINUATIONs).
            if flags & END_HEADERS != 0 && last.len() == FRAME_HEADER_LEN + block.len() {
                self.output.extend_from_slice(last);
            } else {
                self.emit(stream, flags, &block);
            }
            return;
        }
        let mut out = Vec::with_capacity(block.len() + 16);
        let encoder = self.encoder.get_or_insert_with(|| {
            // Empty the server's dynamic table: from here on it holds only what this
            // encoder puts there, which is nothing.
            out.push(0x20);
            let mut encoder = Encoder::new();
            encoder.set_max_table_size(0);
            encoder
        });
        let fixed = headers.iter().map(|(name, value)| {
            let valid =
                name != b":authority" || http::uri::Authority::try_from(value.as_slice()).is_ok();
            (
                name.as_slice(),
                if valid { value.as_slice() } else { AUTHORITY },
            )
        });
        if encoder.encode_into(fixed, &mut out).is_err() {
            self.passthrough = true;
        }
        self.emit(stream, flags, &out);
    }

    /// Writes `block` as a HEADERS frame (with CONTINUATIONs past the frame size).
    fn emit(&mut self, stream: u32, flags: u8, block: &[u8]) {
        let mut chunks = block.chunks(MAX_FRAME).peekable();
        let mut kind = HEADERS;
        let mut frame_flags = flags & END_STREAM;
        loop {
            let chunk = chunks.next().unwrap_or_default();
            let last = chunks.peek().is_none();
            if last {
                frame_flags |= END_HEADERS;
            }
            let len = u32::try_from(chunk.len()).expect("chunks are at most 16 KiB");
            self.output.put_slice(&len.to_be_bytes()[1..]);
            self.output.put_u8(kind);
            self.output.put_u8(frame_flags);
            self.output.put_u32(stream);
            self.output.put_slice(chunk);
            if last {
                return;
            }
            kind = CONTINUATION;
            frame_flags = 0;
        }
    }

    fn give_up(&mut self, frame: &[u8]) {
        self.passthrough = true;
        self.output.extend_from_slice(frame);
    }
}

/// The header block fragment of a HEADERS frame's payload (without padding and priority).
fn fragment(payload: &[u8], flags: u8) -> Option<&[u8]> {
    let mut payload = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        payload = &payload[1..];
    }
    if flags & PRIORITY != 0 {
        payload = payload.get(5..)?;
    }
    payload.get(..payload.len().checked_sub(pad)?)
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // The client closed: hand on whatever is left as it is.
                    this.eof = true;
                    let rest = this.input.split();
                    this.output.extend_from_slice(&rest);
                }
                Poll::Ready(Ok(())) => {
                    this.input.extend_from_slice(read.filled());
                    this.process();
                }
                other => return other,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for AuthorityFix<tokio::net::UnixStream> {
    type ConnectInfo = tonic::transport::server::UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }

    fn request(authority: &[u8]) -> Vec<(&'static [u8], Vec<u8>)> {
        vec![
            (b":method".as_slice(), b"POST".to_vec()),
            (b":authority".as_slice(), authority.to_vec()),
            (b":path".as_slice(), b"/x/y".to_vec()),
        ]
    }

    /// The client's bytes: preface, SETTINGS, then one request per authority, each
    /// block split over a padded, prioritised HEADERS frame and a CONTINUATION.
    fn client(authorities: &[&[u8]]) -> Vec<u8> {
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0x10, 0]));
        let mut encoder = Encoder::new();
        for (i, authority) in authorities.iter().enumerate() {
            let headers = request(authority);
            let block = encoder.encode(headers.iter().map(|(n, v)| (*n, v.as_slice())));
            let (first, rest) = block.split_at(block.len() / 2);
            let mut payload = vec![2]; // pad length
            payload.extend([0, 0, 0, 0, 16]); // priority
            payload.extend(first);
            payload.extend([0, 0]);
            let stream = 2 * u32::try_from(i).unwrap() + 1;
            out.extend(frame(
                HEADERS,
                END_STREAM | PADDED | PRIORITY,
                stream,
                &payload,
            ));
            out.extend(frame(CONTINUATION, END_HEADERS, stream, rest));
        }
        out
    }

    /// What the server reads, and the `:authority` of each request in it.
    async fn server_side(bytes: Vec<u8>) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut fixed = AuthorityFix::new(bytes.as_slice());
        let mut out = Vec::new();
        fixed.read_to_end(&mut out).await.unwrap();
        let (mut rest, mut decoder, mut authorities) =
            (&out[PREFACE_LEN..], Decoder::new(), Vec::new());
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            if rest[3] == HEADERS {
                assert_eq!(rest[4] & END_HEADERS, END_HEADERS, "one frame per block");
                let headers = decoder.decode(&rest[9..9 + len]).unwrap();
                let authority = headers.into_iter().find(|(n, _)| n == b":authority");
                authorities.push(authority.unwrap().1);
            }
            rest = &rest[9 + len..];
        }
        (out, authorities)
    }

    #[tokio::test]
    async fn percent_encoded_authorities_become_localhost_from_then_on() {
        let bytes = client(&[b"localhost:1", b"tmp%2Frl.sock", b"tmp%2Frl.sock", b"a.b:2"]);
        let (_, authorities) = server_side(bytes).await;
        let expected: [&[u8]; 4] = [b"localhost:1", b"localhost", b"localhost", b"a.b:2"];
        assert_eq!(authorities, expected);
    }

    #[tokio::test]
    async fn valid_authorities_keep_their_headers_and_other_frames_pass_untouched() {
        let bytes = client(&[b"localhost", b"localhost"]);
        let (out, authorities) = server_side(bytes.clone()).await;
        assert_eq!(authorities, [b"localhost".to_vec(), b"localhost".to_vec()]);
        let settings_end = PREFACE_LEN + 9 + 6;
        assert_eq!(out[..settings_end], bytes[..settings_end]);
    }
}
