//! The sidecar started as Envoy Gateway starts its rate limit deployment: the
//! environment of Envoy Gateway's `envoy-ratelimit` Deployment (its
//! internal/infrastructure/kubernetes/ratelimit testdata, `default.yaml`), with only the
//! addresses of other processes and the mount points moved under a temporary directory;
//! its certificates laid out as the `envoy-rate-limit` Secret is mounted; the example
//! control plane (examples/xds-server) serving the rules over xDS with mutual TLS in
//! Envoy Gateway's role; a real Redis; and a real Envoy configured as Envoy Gateway's
//! translator configures it, asking for decisions over mutual TLS.

use std::path::Path;
use std::time::Duration;

use ratelimit_core::Config;
use ratelimit_proto::xds::from_domain;
use ratelimit_tests::envoy::{repo, start_envoy_with, upstream};
use ratelimit_tests::envoy_gateway::make_envoy_gateway_pki;
use ratelimit_tests::sidecar::{Options, Redis, Server, eventually, free_port, get_text};
use ratelimit_xds_example::{ControlPlane, Snapshot};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Envoy Gateway's environment for the rate limit container, as its Deployment has it
/// (`envoy-gateway:18001`, the Redis URL and `/certs`, `/data` and
/// `/etc/statsd-exporter` are replaced by the test's addresses and directories).
const ENVOY_GATEWAY_ENV: [(&str, &str); 23] = [
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

/// The rules Envoy Gateway would translate a BackendTrafficPolicy into: the listener's
/// domain, the route rule's generic key, then the client header (2 a minute per user).
const RULES: &str = "domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/0/www_example_com
    value: httproute/default/backend/rule/0/match/0/www_example_com
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: minute, requests_per_unit: 2}
";

/// Serves `plane` on `port` as Envoy Gateway serves its rate limit xDS: TLS with its
/// certificate, client certificates required from its CA.
fn serve_control_plane(plane: &ControlPlane, port: u16, certs: &Path) {
    let read = |name: &str| std::fs::read(certs.join(name)).unwrap();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read("tls.crt"), read("tls.key")))
        .client_ca_root(Certificate::from_pem(read("ca.crt")));
    let service = plane.service();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(service)
            .serve(([127, 0, 0, 1], port).into())
            .await
    });
}

/// The environment above with the test's addresses and directories under `root`.
fn environment(root: &Path, xds_port: u16, redis: &Redis) -> Vec<(&'static str, String)> {
    ENVOY_GATEWAY_ENV
        .iter()
        .map(|(key, value)| {
            let value = match *key {
                "CONFIG_GRPC_XDS_SERVER_URL" => format!("localhost:{xds_port}"),
                "REDIS_URL" => format!("127.0.0.1:{}", redis.port),
                "PROMETHEUS_ADDR" => format!(":{}", free_port()),
                _ if value.starts_with('/') => root
                    .join(value.trim_start_matches('/'))
                    .display()
                    .to_string(),
                _ => (*value).to_owned(),
            };
            (*key, value)
        })
        // Envoy Gateway sets no BACKEND_TYPE: upstream's default is Redis, and so is this
        // one's when REDIS_URL is set. The launcher sets the memory backend unless told.
        .chain([("BACKEND_TYPE", "redis".to_owned())])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_asks_the_sidecar_started_as_envoy_gateway_starts_it() {
    let root = tempfile::tempdir().unwrap();
    make_envoy_gateway_pki(root.path());
    // Envoy Gateway's statsd-exporter mapping (its ConfigMap): upstream's default.
    let mapping = root.path().join("etc/statsd-exporter");
    std::fs::create_dir_all(&mapping).unwrap();
    std::fs::copy(
        repo().join("ratelimit-core/src/stats/prometheus-mapping.yaml"),
        mapping.join("conf.yaml"),
    )
    .unwrap();
    let plane = ControlPlane::default();
    let config = Config::from_files([("rules.yaml", RULES)], false).unwrap();
    let resources: Vec<_> = config
        .domains()
        .iter()
        .map(|domain| from_domain(&domain.domain, domain).0)
        .collect();
    plane.publish(Snapshot::of("1", &resources));
    let xds_port = free_port();
    serve_control_plane(&plane, xds_port, &root.path().join("envoy-gateway"));
    let redis = Redis::start(&[]);
    let server = Server::start_with(Options {
        env: environment(root.path(), xds_port, &redis),
        ..Options::default()
    });
    let seen = eventually(Duration::from_secs(10), || async {
        plane.acknowledged("envoy-ratelimit", "1")
    })
    .await;
    assert!(seen, "the rules were not acknowledged:\n{}", server.log());

    let upstream = upstream().await;
    let envoy_certs = root.path().join("envoy").display().to_string();
    let envoy = start_envoy_with(
        "../tests/tests/envoy_gateway.yaml",
        upstream,
        server.grpc,
        true,
        &[("ENVOY_CERTS", envoy_certs)],
    );
    let http = reqwest::Client::new();
    let mut codes = Vec::new();
    for _ in 0..3 {
        let answer = http
            .get(format!("http://127.0.0.1:{}/", envoy.port))
            .header("x-user-id", "alice")
            .send()
            .await
            .unwrap();
        codes.push(answer.status().as_u16());
    }
    assert_eq!(codes, [200, 200, 429], "{}", server.log());
    assert!(!redis.keys().is_empty(), "the counters are in Redis");
    let metrics = get_text(&server.debug_url("/stats")).await;
    assert!(metrics.contains("over_limit: 1"), "{metrics}");
}

#[tokio::test]
async fn the_sidecar_started_as_envoy_gateway_starts_it_refuses_clients_without_a_certificate() {
    let root = tempfile::tempdir().unwrap();
    make_envoy_gateway_pki(root.path());
    let redis = Redis::start(&[]);
    // No control plane: FORCE_START_WITHOUT_INITIAL_CONFIG lets it serve meanwhile.
    let mut env = environment(root.path(), free_port(), &redis);
    env.retain(|(key, _)| *key != "PROMETHEUS_MAPPER_YAML");
    let server = Server::start_with(Options {
        env,
        ..Options::default()
    });
    let ca = std::fs::read(root.path().join("certs/ca.crt")).unwrap();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    let refused = async {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{}", server.grpc))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await?;
        let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
        client
            .should_rate_limit(ratelimit_tests::sidecar::request(
                "default/eg/http",
                &[&[("k", "v")]],
            ))
            .await
            .map(|_| ())
            .map_err(|status| Box::new(status) as Box<dyn std::error::Error>)
    };
    let answer: Result<(), Box<dyn std::error::Error>> = refused.await;
    // The handshake fails: the service never answers, not even with an error of its own.
    let error = format!("{answer:?}");
    // (The alert or the closed connection, whichever the client reads first.)
    assert!(
        error.contains("tonic::transport::Error(Transport"),
        "{error}"
    );
}
