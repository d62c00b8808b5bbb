//! Start-up, the workers and their listeners, and shutdown.

use std::sync::Arc;

use ratelimit_core::stats::names;
use ratelimit_core::{HeaderFormat, HeaderNames, Limiter};

use crate::decider::outage::Outage;
use crate::rlqs::Rlqs;
use crate::settings::HeadersFormat;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{oneshot, watch};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use crate::backend::{self, Backend, BackendError};
use crate::decider::Decider;
use crate::ingress::connections::GrpcSlots;
use crate::ingress::descriptors;
use crate::ingress::listeners::{self, ListenError, Shared};
use crate::ingress::tls::ServerTls;
use crate::observe::debug;
use crate::observe::health::{GrpcHealth, Health};
use crate::observe::sinks::prometheus::Prometheus;
use crate::observe::sinks::{self, Flusher};
use crate::observe::traces::Traces;
use crate::rules::files::{self, FileSource};
use crate::rules::xds;
use crate::runtime::{self, AdminThread, Pool};
use crate::settings::{ConfigType, Settings};
use ratelimit_service_kit::serve;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The counter store could not be reached or is misconfigured.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// The worker threads could not be started.
    #[error("cannot start the worker threads: {0}")]
    Workers(std::io::Error),
    /// A listener could not be opened.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// A statistics output is misconfigured (a bad PROMETHEUS_MAPPER_YAML).
    #[error("statistics: {0}")]
    Stats(String),
    /// The xDS client's settings are unusable.
    #[error("xDS: {0}")]
    Xds(String),
    /// A TLS file is missing or unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The trace exporter cannot be built.
    #[error("traces: {0}")]
    Traces(String),
}

/// Runs until SIGTERM, SIGINT or SIGHUP, then drains and returns. `settings` come from
/// [`Settings::load`], which refuses those of features this version does not have. Must
/// run on a single-threaded runtime: it is worker 0.
pub async fn run(settings: Settings) -> Result<(), StartError> {
    let pool =
        Pool::start(runtime::count(settings.server.grpc_workers)).map_err(StartError::Workers)?;
    tracing::info!(
        workers = pool.workers(),
        "serving on one single-threaded runtime per worker"
    );
    let limiter = Limiter::without_config(settings.core());
    let backend = backend::open(&settings, &pool, limiter.stats()).await?;
    let traces = Traces::start(&settings.tracing).map_err(StartError::Traces)?;
    let (service, health) = service(&settings, limiter, backend, traces, pool.workers()).await;
    let _watcher = match settings.config.config_type {
        ConfigType::File => load_rules(&settings, &service).await,
        ConfigType::GrpcXdsSotw => {
            follow_xds(&settings, &service).await?;
            None
        }
    };
    if service.backend.remote().is_some() {
        let ping = settings.redis.redis_health_check_active_connection;
        tokio::spawn(watch_backend(Arc::clone(&service), ping));
    }
    if let Backend::WriteBehind(behind) = &service.backend {
        tokio::spawn(Arc::clone(behind).run());
    }

    let server = &settings.server;
    let tls = ServerTls::load(&settings.tls).map_err(StartError::Tls)?;
    let http_connections = settings.bounds.http.http_max_connections as u64;
    // The gRPC listeners (and one client per worker waiting for a slot), the HTTP ones,
    // and the debug listener's own cap.
    let grpc_connections = u64::from(server.grpc_max_connections) + pool.workers() as u64;
    descriptors::fit(grpc_connections + 2 * http_connections);
    let opened = listeners::open(server, pool.workers())?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let shared = Shared {
        service: Arc::clone(&service),
        health,
        server: Arc::new(server.clone()),
        limits: settings.bounds.http.connection_limits(),
        slots: settings
            .bounds
            .http
            .connection_slots()
            .with_health_reserve(&["/healthcheck"]),
        grpc_slots: GrpcSlots::new(server.grpc_max_connections as usize),
        stop: stop_rx,
        tls: tls.map(Arc::new),
        rlqs: Rlqs::new(
            Arc::clone(&service),
            server.rlqs_assignment_ttl,
            server.rlqs_max_streams as usize,
        ),
    };
    if let Some((listener, workers)) = opened.uds {
        tokio::spawn(listeners::hand_out(listener, workers, shared.stopped()));
    }
    // The debug and Prometheus listeners run on their own thread: no worker decides
    // while a large `/explain` or dashboard answer is built.
    let side = AdminThread::start("ratelimit-debug").map_err(StartError::Workers)?;
    let (routes, limits) = (
        debug::Debug(Arc::clone(&service), server.max_json_body_bytes),
        shared.limits,
    );
    let (slots, stopped) = (settings.bounds.http.connection_slots(), shared.stopped());
    let debug = side.serve(opened.debug, move |listener| {
        serve::serve(listener, None, routes, limits, slots, stopped)
    });
    let flusher = statistics(&settings, &shared, &side)?;
    let worker_shared = shared.clone();
    let serving = tokio::spawn(async move {
        pool.on_each(opened.workers, move |listeners| {
            listeners::serve_worker(worker_shared.clone(), listeners)
        })
        .await;
        // The worker threads end with the pool, once every one of them has drained.
        drop(pool);
    });

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
        let _ = serving.await;
        let _ = debug.await;
    })
    .await;
    if drained.is_err() {
        tracing::warn!("requests still in flight after SHUTDOWN_DRAIN_TIMEOUT; exiting anyway");
    }
    if let Some(flusher) = flusher {
        let _ = tokio::task::spawn_blocking(move || flusher.stop()).await;
    }
    if let Some(traces) = &service.traces {
        traces.shutdown().await;
    }
    if !server.grpc_uds.is_empty() {
        let _ = std::fs::remove_file(&server.grpc_uds);
    }
    Ok(())
}

/// Starts the statistics outputs: the push thread, and the Prometheus endpoint served on
/// `side` until the stop signal.
fn statistics(
    settings: &Settings,
    shared: &Shared,
    side: &AdminThread,
) -> Result<Option<Flusher>, StartError> {
    let stats = &settings.stats;
    let outputs = stats.outputs().map_err(StartError::Stats)?;
    if outputs.prometheus {
        let mapper = sinks::prometheus_mapper(stats).map_err(StartError::Stats)?;
        let address = &stats.prometheus_addr;
        let listener = listeners::single("Prometheus", &address.host, address.port)?;
        let endpoint = Prometheus {
            stats: Arc::clone(shared.service.limiter.stats()),
            mapper: Arc::new(mapper),
            labels: Arc::new(stats.extra_tags.clone().into_iter().collect()),
            path: stats.prometheus_path.as_str().into(),
        };
        let (limits, slots) = (shared.limits, settings.bounds.http.connection_slots());
        let stopped = shared.stopped();
        side.serve(listener, move |listener| {
            serve::serve(listener, None, endpoint, limits, slots, stopped)
        });
    }
    let push = sinks::push_outputs(stats, outputs);
    Ok(Flusher::start(
        Arc::clone(shared.service.limiter.stats()),
        push,
        stats.stats_flush_interval,
    ))
}

/// The decision service, and the gRPC health service that follows its health.
async fn service(
    settings: &Settings,
    limiter: Limiter,
    backend: Backend,
    traces: Option<Traces>,
    workers: usize,
) -> (Arc<Decider>, HealthServer<GrpcHealth>) {
    let headers = settings.limiter.limit_response_headers_enabled.then(|| {
        match settings.limiter.limit_response_headers_format {
            HeadersFormat::Ratelimit => HeaderFormat::RateLimit(HeaderNames {
                limit: settings.limiter.limit_limit_header.clone(),
                remaining: settings.limiter.limit_remaining_header.clone(),
                reset: settings.limiter.limit_reset_header.clone(),
            }),
            HeadersFormat::IetfDraft11 => HeaderFormat::IetfDraft11,
        }
    });
    let reporter = HealthReporter::new();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let health_server = HealthServer::new(GrpcHealth(HealthService::from_health_reporter(
        reporter.clone(),
    )));
    let health = Health::new(
        settings.config.healthy_with_at_least_one_config_loaded,
        reporter,
    );
    let max_inflight = match settings.outage.max_inflight_requests {
        0 => 1_024 * workers,
        n => n,
    };
    tracing::info!(
        max_inflight,
        failure_mode = ?settings.outage.backend_failure_mode,
        "requests beyond MAX_INFLIGHT_REQUESTS are refused at once"
    );
    let outage = Outage::new(&settings.outage, max_inflight, limiter.stats());
    let service = Decider::new(
        limiter,
        backend,
        health,
        headers,
        settings.limiter.response_dynamic_metadata,
        traces,
        outage,
    );
    (Arc::new(service), health_server)
}

/// Loads the rules, publishes health, and reloads on every change while the returned
/// watcher lives (none when the directory cannot be watched: a warning says so).
async fn load_rules(
    settings: &Settings,
    service: &Arc<Decider>,
) -> Option<ratelimit_service_kit::watch::Watch> {
    let source = FileSource::new(&settings.config);
    let stats = service.limiter.stats();
    stats.gauge(names::RUNTIME_NUM_VALUES, source.files_read());
    tracing::info!(directory = %source.directory().display(), "loading rate limit configuration");
    files::apply(service, source.directory(), source.load()).await;
    let targets = source.targets();
    let reloaded = Arc::clone(service);
    let watch = ratelimit_service_kit::watch::follow("the configuration", targets, move || {
        let (source, service) = (source.clone(), Arc::clone(&reloaded));
        async move { files::reload(&source, &service).await }
    });
    service.health.publish().await;
    watch
}

/// Starts the xDS client and, unless FORCE_START_WITHOUT_INITIAL_CONFIG, waits for its
/// first response (applied or rejected) before the listeners open, as upstream does.
async fn follow_xds(settings: &Settings, service: &Arc<Decider>) -> Result<(), StartError> {
    let connection = xds::Connection::new(&settings.xds).map_err(StartError::Xds)?;
    let (first_tx, first_rx) = oneshot::channel();
    tokio::spawn(xds::run(
        connection,
        settings.config.merge_domain_config,
        Arc::clone(service),
        first_tx,
    ));
    if settings.xds.force_start_without_initial_config {
        tracing::warn!(
            "FORCE_START_WITHOUT_INITIAL_CONFIG: serving before the first xDS configuration; requests fail until it arrives"
        );
    } else {
        tracing::info!("waiting for the first configuration from the xDS server");
        let _ = first_rx.await;
    }
    service.health.publish().await;
    Ok(())
}

/// Backend health follows the nodes' circuit breakers (checked four times a second:
/// unhealthy while any is open) and, with
/// `ping`, whether the remote store answers a ping (every second).
async fn watch_backend(service: Arc<Decider>, ping: bool) {
    let Some(remote) = service.backend.remote() else {
        return;
    };
    let mut alive = true;
    let mut pinged: Option<std::time::Instant> = None;
    loop {
        if ping && pinged.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(1)) {
            alive = remote.ping().await;
            pinged = Some(std::time::Instant::now());
        }
        service
            .health
            .set_backend(alive && remote.open_breakers().is_empty())
            .await;
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
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
