//! An HTTP/1.1 server loop for warp filters that writes header names in canonical case
//! (`Content-Type`), as Go's net/http does: some clients of envoyproxy/ratelimit compare
//! header names case-sensitively.
//!
//! It bounds what a client can hold: the number of open connections, the time to send a
//! request's headers (which is also how long a keep-alive connection may sit between
//! requests), and the time a connection may make no progress at all (a stalled body).
//! Past the cap, a reserve answers health checks only, and gives the place of a client
//! that stays silent to a newer one (`serve/reserve.rs`).

mod reserve;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use std::net::SocketAddr;

use bytes::Bytes;
use clap::Args;
use hyper::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service as HyperService;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use self::reserve::{Held, Reserve};
use crate::values::go_duration;
use warp::Filter;
use warp::reply::Response;

/// What one client may hold on a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Time allowed to send a request's headers, counted from the connection's start or
    /// the end of the previous response: idle keep-alive connections close after it.
    pub header_read_timeout: Duration,
    /// A connection that neither sends nor receives a byte for this long is closed.
    pub idle_timeout: Duration,
    /// Time a request may take from its first byte to the first byte of its answer: a
    /// body trickled a byte at a time cannot hold a connection past it.
    pub request_timeout: Duration,
}

/// The connection cap (`max_connections`), shared by every listener of one server, and
/// the health checks' reserve past it.
#[derive(Clone, Debug)]
pub struct ConnectionSlots {
    permits: Arc<Semaphore>,
    max: usize,
    reserve: Option<Arc<Reserve>>,
}

impl ConnectionSlots {
    /// At most `max` open connections (at least one).
    pub fn new(max: usize) -> ConnectionSlots {
        let max = max.max(1);
        ConnectionSlots {
            permits: Arc::new(Semaphore::new(max)),
            max,
            reserve: None,
        }
    }

    /// These slots, and past them a reserve of [`reserve_size`] connections for the
    /// health checks on `paths`: while every slot is taken, a new connection is served
    /// from the reserve, where a request for one of `paths` is answered and anything
    /// else gets a 503 at once; a reserved connection serves one request, whose head it
    /// must send within 250 ms, and a silent one gives its place to a newer connection
    /// after 50 ms. Health stays answerable however many connections clients hold open
    /// or open again.
    pub fn with_health_reserve(mut self, paths: &'static [&'static str]) -> ConnectionSlots {
        let size = reserve_size(self.max);
        self.reserve = Some(Arc::new(Reserve::new(size, self.max, paths)));
        self
    }
}

/// The health checks' reserve for a cap of `max` connections: an eighth, from 4 to 128.
pub fn reserve_size(max: usize) -> usize {
    (max / 8).clamp(4, 128)
}

/// How long to wait before accepting again after `accept` failed (out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The address of the client, in every request's extensions (`warp::ext::optional::<Peer>()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

/// The client's certificate, verified during the TLS handshake, in every request's
/// extensions when the client presented one (`warp::ext::optional::<PeerCertificate>()`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCertificate(pub Arc<rustls::pki_types::CertificateDer<'static>>);

/// `inner`, with the connection's [`Peer`] and [`PeerCertificate`] in each request.
struct WithPeer<S> {
    inner: S,
    peer: SocketAddr,
    certificate: Option<PeerCertificate>,
}

fn with_peer<S>(inner: S, peer: SocketAddr, certificate: Option<PeerCertificate>) -> WithPeer<S> {
    WithPeer {
        inner,
        peer,
        certificate,
    }
}

impl<S: HyperService<Request<Incoming>>> HyperService<Request<Incoming>> for WithPeer<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut request: Request<Incoming>) -> S::Future {
        request.extensions_mut().insert(Peer(self.peer));
        if let Some(certificate) = &self.certificate {
            request.extensions_mut().insert(certificate.clone());
        }
        self.inner.call(request)
    }
}

/// A warp filter as a service for [`serve`].
pub fn warp_filter<F, R>(
    filter: F,
) -> impl HyperService<
    Request<Incoming>,
    Response = Response,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
+ Send
+ Sync
+ 'static
where
    F: Filter<Extract = (R,), Error = Infallible> + Clone + Send + Sync + 'static,
    F::Future: Send,
    R: warp::Reply,
{
    TowerToHyperService::new(warp::service(filter))
}

/// Serves `service` (a clone per connection) on `listener` within `limits` and `slots`
/// (a client accepted past the cap waits, unserved, until a slot frees; further clients
/// wait in the listen backlog) until `stop` completes, then waits for the open
/// connections to finish their requests. With `tls`, each connection first completes a
/// handshake within the header read timeout. Each request carries the client's address
/// as a [`Peer`] extension.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    service: S,
    limits: ConnectionLimits,
    slots: ConnectionSlots,
    stop: impl Future<Output = ()>,
) where
    S: HyperService<Request<Incoming>, Response = hyper::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let permits = Arc::clone(&slots.permits);
    let mut at_cap = false;
    tokio::pin!(stop);
    loop {
        // Accept first, then wait for a slot: a worker that holds a slot while waiting in
        // `accept` would leave it unused while another worker's clients wait.
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cannot accept an HTTP connection; retrying shortly");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if permits.available_permits() == 0 && !at_cap {
            tracing::warn!(
                max_connections = slots.max,
                "HTTP connection limit reached; new connections wait until one closes (health checks are answered from a reserve)"
            );
        }
        let slot = match take_slot(&slots) {
            Some(slot) => slot,
            None => tokio::select! {
                slot = wait_for_slot(&slots) => slot,
                () = &mut stop => break,
            },
        };
        at_cap = permits.available_permits() == 0;
        let _ = stream.set_nodelay(true);
        let inner = service.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone().map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(async move {
            match slot {
                Slot::Regular(permit) => {
                    serve_accepted(stream, peer, tls, inner, limits, watcher).await;
                    drop(permit);
                }
                Slot::Reserved(held) => {
                    reserve::serve(stream, peer, tls, inner, limits, watcher, held).await;
                }
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// What a served connection holds until it closes.
enum Slot {
    /// One of the `max_connections` slots.
    Regular(OwnedSemaphorePermit),
    /// A place in the health checks' reserve, past them.
    Reserved(Held),
}

/// A free slot, or past the cap a place in the health checks' reserve (free, or taken
/// from a silent connection); none when neither can be had now.
fn take_slot(slots: &ConnectionSlots) -> Option<Slot> {
    if let Ok(permit) = Arc::clone(&slots.permits).try_acquire_owned() {
        return Some(Slot::Regular(permit));
    }
    slots.reserve.as_ref()?.try_take().map(Slot::Reserved)
}

/// Waits for a slot or a place in the reserve, whichever comes first.
async fn wait_for_slot(slots: &ConnectionSlots) -> Slot {
    let slot = Arc::clone(&slots.permits).acquire_owned();
    let Some(reserve) = &slots.reserve else {
        return Slot::Regular(slot.await.expect("the semaphore is never closed"));
    };
    tokio::select! {
        permit = slot => Slot::Regular(permit.expect("the semaphore is never closed")),
        held = reserve.take() => Slot::Reserved(held),
    }
}

/// Serves an accepted connection, after its TLS handshake when `tls` (within the header
/// read timeout).
async fn serve_accepted<S, B>(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    inner: S,
    limits: ConnectionLimits,
    watcher: Watcher,
) where
    S: HyperService<Request<Incoming>, Response = hyper::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(tls) = tls else {
        let service = with_peer(inner, peer, None);
        return connection(stream, service, limits, watcher, true).await;
    };
    match tokio::time::timeout(limits.header_read_timeout, tls.accept(stream)).await {
        Ok(Ok(stream)) => {
            let service = with_peer(inner, peer, peer_certificate(&stream));
            connection(stream, service, limits, watcher, true).await;
        }
        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

/// The certificate the client presented in `stream`'s handshake, if any.
fn peer_certificate(
    stream: &tokio_rustls::server::TlsStream<TcpStream>,
) -> Option<PeerCertificate> {
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| PeerCertificate(Arc::new(c.clone().into_owned())))
}

/// Serves one connection's requests until it closes, stalls past the idle timeout, or
/// the server shuts down.
async fn connection<IO, S, B>(
    io: IO,
    service: S,
    limits: ConnectionLimits,
    watcher: Watcher,
    keep_alive: bool,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: HyperService<Request<Incoming>, Response = hyper::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (stream, activity) = Watched::new(io);
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(keep_alive)
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service);
    let connection = watcher.watch(connection);
    tokio::select! {
        result = connection => if let Err(error) = result {
            tracing::debug!(%error, "HTTP connection ended with an error");
        },
        () = activity.stalled(limits.idle_timeout, limits.request_timeout) => {
            tracing::debug!(
                idle = ?limits.idle_timeout,
                request = ?limits.request_timeout,
                "closing an HTTP connection that made no progress or took too long over a request"
            );
        }
    }
}

/// No request is being read: the connection last wrote, or has read nothing yet.
const ANSWERED: u64 = u64::MAX;

/// When a connection last moved a byte, and since when it has been reading a request
/// without answering it, in milliseconds since it opened.
struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
    reading_since_ms: AtomicU64,
}

impl Activity {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// A byte moved: read (a request being received) or written (an answer).
    fn touch(&self, read: bool) {
        let ms = self.now_ms();
        self.last_ms.store(ms, Ordering::Relaxed);
        if !read {
            self.reading_since_ms.store(ANSWERED, Ordering::Relaxed);
        } else if self.reading_since_ms.load(Ordering::Relaxed) == ANSWERED {
            self.reading_since_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// Completes once no byte has moved for `idle`, or a request has been read for
    /// `request` without a byte of its answer.
    async fn stalled(&self, idle: Duration, request: Duration) {
        loop {
            let at = |ms: u64| self.opened + Duration::from_millis(ms);
            let mut deadline = at(self.last_ms.load(Ordering::Relaxed)) + idle;
            let reading = self.reading_since_ms.load(Ordering::Relaxed);
            if reading != ANSWERED {
                deadline = deadline.min(at(reading) + request);
            }
            if Instant::now() >= deadline {
                return;
            }
            // Woken at least every second, so a request that starts later is timed too.
            let wake = deadline.min(Instant::now() + Duration::from_secs(1));
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// A stream that records its last read or write.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    fn new(inner: S) -> (Watched<S>, Arc<Activity>) {
        let activity = Arc::new(Activity {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
            reading_since_ms: AtomicU64::new(ANSWERED),
        });
        let watched = Watched {
            inner,
            activity: Arc::clone(&activity),
        };
        (watched, activity)
    }

    fn progress<T>(
        &self,
        poll: Poll<io::Result<T>>,
        moved: bool,
        read: bool,
    ) -> Poll<io::Result<T>> {
        if moved && matches!(poll, Poll::Ready(Ok(_))) {
            self.activity.touch(read);
        }
        poll
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        let moved = buf.filled().len() > before;
        self.progress(poll, moved, true)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        let moved = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        self.progress(poll, moved, false)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        let moved = matches!(poll, Poll::Ready(Ok(n)) if n > 0);
        self.progress(poll, moved, false)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Connection limits of an HTTP listener (every service of the workspace).
#[derive(Clone, Debug, Args)]
pub struct HttpLimitsSettings {
    /// Time a client has to send a request's headers, from the connection's start or
    /// its previous response (so also how long a keep-alive connection may sit idle).
    #[arg(long, env, default_value = "10s", value_parser = go_duration)]
    pub http_header_read_timeout: Duration,
    /// A connection that moves no byte for this long is closed (a stalled body).
    #[arg(long, env, default_value = "60s", value_parser = go_duration)]
    pub http_idle_timeout: Duration,
    /// Time a request may take from its first byte to the first byte of its answer; a
    /// connection past it is closed (a body trickled a byte at a time).
    #[arg(long, env, default_value = "30s", value_parser = go_duration)]
    pub http_request_timeout: Duration,
    /// Open connections per listener at most (every worker's HTTP listener counts as one
    /// listener); more wait in the listen backlog.
    #[arg(long, env, default_value_t = 1024)]
    pub http_max_connections: usize,
}

impl HttpLimitsSettings {
    /// The limits for [`serve`].
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: self.http_header_read_timeout,
            idle_timeout: self.http_idle_timeout,
            request_timeout: self.http_request_timeout,
        }
    }

    /// A new connection cap of HTTP_MAX_CONNECTIONS, for one listener.
    pub fn connection_slots(&self) -> ConnectionSlots {
        ConnectionSlots::new(self.http_max_connections)
    }
}
