//! gRPC connections, served by hyper's HTTP/2 directly.
//!
//! Each worker accepts its own connections (TCP, TLS or the unix socket) and serves them
//! with [`Methods`]: `ShouldRateLimit` is answered by [`grpc`](crate::ingress::grpc)
//! without passing through a router, every other method goes to tonic's routes (the
//! Rate Limit Quota Service and `grpc.health.v1`). What a client can hold is bounded:
//! - the workers together serve at most GRPC_MAX_CONNECTIONS; a worker accepts only
//!   while a slot is free, so past the cap new clients wait in the kernel's listen
//!   backlog, holding no descriptor of ours (a worker that accepts one as the last slot
//!   goes elsewhere holds that one until a slot frees);
//! - a connection must send the HTTP/2 preface and a whole SETTINGS frame within
//!   GRPC_PREFACE_TIMEOUT, or it is closed ([`preface`]);
//! - each connection may have GRPC_MAX_CONCURRENT_STREAMS calls open (SETTINGS);
//! - a connection with no call open for GRPC_MAX_CONNECTION_IDLE is sent a GOAWAY
//!   ([`idle`]);
//! - a connection older than GRPC_MAX_CONNECTION_AGE (±10 %) is sent a GOAWAY, and
//!   closed GRPC_MAX_CONNECTION_AGE_GRACE later if calls are still open.
//!
//! When the server stops, every connection is sent a GOAWAY, its calls in flight
//! finish, and [`serve`] returns once the last connection has closed.

mod idle;
mod preface;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either as OneOf;
use futures_util::{Stream, StreamExt};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, mpsc, watch};
use tonic::codegen::{Service as _, http};
use tonic::service::Routes;

use crate::decider::Decider;
use crate::ingress::grpc::{self, Responded, ResponseBody, ShouldRateLimitCall};
use idle::{Activity, Marked, Opened};
use preface::{Rewind, Start};

/// The connection bounds every worker applies.
#[derive(Clone, Copy, Debug)]
pub struct GrpcLimits {
    /// Calls open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Time to send the HTTP/2 preface and the first frame.
    pub preface_timeout: Duration,
    /// Time without a call after which a connection is sent a GOAWAY; 0 is no limit.
    pub max_connection_idle: Duration,
    /// Age after which a connection is sent a GOAWAY (±10 %).
    pub max_connection_age: Duration,
    /// Time an aged connection's calls have to finish.
    pub max_connection_age_grace: Duration,
}

/// GRPC_MAX_CONNECTIONS, shared by every worker: one permit per connection served.
#[derive(Clone, Debug)]
pub struct GrpcSlots(Arc<Semaphore>);

impl GrpcSlots {
    /// At most `max` connections (at least one) over every worker.
    pub fn new(max: usize) -> GrpcSlots {
        GrpcSlots(Arc::new(Semaphore::new(max.max(1))))
    }
}

/// A call to one of the other methods, through tonic's router.
type RoutedCall = Pin<Box<dyn Future<Output = Responded> + Send>>;

/// What one connection serves: `ShouldRateLimit` directly, the rest through tonic; each
/// call marked open on its connection until its answer is sent.
#[derive(Clone)]
pub struct Methods {
    decider: Arc<Decider>,
    others: Routes,
    activity: Option<Arc<Activity>>,
}

impl Methods {
    /// `ShouldRateLimit` on `decider`; every other method on `others`.
    pub fn new(decider: Arc<Decider>, others: Routes) -> Methods {
        Methods {
            decider,
            others,
            activity: None,
        }
    }

    /// These methods for one connection, whose calls `activity` counts.
    fn on(&self, activity: &Arc<Activity>) -> Methods {
        Methods {
            activity: Some(Arc::clone(activity)),
            ..self.clone()
        }
    }

    fn route(&self, request: http::Request<Incoming>) -> OneOf<ShouldRateLimitCall, RoutedCall> {
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

impl hyper::service::Service<http::Request<Incoming>> for Methods {
    type Response = http::Response<Opened<ResponseBody>>;
    type Error = Infallible;
    type Future = Marked<OneOf<ShouldRateLimitCall, RoutedCall>>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        Marked {
            open: self.activity.as_ref().map(Activity::open),
            call: self.route(request),
        }
    }
}

/// Serves the connections `incoming` yields with `methods` until `stop` completes, then
/// drains them. `incoming` is polled only while a slot is free.
pub async fn serve<I, IO>(
    incoming: I,
    methods: Methods,
    limits: GrpcLimits,
    slots: GrpcSlots,
    stop: impl Future<Output = ()>,
) where
    I: Stream<Item = io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams);
    let slots = slots.0;
    let (closing, closed) = watch::channel(false);
    // Each connection holds a sender: `recv` ends once every one has closed.
    let (open, mut drained) = mpsc::channel::<()>(1);
    tokio::pin!(stop, incoming);
    loop {
        // Wait for a free slot without taking it: another worker's client may need it.
        tokio::select! {
            free = slots.acquire() => drop(free.expect("never closed")),
            () = &mut stop => break,
        }
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
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => permit,
            // Another worker took the last slot first: this client waits for the next.
            Err(_) => tokio::select! {
                permit = Arc::clone(&slots).acquire_owned() => permit.expect("never closed"),
                () = &mut stop => break,
            },
        };
        if slots.available_permits() == 0 {
            tracing::warn!("gRPC connection limit reached; new clients wait in the backlog");
        }
        let connection = connection(io, methods.clone(), builder.clone(), limits, closed.clone());
        let open = open.clone();
        tokio::spawn(async move {
            connection.await;
            drop((permit, open));
        });
    }
    let _ = closing.send(true);
    drop(open);
    let _ = drained.recv().await;
}

/// Serves one connection: its preface within the timeout, then its calls until it
/// closes, idles, ages out or the server stops.
async fn connection<IO>(
    mut io: IO,
    methods: Methods,
    builder: http2::Builder<TokioExecutor>,
    limits: GrpcLimits,
    mut closing: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let read = tokio::time::timeout(limits.preface_timeout, preface::read(&mut io));
    let start = match read.await {
        Ok(Ok(Start::Read(start))) => start,
        Ok(Ok(Start::Refused(why))) => {
            return tracing::debug!(why, "refused a gRPC connection's first frame");
        }
        Ok(Err(error)) => {
            return tracing::debug!(%error, "a gRPC connection ended before its preface");
        }
        Err(_) => {
            return tracing::debug!(
                timeout = ?limits.preface_timeout,
                "closing a gRPC connection that sent no HTTP/2 preface and SETTINGS in time"
            );
        }
    };
    let activity = Activity::new();
    let io = TokioIo::new(Rewind::new(start, io));
    let connection = builder.serve_connection(io, methods.on(&activity));
    tokio::pin!(connection);
    let aged = unless_unlimited(jittered(limits.max_connection_age));
    let idle = activity.idle_for(limits.max_connection_idle);
    let stopping = async move {
        let _ = closing.wait_for(|closing| *closing).await;
    };
    tokio::pin!(aged, idle, stopping);
    tokio::select! {
        result = &mut connection => return ended(result),
        () = &mut aged => tracing::debug!("sending a GOAWAY to an aged gRPC connection"),
        () = &mut idle => tracing::debug!("sending a GOAWAY to an idle gRPC connection"),
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
            tracing::debug!(?grace, "closing a gRPC connection after its grace");
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

/// `age` moved by up to 10 % either way, so that connections opened together do not all
/// reconnect together (as grpc-go does).
fn jittered(age: Duration) -> Duration {
    let tenth = age / 10;
    age - tenth + tenth.mul_f64(2.0 * fastrand::f64())
}
