//! The start of a client's connection (RFC 9113, 3.4): the preface, then a whole
//! SETTINGS frame, read before the connection is handed to hyper, so that
//! GRPC_PREFACE_TIMEOUT covers both. A connection whose first frame is anything else
//! is answered with a GOAWAY (`PROTOCOL_ERROR`, or `FRAME_SIZE_ERROR` for a SETTINGS
//! frame longer than any a client may send first) and closed.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// What a client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame's header: length (3 bytes), type, flags, stream (4 bytes).
const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const ACK: u8 = 0x1;
/// The largest frame a peer may send before it has seen our SETTINGS.
const INITIAL_MAX_FRAME_SIZE: usize = 16_384;
const PROTOCOL_ERROR: u32 = 0x1;
const FRAME_SIZE_ERROR: u32 = 0x6;

/// How a connection started.
pub enum Start {
    /// The preface and a whole SETTINGS frame (or bytes that are not HTTP/2 at all,
    /// which hyper refuses itself): what was read, to be read again by hyper.
    Read(Bytes),
    /// A first frame that is not a client's SETTINGS, answered with a GOAWAY.
    Refused(&'static str),
}

/// Reads the preface and the first frame; refuses a first frame that is not SETTINGS.
pub async fn read<IO: AsyncRead + AsyncWrite + Unpin>(io: &mut IO) -> io::Result<Start> {
    let mut start = BytesMut::with_capacity(1024);
    let mut want = PREFACE.len() + FRAME_HEADER;
    while start.len() < want {
        if io.read_buf(&mut start).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let seen = start.len().min(PREFACE.len());
        if start[..seen] != PREFACE[..seen] {
            return Ok(Start::Read(start.freeze()));
        }
        if start.len() >= PREFACE.len() + FRAME_HEADER {
            let header = &start[PREFACE.len()..PREFACE.len() + FRAME_HEADER];
            if let Err((code, why)) = first_frame(header) {
                refuse(io, code, why).await?;
                return Ok(Start::Refused(why));
            }
            want = PREFACE.len() + FRAME_HEADER + frame_length(header);
        }
    }
    Ok(Start::Read(start.freeze()))
}

fn frame_length(header: &[u8]) -> usize {
    usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2])
}

/// Whether `header` may start a client's connection: a SETTINGS frame on stream 0,
/// not an acknowledgement, whose length is whole settings of 6 bytes.
fn first_frame(header: &[u8]) -> Result<(), (u32, &'static str)> {
    let length = frame_length(header);
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & !(1 << 31);
    if header[3] != SETTINGS || header[4] & ACK != 0 || stream != 0 {
        return Err((PROTOCOL_ERROR, "the first frame is not SETTINGS"));
    }
    if length > INITIAL_MAX_FRAME_SIZE || !length.is_multiple_of(6) {
        return Err((
            FRAME_SIZE_ERROR,
            "the first SETTINGS frame has a bad length",
        ));
    }
    Ok(())
}

/// Sends our SETTINGS (empty: the defaults) and a GOAWAY with `code` and `why`.
async fn refuse<IO: AsyncWrite + Unpin>(io: &mut IO, code: u32, why: &str) -> io::Result<()> {
    let mut frames = Vec::with_capacity(2 * FRAME_HEADER + 8 + why.len());
    frames.extend_from_slice(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0]);
    let length = u32::try_from(8 + why.len()).expect("a short reason");
    frames.extend_from_slice(&length.to_be_bytes()[1..]);
    frames.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&0u32.to_be_bytes());
    frames.extend_from_slice(&code.to_be_bytes());
    frames.extend_from_slice(why.as_bytes());
    io.write_all(&frames).await?;
    io.shutdown().await
}

/// A stream whose first bytes were already read: they are read again first.
pub struct Rewind<IO> {
    start: Bytes,
    inner: IO,
}

impl<IO> Rewind<IO> {
    /// `inner`, whose first bytes `start` were read from it.
    pub fn new(start: Bytes, inner: IO) -> Rewind<IO> {
        Rewind { start, inner }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.start.has_remaining() {
            let n = self.start.len().min(buf.remaining());
            buf.put_slice(&self.start[..n]);
            self.start.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: Unpin> Rewind<IO> {
    /// The stream underneath, where every write goes.
    fn written(self: Pin<&mut Self>) -> Pin<&mut IO> {
        Pin::new(&mut self.get_mut().inner)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewind<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.written().poll_write_vectored(cx, slices)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.written().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.written().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_clients_settings_frame_may_come_first() {
        assert_eq!(first_frame(&[0, 0, 12, SETTINGS, 0, 0, 0, 0, 0]), Ok(()));
        let protocol = |header: [u8; 9]| first_frame(&header).map_err(|(code, _)| code);
        // A PING, a SETTINGS acknowledgement, SETTINGS on stream 1.
        assert_eq!(protocol([0, 0, 8, 6, 0, 0, 0, 0, 0]), Err(PROTOCOL_ERROR));
        assert_eq!(
            protocol([0, 0, 0, SETTINGS, ACK, 0, 0, 0, 0]),
            Err(PROTOCOL_ERROR)
        );
        assert_eq!(
            protocol([0, 0, 0, SETTINGS, 0, 0, 0, 0, 1]),
            Err(PROTOCOL_ERROR)
        );
        // Not whole settings; longer than a first frame may be (16 386 bytes).
        assert_eq!(
            protocol([0, 0, 7, SETTINGS, 0, 0, 0, 0, 0]),
            Err(FRAME_SIZE_ERROR)
        );
        assert_eq!(
            protocol([0, 0x40, 2, SETTINGS, 0, 0, 0, 0, 0]),
            Err(FRAME_SIZE_ERROR)
        );
    }

    #[tokio::test]
    async fn the_preface_and_a_whole_settings_frame_are_read_and_kept() {
        let mut sent = PREFACE.to_vec();
        sent.extend_from_slice(&[0, 0, 6, SETTINGS, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 9]);
        sent.extend_from_slice(b"more");
        let (mut client, mut server) = tokio::io::duplex(4096);
        // The frame's payload comes after its header, in a write of its own.
        let (head, tail) = sent.split_at(PREFACE.len() + FRAME_HEADER);
        client.write_all(head).await.unwrap();
        let reading = tokio::spawn(async move { read(&mut server).await });
        tokio::task::yield_now().await;
        assert!(!reading.is_finished(), "the payload is waited for");
        client.write_all(tail).await.unwrap();
        match reading.await.unwrap().unwrap() {
            Start::Read(start) => assert!(sent.starts_with(&start) && start.len() >= 40),
            Start::Refused(why) => panic!("{why}"),
        }
    }
}
