//! The health checks' reserve: places for connections past the cap, where a request for
//! a health path is answered and anything else gets a 503 saying why.
//!
//! A place is taken by whoever connects, a client that connects and sends nothing too,
//! so a reserved connection must complete its TLS handshake and send its whole request
//! head within [`HEAD_TIMEOUT`] of its start (a health probe sends it at once), and
//! while the reserve is full a new connection takes the place of the oldest one that
//! has waited [`GRACE`] without sending it, which is closed. Silent clients that connect
//! again as soon as they are closed then keep a place for 50 ms while others wait for
//! one, not for the 2 s a reserved connection may take to be answered, and a probe
//! queued behind n of them in the listen backlog waits about n × 50 ms divided by the
//! reserve's size. A connection is found silent by its own task, woken 50 ms after it
//! started, which reads what came first: a probe whose head came in time keeps its
//! place however late a loaded machine runs that task.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::Request;
use hyper::body::Incoming;
use hyper::service::Service as HyperService;
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{ConnectionLimits, connection, peer_certificate, with_peer};

/// Time a reserved connection has, from its start, to complete its TLS handshake and
/// send its whole request head: far less than the 1 s a kubelet waits for a probe.
const HEAD_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a reserved connection keeps its place, from its start and while it has not
/// sent its whole request head, when a newer connection needs one: time for a probe's
/// head, sent with its connection, to arrive.
const GRACE: Duration = Duration::from_millis(50);

/// The longest a reserved connection is held once its head came: one answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// A reserved connection that sends this many bytes without ending its head is closed.
const MAX_HEAD: usize = 16 * 1024;

/// [`Place::state`] until its connection sends its whole request head or is found silent.
const WAITING: u8 = 0;
/// [`Place::state`] once its connection has not sent its whole head within [`GRACE`]:
/// the place may go to a newer connection.
const SILENT: u8 = 1;
/// [`Place::state`] once its connection sent it in time: the place is kept to answer.
const HEARD: u8 = 2;
/// [`Place::state`] once the place went to a newer connection: its own is closed.
const EVICTED: u8 = 3;

/// Connections past the cap that are answered on health paths only.
#[derive(Debug)]
pub(super) struct Reserve {
    size: usize,
    /// The connection cap, named in the 503.
    max: usize,
    paths: &'static [&'static str],
    /// The places taken, the oldest first.
    places: Mutex<Vec<Arc<Place>>>,
    /// Notified when a place is given back or its connection is found silent.
    changed: Notify,
}

/// One reserved connection's place.
#[derive(Debug)]
struct Place {
    /// [`WAITING`], maybe [`SILENT`], then [`HEARD`] or [`EVICTED`] for good.
    state: AtomicU8,
    /// Notified when the place is given to a newer connection.
    evicted: Notify,
}

impl Place {
    /// Moves it from `from` to `to`: false when it was not at `from`.
    fn moves(&self, from: u8, to: u8) -> bool {
        self.state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Keeps it for its connection, which sent its whole head: false when it went to a
    /// newer connection first.
    fn heard(&self) -> bool {
        self.moves(WAITING, HEARD) || self.moves(SILENT, HEARD)
    }
}

impl Reserve {
    /// `size` places past a cap of `max` connections, answering on `paths`.
    pub(super) fn new(size: usize, max: usize, paths: &'static [&'static str]) -> Reserve {
        Reserve {
            size,
            max,
            paths,
            places: Mutex::new(Vec::with_capacity(size)),
            changed: Notify::new(),
        }
    }

    /// A free place, or the place of the oldest connection found silent (which is told
    /// to close); none while every place is held by a connection not found silent.
    pub(super) fn try_take(self: &Arc<Self>) -> Option<Held> {
        let mut places = self.places.lock().unwrap_or_else(PoisonError::into_inner);
        if places.len() >= self.size {
            let oldest = places
                .iter()
                .position(|place| place.moves(SILENT, EVICTED))?;
            places.remove(oldest).evicted.notify_one();
        }
        let place = Arc::new(Place {
            state: AtomicU8::new(WAITING),
            evicted: Notify::new(),
        });
        places.push(Arc::clone(&place));
        Some(Held {
            reserve: Arc::clone(self),
            place,
        })
    }

    /// Waits for a place: a free one, or one that a silent connection can be evicted from.
    pub(super) async fn take(self: &Arc<Self>) -> Held {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(held) = self.try_take() {
                return held;
            }
            changed.await;
        }
    }
}

/// A place taken, given back when dropped.
pub(super) struct Held {
    reserve: Arc<Reserve>,
    place: Arc<Place>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut places = self
            .reserve
            .places
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        places.retain(|place| !Arc::ptr_eq(place, &self.place));
        drop(places);
        self.reserve.changed.notify_waiters();
    }
}

/// When a reserved connection is found silent, and when it is closed, if it has not
/// sent its whole request head by then.
#[derive(Clone, Copy)]
struct Times {
    silent: Instant,
    deadline: Instant,
}

impl Held {
    /// What `work` gives before `times.deadline`, unless the place goes to a newer
    /// connection first. At `times.silent`, `work` is polled once more, and then the
    /// place may go to a newer connection.
    async fn before<T>(&self, times: Times, work: impl Future<Output = Option<T>>) -> Option<T> {
        let work = tokio::time::timeout_at(times.deadline, work);
        let evicted = self.place.evicted.notified();
        let silent = tokio::time::sleep_until(times.silent);
        tokio::pin!(work, evicted, silent);
        let mut found_silent = false;
        loop {
            tokio::select! {
                biased;
                done = &mut work => return done.ok().flatten(),
                () = &mut evicted => return None,
                () = &mut silent, if !found_silent => {
                    found_silent = true;
                    if self.place.moves(WAITING, SILENT) {
                        self.reserve.changed.notify_waiters();
                    }
                }
            }
        }
    }

    /// `io` once its whole request head came in `times` while the place was held (the
    /// place is then kept until the answer): the head is read again from it.
    async fn hear<IO: AsyncRead + Unpin>(&self, mut io: IO, times: Times) -> Option<Heard<IO>> {
        let head = self.before(times, read_head(&mut io)).await?;
        self.place.heard().then_some(Heard { head, io })
    }
}

/// Serves a reserved connection: it must complete its TLS handshake (with `tls`) and
/// send its whole request head within [`HEAD_TIMEOUT`] and keep its place meanwhile;
/// then that one request is answered, by `inner` on a health path and with a 503
/// otherwise, within 2 s, and the connection is closed.
pub(super) async fn serve<S, B>(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    inner: S,
    limits: ConnectionLimits,
    watcher: Watcher,
    held: Held,
) where
    S: HyperService<Request<Incoming>, Response = hyper::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let start = Instant::now();
    let times = Times {
        silent: start + GRACE,
        deadline: start + HEAD_TIMEOUT.min(limits.header_read_timeout),
    };
    let reserve = &held.reserve;
    let service = HealthOnly {
        inner,
        paths: reserve.paths,
        max: reserve.max,
    };
    let limits = ConnectionLimits {
        header_read_timeout: limits.header_read_timeout.min(ANSWER_TIMEOUT),
        idle_timeout: limits.idle_timeout.min(ANSWER_TIMEOUT),
        request_timeout: limits.request_timeout.min(ANSWER_TIMEOUT),
    };
    let Some(tls) = tls else {
        let Some(stream) = held.hear(stream, times).await else {
            return;
        };
        let service = with_peer(service, peer, None);
        return connection(stream, service, limits, watcher, false).await;
    };
    let handshake = async move { tls.accept(stream).await.ok() };
    let Some(stream) = held.before(times, handshake).await else {
        return;
    };
    let service = with_peer(service, peer, peer_certificate(&stream));
    let Some(stream) = held.hear(stream, times).await else {
        return;
    };
    connection(stream, service, limits, watcher, false).await;
}

/// What `io` sends up to the end of a request head (the empty line after its headers),
/// with any bytes after it; none when it closes, fails, or sends [`MAX_HEAD`] bytes
/// first.
async fn read_head<IO: AsyncRead + Unpin>(io: &mut IO) -> Option<Bytes> {
    let mut head: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let read = std::future::poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut chunk);
            let poll = Pin::new(&mut *io).poll_read(cx, &mut buf);
            poll.map_ok(|()| buf.filled().len())
        });
        let read = read.await.ok()?;
        if read == 0 {
            return None;
        }
        let from = head.len().saturating_sub(2);
        head.extend_from_slice(&chunk[..read]);
        if head_ends(&head, from) {
            return Some(Bytes::from(head));
        }
        if head.len() >= MAX_HEAD {
            return None;
        }
    }
}

/// Whether `head` holds a line and then an empty one (`\n` or `\r\n`) ending at `from`
/// or later. Empty lines before the request line do not count, as HTTP/1.1 parsers skip
/// them.
fn head_ends(head: &[u8], from: usize) -> bool {
    let Some(start) = head.iter().position(|b| !matches!(b, b'\r' | b'\n')) else {
        return false;
    };
    let rest = &head[start.max(from)..];
    rest.windows(2).any(|w| w == b"\n\n") || rest.windows(3).any(|w| w == b"\n\r\n")
}

/// A reserved connection whose request head was read: it is read again, then the rest.
struct Heard<IO> {
    head: Bytes,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Heard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.head.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.head.len().min(buf.remaining());
        let part = self.head.split_to(n);
        buf.put_slice(&part);
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Heard<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A reserved connection's service: health paths go to `inner`, anything else is a 503
/// saying why.
struct HealthOnly<S> {
    inner: S,
    paths: &'static [&'static str],
    max: usize,
}

type HealthOnlyBody<B> = Either<B, Full<Bytes>>;

impl<S, B> HyperService<Request<Incoming>> for HealthOnly<S>
where
    S: HyperService<Request<Incoming>, Response = hyper::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = hyper::Response<HealthOnlyBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        if self.paths.contains(&request.uri().path()) {
            let answer = self.inner.call(request);
            return Box::pin(async move { Ok(answer.await?.map(Either::Left)) });
        }
        let body = format!(
            "Service Unavailable: all {} HTTP connections are in use; past them only health checks ({}) are answered\n",
            self.max,
            self.paths.join(", ")
        );
        let mut response = hyper::Response::new(Either::Right(Full::new(Bytes::from(body))));
        *response.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
        let headers = response.headers_mut();
        headers.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
        Box::pin(std::future::ready(Ok(response)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::{EVICTED, Reserve, SILENT, WAITING, head_ends};

    #[test]
    fn a_full_reserve_gives_the_oldest_silent_connections_place_to_a_new_one() {
        let reserve = Arc::new(Reserve::new(2, 16, &["/health"]));
        let first = reserve.try_take().unwrap();
        let second = reserve.try_take().unwrap();
        assert!(reserve.try_take().is_none(), "neither is found silent");
        assert!(second.place.moves(WAITING, SILENT));
        assert!(first.place.moves(WAITING, SILENT));
        assert!(
            second.place.heard(),
            "the second sends its head late, still in time"
        );
        let third = reserve.try_take().expect("the first one's place");
        assert_eq!(first.place.state.load(Ordering::Acquire), EVICTED);
        assert!(!first.place.heard(), "its head comes too late");
        assert!(
            reserve.try_take().is_none(),
            "the second sent its head and the third is not found silent"
        );
        drop(second);
        assert!(
            reserve.try_take().is_some(),
            "the second's place, given back"
        );
        drop((first, third));
    }

    #[test]
    fn a_head_ends_at_its_first_empty_line_after_the_request_line() {
        assert!(head_ends(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0));
        assert!(head_ends(b"GET / HTTP/1.1\nHost: x\n\n", 0));
        assert!(head_ends(b"\r\nGET / HTTP/1.1\r\n\r\nbody", 0));
        assert!(!head_ends(b"GET / HTTP/1.1\r\nHost: x\r\n", 0));
        assert!(!head_ends(b"\r\n\r\n\r\n", 0));
        assert!(!head_ends(b"", 0));
    }
}
