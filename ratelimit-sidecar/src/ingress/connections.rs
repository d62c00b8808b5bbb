//! gRPC connections, served by hyper's HTTP/2 directly.
//!
//! Each worker accepts its own connections (TCP, TLS or the unix socket) and serves them
//! with [`Methods`]: `ShouldRateLimit` is answered by [`grpc`](crate::ingress::grpc)
//! without passing through a router, every other method goes to tonic's routes (the
//! Rate Limit Quota Service and `grpc.health.v1`). What a client can hold is bounded:
//! - a worker serves at most its share of GRPC_MAX_CONNECTIONS; past it, new clients
//!   wait in the kernel's listen backlog, holding no descriptor of ours;
//! - a connection must send the HTTP/2 preface and its first frame within
//!   GRPC_PREFACE_TIMEOUT, or it is closed;
//! - each connection may have GRPC_MAX_CONCURRENT_STREAMS calls open (SETTINGS);
//! - a connection older than GRPC_MAX_CONNECTION_AGE (±10 %) is sent a GOAWAY, and
//!   closed GRPC_MAX_CONNECTION_AGE_GRACE later if calls are still open.
//!
//! When the server stops, every connection is sent a GOAWAY, its calls in flight
//! finish, and [`serve`] returns once the last connection has closed.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::Either as OneOf;
use futures_util::{Stream, StreamExt};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::{Semaphore, watch};
use tonic::codegen::{Service as _, http};
use tonic::service::Routes;

use crate::ingress::grpc::{self, Boxed, Call, Reply};
use crate::service::Service as Decider;

/// The connection bounds of one worker.
#[derive(Clone, Copy, Debug)]
pub struct GrpcLimits {
    /// Connections this worker serves at once.
    pub max_connections: usize,
    /// Calls open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Time to send the HTTP/2 preface and the first frame.
    pub preface_timeout: Duration,
    /// Age after which a connection is sent a GOAWAY (±10 %).
    pub max_connection_age: Duration,
    /// Time an aged connection's calls have to finish.
    pub max_connection_age_grace: Duration,
}

/// The client's connection preface (RFC 9113, 3.4), then a frame header: what a client
/// must send before anything else.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FIRST_FRAME_HEADER: usize = 9;

/// What one connection serves: `ShouldRateLimit` directly, the rest through tonic.
#[derive(Clone)]
pub struct Methods {
    decider: Arc<Decider>,
    others: Routes,
}

impl Methods {
    /// `ShouldRateLimit` on `decider`; every other method on `others`.
    pub fn new(decider: Arc<Decider>, others: Routes) -> Methods {
        Methods { decider, others }
    }
}

impl hyper::service::Service<http::Request<Incoming>> for Methods {
    type Response = http::Response<Reply>;
    type Error = Infallible;
    type Future = OneOf<Call, Boxed>;

    fn call(&self, request: http::Request<Incoming>) -> OneOf<Call, Boxed> {
        if request.uri().path() == grpc::SHOULD_RATE_LIMIT {
            return OneOf::Left(grpc::call(Arc::clone(&self.decider), request));
        }
        let mut others = self.others.clone();
        OneOf::Right(Box::pin(async move {
            let response = others.call(request).await?;
            Ok(response.map(Either::Right))
        }))
    }
}

/// Serves the connections `incoming` yields with `methods` until `stop` completes, then
/// drains them. `incoming` is polled only while this worker has a free connection slot.
pub async fn serve<I, IO>(
    incoming: I,
    methods: Methods,
    limits: GrpcLimits,
    stop: impl Future<Output = ()>,
) where
    I: Stream<Item = io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing, closed) = watch::channel(false);
    let mut at_cap = false;
    tokio::pin!(stop, incoming);
    loop {
        let full = slots.available_permits() == 0;
        if full && !at_cap {
            tracing::warn!(
                max_connections = limits.max_connections,
                "gRPC connection limit reached on this worker; new clients wait in the backlog"
            );
        }
        at_cap = full;
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => permit.expect("never closed"),
            () = &mut stop => break,
        };
        let accepted = tokio::select! {
            accepted = incoming.next() => accepted,
            () = &mut stop => break,
        };
        let io = match accepted {
            Some(Ok(io)) => io,
            Some(Err(error)) => {
                tracing::warn!(%error, "cannot accept a gRPC connection; retrying shortly");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            None => break,
        };
        let connection = connection(io, methods.clone(), builder.clone(), limits, closed.clone());
        tokio::spawn(async move {
            connection.await;
            drop(permit);
        });
    }
    let _ = closing.send(true);
    // Every connection holds a slot until it closes.
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

/// Serves one connection: its preface within the timeout, then its calls until it
/// closes, ages out or the server stops.
async fn connection<IO>(
    mut io: IO,
    methods: Methods,
    builder: http2::Builder<TokioExecutor>,
    limits: GrpcLimits,
    mut closing: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let read = tokio::time::timeout(limits.preface_timeout, preface(&mut io));
    let start = match read.await {
        Ok(Ok(start)) => start,
        Ok(Err(error)) => {
            return tracing::debug!(%error, "a gRPC connection ended before its preface");
        }
        Err(_) => {
            return tracing::debug!(
                timeout = ?limits.preface_timeout,
                "closing a gRPC connection that sent no HTTP/2 preface in time"
            );
        }
    };
    let io = TokioIo::new(Rewind { start, inner: io });
    let connection = builder.serve_connection(io, methods);
    tokio::pin!(connection);
    let aged = unless_unlimited(jittered(limits.max_connection_age));
    let stopping = async move {
        let _ = closing.wait_for(|closing| *closing).await;
    };
    tokio::pin!(aged, stopping);
    tokio::select! {
        result = &mut connection => return ended(result),
        () = &mut aged => {}
        () = &mut stopping => {
            // The server stops: no new calls; the calls in flight finish.
            connection.as_mut().graceful_shutdown();
            return ended(connection.await);
        }
    }
    connection.as_mut().graceful_shutdown();
    let grace = limits.max_connection_age_grace;
    tokio::select! {
        result = &mut connection => ended(result),
        () = unless_unlimited(grace) => {
            tracing::debug!(?grace, "closing an aged gRPC connection after its grace");
        }
    }
}

/// Completes after `limit`, or never when it is 0, which grpc-go (upstream's server)
/// reads as no limit for a connection's age and its grace.
async fn unless_unlimited(limit: Duration) {
    match limit.is_zero() {
        true => std::future::pending().await,
        false => tokio::time::sleep(limit).await,
    }
}

fn ended(result: Result<(), hyper::Error>) {
    if let Err(error) = result {
        tracing::debug!(%error, "a gRPC connection ended with an error");
    }
}

/// Reads the client's preface and the header of its first frame (which must be
/// SETTINGS: hyper checks that), and returns the bytes read so far.
async fn preface<IO: AsyncRead + Unpin>(io: &mut IO) -> io::Result<Bytes> {
    let want = PREFACE.len() + FIRST_FRAME_HEADER;
    let mut start = BytesMut::with_capacity(want.max(1024));
    while start.len() < want {
        if io.read_buf(&mut start).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // Not HTTP/2: hyper answers that with a GOAWAY at once.
        let seen = start.len().min(PREFACE.len());
        if start[..seen] != PREFACE[..seen] {
            break;
        }
    }
    Ok(start.freeze())
}

/// `age` moved by up to 10 % either way, so that connections opened together do not all
/// reconnect together (as grpc-go does).
fn jittered(age: Duration) -> Duration {
    let tenth = age / 10;
    age - tenth + tenth.mul_f64(2.0 * fastrand::f64())
}

/// A stream whose first bytes were already read: they are read again first.
struct Rewind<IO> {
    start: Bytes,
    inner: IO,
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
