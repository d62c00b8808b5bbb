//! What each worker serves: gRPC (TCP, or connections handed over from the unix socket)
//! and the HTTP front end, until the stop signal, then draining.

use std::future::Future;
use std::net::TcpListener as StdTcpListener;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;

use crate::grpc::Grpc;
use crate::serve::{self, ConnectionLimits, ConnectionSlots};
use crate::service::Service;
use crate::settings::ServerSettings;
use crate::uds::AuthorityFix;
use crate::{http, workers};

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
    pub service: Arc<Service>,
    /// `grpc.health.v1.Health`.
    pub health: HealthServer<HealthService>,
    /// The server settings.
    pub server: Arc<ServerSettings>,
    /// HTTP_HEADER_READ_TIMEOUT and HTTP_IDLE_TIMEOUT.
    pub limits: ConnectionLimits,
    /// HTTP_MAX_CONNECTIONS, over every worker's HTTP listener.
    pub slots: ConnectionSlots,
    /// Turns true when the server stops.
    pub stop: watch::Receiver<bool>,
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

/// Serves one worker's listeners until the stop signal and its connections drain.
/// Runs on that worker's runtime.
pub async fn serve_worker(shared: Shared, listeners: WorkerListeners) {
    let http = match TcpListener::from_std(listeners.http) {
        Ok(listener) => tokio::spawn(serve::serve(
            listener,
            serve::warp_filter(http::routes(
                Arc::clone(&shared.service),
                shared.server.max_json_body_bytes,
            )),
            shared.limits,
            shared.slots.clone(),
            shared.stopped(),
        )),
        Err(error) => {
            tracing::error!(%error, worker = workers::current(), "cannot serve HTTP");
            tokio::spawn(async {})
        }
    };
    let grpc = tonic::transport::Server::builder()
        .max_connection_age(shared.server.grpc_max_connection_age)
        .max_connection_age_grace(shared.server.grpc_max_connection_age_grace)
        .add_service(Grpc(Arc::clone(&shared.service)))
        .add_service(shared.health.clone());
    let served = match listeners.grpc {
        GrpcSource::Tcp(listener) => match TcpListener::from_std(listener) {
            Ok(listener) => {
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                grpc.serve_with_incoming_shutdown(incoming, shared.stopped())
                    .await
            }
            Err(error) => {
                tracing::error!(%error, worker = workers::current(), "cannot serve gRPC");
                Ok(())
            }
        },
        GrpcSource::Unix(connections) => {
            let incoming = UnboundedReceiverStream::new(connections)
                .map(|stream| UnixStream::from_std(stream).map(AuthorityFix::new));
            grpc.serve_with_incoming_shutdown(incoming, shared.stopped())
                .await
        }
    };
    if let Err(error) = served {
        tracing::error!(%error, worker = workers::current(), "gRPC server failed");
    }
    let _ = http.await;
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
