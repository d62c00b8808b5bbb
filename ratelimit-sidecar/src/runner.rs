//! Start-up, the three listeners, and shutdown.

use std::future::Future;
use std::sync::Arc;

use ratelimit_core::{Limiter, MemoryStore};
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic_health::ServingStatus;

use crate::convert::HeaderNames;
use crate::grpc::Grpc;
use crate::health::Health;
use crate::provider::{self, FileSource};
use crate::redis_store::RedisBackend;
use crate::service::{Backend, Service};
use crate::settings::{BackendType, ConfigType, Settings};
use crate::{debug, http, serve};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A feature this build does not have yet.
    #[error("{0}")]
    NotAvailable(String),
    /// The counter store could not be reached or is misconfigured.
    #[error("backend: {0}")]
    Backend(#[from] crate::redis_store::RedisError),
    /// A listener could not be opened.
    #[error("cannot listen on {what} {address}: {error}")]
    Listen {
        /// Which listener.
        what: &'static str,
        /// Where.
        address: String,
        /// Why.
        error: std::io::Error,
    },
}

/// Runs until SIGTERM, SIGINT or SIGHUP, then drains and returns.
pub async fn run(settings: Settings) -> Result<(), StartError> {
    if settings.config.config_type == ConfigType::GrpcXdsSotw {
        return Err(StartError::NotAvailable(
            "CONFIG_TYPE=GRPC_XDS_SOTW: the xDS configuration source is not available in this version; use CONFIG_TYPE=FILE".into(),
        ));
    }
    let limiter = Limiter::without_config(settings.core());
    let backend = match settings.backend() {
        BackendType::Memory => {
            tracing::warn!(
                max_counters = settings.limiter.memory_max_counters,
                max_bytes = settings.bounds.memory_max_bytes,
                "using the memory backend: counters are local to this process and not shared with other instances"
            );
            Backend::Memory(
                MemoryStore::new(settings.limiter.memory_max_counters)
                    .with_max_bytes(settings.bounds.memory_max_bytes),
            )
        }
        BackendType::Redis => {
            let errors = limiter
                .stats()
                .counter("ratelimit.service.call.should_rate_limit.redis_error");
            let redis = RedisBackend::connect(
                &settings.redis,
                settings.limiter.expiration_jitter_max_seconds,
                errors,
            )
            .await?;
            tracing::warn!(redis_type = %settings.redis.redis_type, per_second = settings.redis.redis_persecond, "using the redis backend");
            Backend::Redis(redis)
        }
        BackendType::Memcache => {
            return Err(StartError::NotAvailable(
                "BACKEND_TYPE=memcache: this backend is not available in this version; use redis or memory".into(),
            ));
        }
    };
    let headers = settings
        .limiter
        .limit_response_headers_enabled
        .then(|| HeaderNames {
            limit: settings.limiter.limit_limit_header.clone(),
            remaining: settings.limiter.limit_remaining_header.clone(),
            reset: settings.limiter.limit_reset_header.clone(),
        });
    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let health = Health::new(
        settings.config.healthy_with_at_least_one_config_loaded,
        reporter,
    );
    let dynamic_metadata = settings.limiter.response_dynamic_metadata;
    let service = Arc::new(Service::new(
        limiter,
        backend,
        health,
        headers,
        dynamic_metadata,
    ));

    let source = FileSource::new(&settings.config);
    tracing::info!(directory = %source.directory().display(), "loading rate limit configuration");
    provider::apply(&service, source.load()).await;
    let (changes_tx, changes_rx) = mpsc::channel(16);
    let _watcher = match source.watch(changes_tx) {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(%error, "cannot watch the configuration; changes will not be reloaded");
            None
        }
    };
    tokio::spawn(provider::reload_on_change(
        source,
        Arc::clone(&service),
        changes_rx,
    ));
    service.health.publish().await;
    if let (Backend::Redis(redis), true) = (
        &service.backend,
        settings.redis.redis_health_check_active_connection,
    ) {
        tokio::spawn(watch_redis(redis.clone(), Arc::clone(&service)));
    }

    let server = &settings.server;
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    let http_listener = bind("HTTP", &server.host, server.port).await?;
    let debug_listener = bind("debug", &server.debug_host, server.debug_port).await?;
    let limits = settings.bounds.http.connection_limits();
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    tasks.push(tokio::spawn(serve::serve(
        http_listener,
        serve::warp_filter(http::routes(
            Arc::clone(&service),
            server.max_json_body_bytes,
        )),
        limits,
        stopped(),
    )));
    tasks.push(tokio::spawn(serve::serve(
        debug_listener,
        debug::Debug(Arc::clone(&service)),
        limits,
        stopped(),
    )));

    let grpc = tonic::transport::Server::builder()
        .max_connection_age(server.grpc_max_connection_age)
        .max_connection_age_grace(server.grpc_max_connection_age_grace)
        .tcp_nodelay(true)
        .add_service(Grpc(Arc::clone(&service)))
        .add_service(health_service);
    let grpc_task = if server.grpc_uds.is_empty() {
        let listener = bind("gRPC", &server.grpc_host, server.grpc_port).await?;
        spawn_grpc(grpc.serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopped()))
    } else {
        let path = &server.grpc_uds;
        let listener = UnixListener::bind(path).map_err(|error| StartError::Listen {
            what: "gRPC",
            address: path.clone(),
            error,
        })?;
        tracing::warn!(socket = %path, "listening for gRPC");
        let incoming = UnixListenerStream::new(listener)
            .map(|accepted| accepted.map(crate::uds::AuthorityFix::new));
        spawn_grpc(grpc.serve_with_incoming_shutdown(incoming, stopped()))
    };
    tasks.push(grpc_task);

    let signal = wait_for_signal().await;
    tracing::warn!(
        signal,
        "shutting down: no new connections, draining requests in flight"
    );
    if signal == "SIGTERM" {
        service.health.terminating().await;
    }
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(server.shutdown_drain_timeout, async {
        for task in tasks {
            let _ = task.await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("requests still in flight after SHUTDOWN_DRAIN_TIMEOUT; exiting anyway");
    }
    if !server.grpc_uds.is_empty() {
        let _ = std::fs::remove_file(&server.grpc_uds);
    }
    Ok(())
}

fn spawn_grpc<E: std::fmt::Display>(
    future: impl Future<Output = Result<(), E>> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(error) = future.await {
            tracing::error!(%error, "gRPC server failed");
        }
    })
}

/// Backend health follows whether Redis answers a PING, checked every second.
async fn watch_redis(redis: RedisBackend, service: Arc<Service>) {
    loop {
        let alive = redis.ping().await;
        service.health.set_backend(alive).await;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

async fn bind(what: &'static str, host: &str, port: u16) -> Result<TcpListener, StartError> {
    let address = format!("{host}:{port}");
    let listener = TcpListener::bind(&address)
        .await
        .map_err(|error| StartError::Listen {
            what,
            address: address.clone(),
            error,
        })?;
    let local = listener.local_addr().map_or(address, |a| a.to_string());
    tracing::warn!(address = %local, "listening for {what}");
    Ok(listener)
}

async fn wait_for_signal() -> &'static str {
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = hup.recv() => "SIGHUP",
    }
}
