//! Start-up and shutdown: build the parts from the settings, serve until SIGTERM or
//! SIGINT, let the requests in flight finish, flush the producer.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ratelimit_service_kit::serve;
use ratelimit_service_kit::tls::{CertificateFiles, HttpTls};
use ratelimit_service_kit::watch::Watch;
use rdkafka::mocking::MockCluster;
use tokio::net::TcpListener;

use crate::auth::Auth;
use crate::files::{Apply, Followed};
use crate::idempotency;
use crate::kafka::{Kafka, ProducerSettings, SetupError};
use crate::limits::{Limits, LimitsError};
use crate::metrics::Metrics;
use crate::routes::{App, routes};
use crate::settings::{
    AuthMode, IdempotencyStore, Settings, parse_properties, parse_properties_file,
};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The rate limits could not be set up.
    #[error(transparent)]
    Limits(#[from] LimitsError),
    /// A followed file (RATELIMIT_CONFIG, API_KEYS_FILE) is missing or not valid.
    #[error("{0}")]
    File(String),
    /// Authentication or idempotency settings that cannot work.
    #[error("{0}")]
    Setting(String),
    /// The idempotency store could not be reached.
    #[error("{0}")]
    Idempotency(String),
    /// A librdkafka property list is malformed or unreadable.
    #[error("{0}")]
    Properties(String),
    /// The producer could not be created.
    #[error(transparent)]
    Kafka(#[from] SetupError),
    /// The mock broker could not be started.
    #[error("cannot start the mock broker: {0}")]
    Mock(#[from] rdkafka::error::KafkaError),
    /// The listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// What the system said.
        source: std::io::Error,
    },
}

/// Runs the service until a shutdown signal; returns once it has drained.
pub async fn run(settings: Settings) -> Result<(), StartError> {
    // Installed before anything slow, so a SIGTERM during start-up still drains.
    let shutdown = shutdown_signal();
    let metrics = Metrics::new();
    let mut files = Vec::new();
    let limits = Arc::new(
        match (&settings.ratelimit_config, &settings.ratelimit_grpc_url) {
            (Some(_), _) => Limits::local(
                &settings.ratelimit_domain,
                &settings.limit_response_headers_format,
            ),
            (None, Some(url)) => Limits::remote(
                url,
                &settings.ratelimit_domain,
                settings.ratelimit_timeout,
                settings.ratelimit_failure_mode_deny,
            )?,
            (None, None) => Limits::Off,
        },
    );
    if let Some(path) = &settings.ratelimit_config {
        let rules = Arc::clone(&limits);
        let source = path.display().to_string();
        let apply = Box::new(move |text: &str| rules.set_rules(&source, text));
        files.push(follow(
            "ratelimit_config",
            "RATELIMIT_CONFIG",
            path,
            apply,
            &metrics,
        )?);
    }
    let auth = Arc::new(Auth::new(settings.auth));
    // Held until the end of the run: the certificate is followed while it lives.
    let tls = tls(&settings)?;
    match (settings.auth, &settings.api_keys_file) {
        (AuthMode::ApiKeys, Some(path)) => {
            let keys = Arc::clone(&auth);
            let apply = Box::new(move |text: &str| {
                keys.set_keys(text).inspect_err(|error| {
                    tracing::error!(%error, "API_KEYS_FILE rejected; the previous keys stay in use");
                })
            });
            files.push(follow("api_keys", "API_KEYS_FILE", path, apply, &metrics)?);
        }
        (AuthMode::ApiKeys, None) => {
            return Err(StartError::Setting(
                "AUTH=api-keys (the default) needs API_KEYS_FILE. Make a key with `operations-intake keygen --client-id <id>` and list its hash in the file, or set AUTH=none to trust X-Client-Id (development only)".into(),
            ));
        }
        (AuthMode::Mtls, keys) => {
            if settings.tls_client_ca.is_none() || keys.is_some() {
                return Err(StartError::Setting(
                    "AUTH=mtls names clients by their certificates: it needs TLS_CERT, TLS_KEY and TLS_CLIENT_CA, and no API_KEYS_FILE".into(),
                ));
            }
        }
        (AuthMode::None, keys) => {
            if keys.is_some() {
                return Err(StartError::Setting(
                    "API_KEYS_FILE is set but AUTH=none would ignore it; set AUTH=api-keys or remove API_KEYS_FILE".into(),
                ));
            }
            tracing::warn!(
                "AUTH=none: clients are NOT authenticated; whoever can reach the service names itself with X-Client-Id. For development only"
            );
        }
    }
    if settings.auth == AuthMode::ApiKeys && tls.is_none() {
        tracing::warn!(
            "API keys arrive over plain HTTP: set TLS_CERT and TLS_KEY, or terminate TLS in front of the service"
        );
    }
    let idempotency = idempotency_store(&settings).await?;
    if settings.ratelimit_allow_unknown_domain {
        tracing::warn!(
            domain = %settings.ratelimit_domain,
            "RATELIMIT_ALLOW_UNKNOWN_DOMAIN: not checking that the sidecar limits this domain"
        );
    } else {
        limits.verify_remote().await?;
    }
    let mut properties = Vec::new();
    if let Some(path) = &settings.kafka_properties_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            StartError::Properties(format!(
                "cannot read KAFKA_PROPERTIES_FILE {}: {e}",
                path.display()
            ))
        })?;
        properties.extend(parse_properties_file(&text).map_err(|e| {
            StartError::Properties(format!("KAFKA_PROPERTIES_FILE {}: {e}", path.display()))
        })?);
    }
    properties.extend(
        parse_properties(&settings.kafka_properties)
            .map_err(|e| StartError::Properties(format!("KAFKA_PROPERTIES: {e}")))?,
    );

    // Held until the process exits: dropping it stops the mock broker.
    let mock = if settings.kafka_mock_broker {
        let mock = MockCluster::new(1)?;
        mock.create_topic(&settings.kafka_topic, 1, 1)?;
        tracing::warn!(
            bootstrap_servers = %mock.bootstrap_servers(),
            "KAFKA_MOCK_BROKER is on: operations go to an in-process mock broker and are NOT DURABLE; they are lost when the service stops"
        );
        Some(mock)
    } else {
        None
    };
    let bootstrap = mock.as_ref().map_or_else(
        || settings.kafka_bootstrap_servers.clone(),
        MockCluster::bootstrap_servers,
    );
    let transactional_id = settings.kafka_transactional_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host = host.trim();
        let host = if host.is_empty() { "localhost" } else { host };
        format!("operations-intake-{host}-{}", settings.port)
    });
    let kafka = Kafka::new(&ProducerSettings {
        bootstrap_servers: &bootstrap,
        topic: &settings.kafka_topic,
        properties: &properties,
        delivery_timeout: settings.kafka_delivery_timeout,
        health_timeout: settings.kafka_health_timeout,
        max_value_bytes: settings.max_body_bytes,
        transactional_id: &transactional_id,
        transaction_timeout: settings.idempotency_claim_ttl,
    })?;
    let first = kafka.probe().await;
    if first.is_up() {
        tracing::info!(status = first.status, bootstrap_servers = %bootstrap, topic = %settings.kafka_topic, "Kafka probed");
    } else {
        tracing::warn!(status = first.status, reason = first.reason.as_deref(), bootstrap_servers = %bootstrap, topic = %settings.kafka_topic, "Kafka probed: not ready; batches are refused (503) until it is");
    }
    let watcher = tokio::spawn(kafka.clone().watch());
    let health = Arc::clone(&kafka);
    metrics.kafka_up(Arc::new(move || u64::from(health.health().is_up())));
    // Held until the end of the run: dropping them stops following the files.
    let _watches: Vec<Watch> = files.iter().filter_map(|(_, file)| file.follow()).collect();

    let app = Arc::new(App {
        auth,
        limits,
        headers_format: settings.limit_response_headers_format.clone(),
        kafka: kafka.clone(),
        idempotency,
        max_body_bytes: settings.max_body_bytes,
        max_operations: settings.max_operations,
        rules: crate::batch::Rules {
            max_unit_cost_decimals: settings.max_unit_cost_decimals,
            reject_oversell: settings.reject_oversell,
        },
        metrics,
        files,
    });
    let addr = format!("{}:{}", settings.host, settings.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|source| StartError::Listen {
            addr: addr.clone(),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_or(addr, |local: SocketAddr| local.to_string());
    tracing::warn!(address = %local, "operations-intake listening");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = serve::serve(
        listener,
        tls.as_ref().map(|tls| Arc::clone(&tls.config)),
        serve::warp_filter(routes(app)),
        connection_limits(&settings),
        settings
            .http
            .connection_slots()
            .with_health_reserve(crate::health::PATHS),
        async {
            let _ = stop_rx.await;
        },
    );
    tokio::pin!(server);
    tokio::select! {
        () = &mut server => {}
        () = shutdown => {
            tracing::info!(timeout = ?settings.shutdown_timeout, "shutting down: no new connections, waiting for requests in flight");
            let _ = stop_tx.send(());
            let started = Instant::now();
            if tokio::time::timeout(settings.shutdown_timeout, &mut server).await.is_err() {
                tracing::warn!("requests still in flight at the shutdown timeout");
            }
            let left = settings.shutdown_timeout.saturating_sub(started.elapsed());
            let flushed = tokio::task::spawn_blocking(move || kafka.flush(left)).await;
            match flushed {
                Ok(Ok(())) => tracing::info!("producer flushed; bye"),
                Ok(Err(error)) => tracing::warn!(%error, "producer not fully flushed"),
                Err(error) => tracing::warn!(%error, "producer flush failed"),
            }
        }
    }
    watcher.abort();
    // The producer outlives this function (the transaction task holds it until the
    // runtime stops); a mock broker dropped here would leave it logging refused
    // connections as the process exits. It goes with the process instead.
    std::mem::forget(mock);
    Ok(())
}

/// Loads the file at `path` (a start-up error when it does not load) and returns it, to
/// be followed, under `name`; its loads count in `intake.<name>.load_*`.
fn follow(
    name: &'static str,
    setting: &'static str,
    path: &Path,
    apply: Apply,
    metrics: &Metrics,
) -> Result<(&'static str, Arc<Followed>), StartError> {
    let (success, error) = metrics.loads(name);
    let followed = Arc::new(Followed::new(setting, path, apply, success, error));
    followed.load().map_err(StartError::File)?;
    Ok((name, followed))
}

/// HTTPS, with mutual TLS when TLS_CLIENT_CA is set, or nothing without TLS_CERT.
fn tls(settings: &Settings) -> Result<Option<HttpTls>, StartError> {
    let (Some(cert), Some(key)) = (&settings.tls_cert, &settings.tls_key) else {
        return Ok(None);
    };
    let files = CertificateFiles {
        cert: (cert, "TLS_CERT"),
        key: (key, "TLS_KEY"),
        client_ca: settings
            .tls_client_ca
            .as_deref()
            .map(|ca| (ca, "TLS_CLIENT_CA")),
    };
    let tls = ratelimit_service_kit::tls::http_server(files).map_err(StartError::Setting)?;
    tracing::warn!(cert = %cert.display(), mutual = settings.tls_client_ca.is_some(), "serving HTTPS");
    Ok(Some(tls))
}

/// The idempotency store the settings ask for; Redis must answer at start.
async fn idempotency_store(settings: &Settings) -> Result<idempotency::Store, StartError> {
    match (settings.idempotency_store, &settings.idempotency_redis_url) {
        (IdempotencyStore::Memory, None) => Ok(idempotency::Store::Memory(
            idempotency::memory::Store::new(settings.idempotency_ttl, settings.idempotency_max_keys),
        )),
        (IdempotencyStore::Memory, Some(_)) => Err(StartError::Setting(
            "IDEMPOTENCY_REDIS_URL is set but IDEMPOTENCY_STORE=memory would ignore it; set IDEMPOTENCY_STORE=redis".into(),
        )),
        (IdempotencyStore::Redis, None) => Err(StartError::Setting(
            "IDEMPOTENCY_STORE=redis needs IDEMPOTENCY_REDIS_URL".into(),
        )),
        (IdempotencyStore::Redis, Some(url)) => {
            let slowest = settings.kafka_delivery_timeout + settings.ratelimit_timeout;
            if settings.idempotency_claim_ttl <= slowest {
                return Err(StartError::Setting(format!(
                    "IDEMPOTENCY_CLAIM_TTL ({:?}) must exceed KAFKA_DELIVERY_TIMEOUT plus RATELIMIT_TIMEOUT ({slowest:?}): a claim that expires while its batch is being produced lets a retry produce it again",
                    settings.idempotency_claim_ttl
                )));
            }
            let store = idempotency::redis::Store::connect(
                url,
                settings.idempotency_claim_ttl,
                settings.idempotency_ttl,
                settings.idempotency_redis_timeout,
            )
            .await
            .map_err(StartError::Idempotency)?;
            tracing::info!(url, "idempotency keys are shared in Redis");
            Ok(idempotency::Store::Redis(store))
        }
    }
}

/// Completes on SIGTERM or SIGINT; the SIGTERM handler is installed on the call.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler can be installed");
    async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}

/// The listener's limits; the request timeout raised, with a warning, when it is not
/// above the longest a batch may wait for its answer (RATELIMIT_TIMEOUT +
/// KAFKA_DELIVERY_TIMEOUT), so that no acknowledged batch is cut off.
fn connection_limits(settings: &Settings) -> serve::ConnectionLimits {
    let mut limits = settings.http.connection_limits();
    let answer_within = settings.ratelimit_timeout + settings.kafka_delivery_timeout;
    if limits.request_timeout <= answer_within {
        let raised = answer_within + std::time::Duration::from_secs(5);
        tracing::warn!(
            configured = ?limits.request_timeout,
            raised = ?raised,
            "HTTP_REQUEST_TIMEOUT is not above RATELIMIT_TIMEOUT + KAFKA_DELIVERY_TIMEOUT, the longest a batch may wait for its acknowledgement: raised so that no batch is cut off"
        );
        limits.request_timeout = raised;
    }
    limits
}
