//! The listeners: opening them (TCP ports shared by the workers, the unix socket, the
//! debug port), and what each worker serves on them: gRPC (TCP, or connections handed
//! over from the unix socket) and the HTTP front end, until the stop signal, then
//! draining, over TLS when configured ([`crate::ingress::tls`]).

use std::future::Future;
use std::net::TcpListener as StdTcpListener;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;

use crate::observe::health::GrpcHealth;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::service::Routes;
use tonic_health::pb::health_server::HealthServer;

use crate::decider::Decider;
use crate::ingress::connections::{self, GrpcLimits, GrpcSlots, Methods};
use crate::ingress::http;
use crate::ingress::tls::ServerTls;
use crate::ingress::uds::AuthorityFix;
use crate::rlqs::Rlqs;
use crate::runtime;
use crate::settings::ServerSettings;
use ratelimit_service_kit::serve::{self, ConnectionLimits, ConnectionSlots};

/// Where one worker's gRPC connections come from.
pub enum GrpcSource {
    /// Its own listener on the shared port.
    Tcp(StdTcpListener),
    /// Connections accepted on the unix socket by [`hand_out`].
    Unix(mpsc::UnboundedReceiver<StdUnixStream>),
}

/// Everything one worker serves.
pub struct WorkerListeners {
    /// gRPC.
    pub grpc: GrpcSource,
    /// `/json` and `/healthcheck`.
    pub http: StdTcpListener,
}

/// What every worker shares.
#[derive(Clone)]
pub struct Shared {
    /// The decision service.
    pub service: Arc<Decider>,
    /// `grpc.health.v1.Health`.
    pub health: HealthServer<GrpcHealth>,
    /// The server settings.
    pub server: Arc<ServerSettings>,
    /// HTTP_HEADER_READ_TIMEOUT and HTTP_IDLE_TIMEOUT.
    pub limits: ConnectionLimits,
    /// HTTP_MAX_CONNECTIONS, over every worker's HTTP listener.
    pub slots: ConnectionSlots,
    /// GRPC_MAX_CONNECTIONS, over every worker's gRPC listener.
    pub grpc_slots: GrpcSlots,
    /// Turns true when the server stops.
    pub stop: watch::Receiver<bool>,
    /// The listeners' TLS, when GRPC_SERVER_USE_TLS.
    pub tls: Option<Arc<ServerTls>>,
    /// The Rate Limit Quota Service.
    pub rlqs: Rlqs,
}

impl Shared {
    /// Completes when the server stops.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}

/// A listener that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {what} {address}: {error}")]
pub struct ListenError {
    /// Which listener.
    pub what: &'static str,
    /// Where.
    pub address: String,
    /// Why.
    pub error: std::io::Error,
}

/// Every listener of the server, open.
pub struct Opened {
    /// One set per worker, in worker order.
    pub workers: Vec<WorkerListeners>,
    /// The debug server's, served by worker 0.
    pub debug: TcpListener,
    /// The unix socket, when gRPC is served there: accepted by [`hand_out`].
    pub uds: Option<(UnixListener, Vec<mpsc::UnboundedSender<StdUnixStream>>)>,
}

/// Opens the listeners `server` describes for `workers` workers. Must run on worker 0's
/// runtime (the debug and unix-socket listeners are served there).
pub fn open(server: &ServerSettings, workers: usize) -> Result<Opened, ListenError> {
    let http = bind("HTTP", &server.host, server.port, workers)?;
    let (grpc, uds) = if server.grpc_uds.is_empty() {
        let tcp = bind("gRPC", &server.grpc_host, server.grpc_port, workers)?;
        (tcp.into_iter().map(GrpcSource::Tcp).collect(), None)
    } else {
        let path = &server.grpc_uds;
        let listener = UnixListener::bind(path).map_err(|error| ListenError {
            what: "gRPC",
            address: path.clone(),
            error,
        })?;
        tracing::info!(socket = %path, "listening for gRPC");
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..workers).map(|_| mpsc::unbounded_channel()).unzip();
        let sources: Vec<GrpcSource> = receivers.into_iter().map(GrpcSource::Unix).collect();
        (sources, Some((listener, senders)))
    };
    let debug = single("debug", &server.debug_host, server.debug_port)?;
    let workers = grpc
        .into_iter()
        .zip(http)
        .map(|(grpc, http)| WorkerListeners { grpc, http })
        .collect();
    Ok(Opened {
        workers,
        debug,
        uds,
    })
}

/// One listener on `host:port`, served by worker 0 (debug, Prometheus). Must run on
/// worker 0's runtime.
pub fn single(what: &'static str, host: &str, port: u16) -> Result<TcpListener, ListenError> {
    let listener = bind(what, host, port, 1)?.pop().expect("one listener");
    TcpListener::from_std(listener).map_err(|error| ListenError {
        what,
        address: format!("{host}:{port}"),
        error,
    })
}

/// `count` listeners on `host:port` sharing the port (see [`runtime::listeners`]).
fn bind(
    what: &'static str,
    host: &str,
    port: u16,
    count: usize,
) -> Result<Vec<StdTcpListener>, ListenError> {
    let address = format!("{host}:{port}");
    let listeners = runtime::listeners(host, port, count).map_err(|error| ListenError {
        what,
        address: address.clone(),
        error,
    })?;
    let local = listeners[0].local_addr().map_or(address, |a| a.to_string());
    tracing::info!(address = %local, listeners = listeners.len(), "listening for {what}");
    Ok(listeners)
}

/// Serves one worker's listeners until the stop signal and its connections drain.
/// Runs on that worker's runtime. A listener this runtime cannot take is fatal: the
/// kernel would go on giving it connections that nobody accepts.
pub async fn serve_worker(shared: Shared, listeners: WorkerListeners) {
    let (http, grpc_source) = register(listeners).unwrap_or_else(|error| {
        tracing::error!(%error, worker = runtime::current(), "a worker cannot take its listeners");
        eprintln!("ratelimit: a worker cannot take its listeners: {error}");
        std::process::exit(1)
    });
    let http_tls = shared.tls.as_ref().and_then(|tls| tls.http.clone());
    let http = tokio::spawn(serve::serve(
        http,
        http_tls,
        serve::warp_filter(http::routes(
            Arc::clone(&shared.service),
            shared.server.max_json_body_bytes,
        )),
        shared.limits,
        shared.slots.clone(),
        shared.stopped(),
    ));
    let methods = Methods::new(
        Arc::clone(&shared.service),
        Routes::new(shared.rlqs.server())
            .add_service(shared.health.clone())
            .prepare(),
    );
    let limits = grpc_limits(&shared.server);
    let slots = shared.grpc_slots.clone();
    let stopped = shared.stopped();
    match grpc_source {
        Registered::Tcp(listener) => match &shared.tls {
            Some(tls) => {
                let incoming =
                    ratelimit_service_kit::tls::incoming(listener, Arc::clone(&tls.grpc));
                connections::serve(incoming, methods, limits, slots, stopped).await;
            }
            None => {
                let incoming = TcpListenerStream::new(listener).map(|accepted| {
                    accepted.inspect(|stream| {
                        let _ = stream.set_nodelay(true);
                    })
                });
                connections::serve(incoming, methods, limits, slots, stopped).await;
            }
        },
        Registered::Unix(connections) => {
            let incoming = UnboundedReceiverStream::new(connections)
                .map(|stream| UnixStream::from_std(stream).map(AuthorityFix::new));
            connections::serve(incoming, methods, limits, slots, stopped).await;
        }
    }
    let _ = http.await;
}

/// The gRPC connection bounds each worker applies.
fn grpc_limits(server: &ServerSettings) -> GrpcLimits {
    GrpcLimits {
        max_connection_idle: server.grpc_max_connection_idle,
        max_concurrent_streams: server.grpc_max_concurrent_streams,
        preface_timeout: server.grpc_preface_timeout,
        max_connection_age: server.grpc_max_connection_age,
        max_connection_age_grace: server.grpc_max_connection_age_grace,
    }
}

/// A worker's gRPC source, taken by its runtime.
enum Registered {
    Tcp(TcpListener),
    Unix(mpsc::UnboundedReceiver<StdUnixStream>),
}

/// Registers a worker's listeners with the runtime it runs on.
fn register(listeners: WorkerListeners) -> std::io::Result<(TcpListener, Registered)> {
    let http = TcpListener::from_std(listeners.http)?;
    let grpc = match listeners.grpc {
        GrpcSource::Tcp(listener) => Registered::Tcp(TcpListener::from_std(listener)?),
        GrpcSource::Unix(connections) => Registered::Unix(connections),
    };
    Ok((http, grpc))
}

/// Accepts on the unix socket and hands each connection to the next worker in turn, until
/// the stop signal.
pub async fn hand_out(
    listener: UnixListener,
    workers: Vec<mpsc::UnboundedSender<StdUnixStream>>,
    stopped: impl Future<Output = ()>,
) {
    tokio::pin!(stopped);
    for next in (0..workers.len()).cycle() {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stopped => return,
        };
        let stream = match accepted.and_then(|(stream, _)| stream.into_std()) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a gRPC connection on the unix socket");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = workers[next].send(stream);
    }
}
