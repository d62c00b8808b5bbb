//! The xDS configuration source on the real binary, against the example control plane
//! (`examples/xds-server`) run in the test: pushes applied and ACKed, an invalid push
//! NACKed with the loader's message while the previous rules serve, a server restart
//! survived with a new subscription, TLS and the additional headers, and
//! FORCE_START_WITHOUT_INITIAL_CONFIG.

use ratelimit_tests::pki::temp_pki;
use ratelimit_tests::sidecar as support;

use std::path::Path;
use std::time::Duration;

use ratelimit_core::Config;
use ratelimit_proto::xds::pb::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use ratelimit_proto::xds::to_yaml;
use ratelimit_xds_example::{ControlPlane, Seen, Snapshot};
use support::{Options, Server, eventually, free_port, request};

/// The control plane served on a runtime of its own, so that stopping it drops every
/// stream as a crashed server would.
struct Running {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Running {
    fn start(plane: &ControlPlane, port: u16, tls: Option<&Path>) -> Running {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut builder = tonic::transport::Server::builder();
        if let Some(pki) = tls {
            let read = |name: &str| std::fs::read(pki.join(name)).unwrap();
            let identity =
                tonic::transport::Identity::from_pem(read("elsewhere.crt"), read("elsewhere.key"));
            let config = tonic::transport::ServerTlsConfig::new().identity(identity);
            builder = builder.tls_config(config).unwrap();
        }
        let service = plane.service();
        // The previous server's socket may take a moment to close.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match std::net::TcpListener::bind(("127.0.0.1", port)) {
                Ok(listener) => break listener,
                Err(error) if std::time::Instant::now() > deadline => panic!("{port}: {error}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        listener.set_nonblocking(true).unwrap();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            builder
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
        });
        Running {
            runtime: Some(runtime),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn rule(key: &str, unit: RateLimitUnit, requests: u32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.to_owned(),
        rate_limit: Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: requests,
            ..RateLimitPolicy::default()
        }),
        ..RateLimitDescriptor::default()
    }
}

fn domain(name: &str, rules: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: format!("{name}-rules"),
        domain: name.to_owned(),
        descriptors: rules,
    }
}

fn xds_server(port: u16, extra: &[(&'static str, String)]) -> Server {
    let mut env = vec![
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", format!("127.0.0.1:{port}")),
        ("CONFIG_GRPC_XDS_NODE_ID", "edge-7".to_owned()),
        (
            "CONFIG_GRPC_XDS_NODE_METADATA",
            "zone=a,team=payments".to_owned(),
        ),
        (
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "100ms".to_owned(),
        ),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms".to_owned()),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "400ms".to_owned()),
    ];
    env.extend(extra.iter().cloned());
    Server::start_with(Options {
        env,
        ..Options::default()
    })
}

/// The codes of `count` requests for `(key, value)` in `domain`.
async fn codes(server: &Server, domain: &str, key: &str, value: &str, count: usize) -> Vec<i32> {
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..count {
        let answer = client
            .should_rate_limit(request(domain, &[&[(key, value)]]))
            .await;
        codes.push(answer.map_or(-1, |a| a.into_inner().overall_code));
    }
    codes
}

/// Waits for a request matching `test` and returns it.
async fn wait_for(plane: &ControlPlane, what: &str, test: impl Fn(&Seen) -> bool) -> Seen {
    let found = eventually(Duration::from_secs(20), || async {
        plane.seen().iter().any(&test)
    })
    .await;
    assert!(found, "no {what}: {:#?}", plane.seen());
    plane.seen().into_iter().rfind(test).unwrap()
}

fn acks(version: &str) -> impl Fn(&Seen) -> bool + '_ {
    move |seen| {
        seen.nack().is_none()
            && seen.request.version_info == version
            && !seen.request.response_nonce.is_empty()
    }
}

#[tokio::test]
async fn pushes_are_acked_or_nacked_and_a_restarted_server_is_followed() {
    let plane = ControlPlane::default();
    plane.publish(Snapshot::of(
        "1",
        &[domain("shop", vec![rule("user", RateLimitUnit::Hour, 2)])],
    ));
    let port = free_port();
    let running = Running::start(&plane, port, None);
    let server = xds_server(port, &[]);

    // The first configuration was applied before the listeners opened.
    assert_eq!(codes(&server, "shop", "user", "alice", 3).await, [1, 1, 2]);
    let subscribe = &plane.seen()[0].request;
    let node = subscribe.node.as_ref().unwrap();
    assert_eq!(node.id, "edge-7");
    let metadata = node.metadata.as_ref().unwrap();
    assert_eq!(metadata.fields.len(), 2, "{metadata:?}");
    assert_eq!(subscribe.type_url, ratelimit_proto::xds::TYPE_URL);
    assert_eq!(
        (
            subscribe.version_info.as_str(),
            subscribe.response_nonce.as_str()
        ),
        ("", "")
    );
    wait_for(&plane, "ACK of version 1", acks("1")).await;

    // An update: applied and ACKed.
    plane.publish(Snapshot::of(
        "2",
        &[
            domain("shop", vec![rule("user", RateLimitUnit::Hour, 5)]),
            domain("api", vec![rule("key", RateLimitUnit::Minute, 1)]),
        ],
    ));
    wait_for(&plane, "ACK of version 2", acks("2")).await;
    assert_eq!(codes(&server, "api", "key", "k1", 2).await, [1, 2]);
    assert_eq!(
        codes(&server, "shop", "user", "bob", 5).await,
        [1, 1, 1, 1, 1]
    );

    // An invalid update: NACKed with the file loader's own message, version 2 stays.
    let invalid = [
        domain("shop", vec![rule("user", RateLimitUnit::Unknown, 5)]),
        domain("api", vec![]),
    ];
    let expected = Config::from_files(invalid.iter().map(|c| (c.name.clone(), to_yaml(c))), false)
        .unwrap_err()
        .to_string();
    plane.publish(Snapshot::of("3", &invalid));
    let nack = wait_for(&plane, "NACK of version 3", |seen| seen.nack().is_some()).await;
    assert_eq!(nack.nack(), Some(expected.as_str()));
    assert_eq!(
        nack.request.version_info, "2",
        "a NACK names the version in use"
    );
    assert_eq!(codes(&server, "api", "key", "k2", 2).await, [1, 2]);

    // The server goes away: the rules stay; it comes back with version 4, and the client
    // subscribes again (saying it has version 2) and applies it.
    drop(running);
    let logged = eventually(Duration::from_secs(10), || async {
        server.log().contains("xDS stream ended")
    })
    .await;
    assert!(logged, "{}", server.log());
    assert_eq!(codes(&server, "api", "key", "k3", 2).await, [1, 2]);
    let before = plane.seen().len();
    plane.publish(Snapshot::of(
        "4",
        &[domain("api", vec![rule("key", RateLimitUnit::Minute, 3)])],
    ));
    let _running = Running::start(&plane, port, None);
    wait_for(&plane, "ACK of version 4", acks("4")).await;
    let resubscribe = &plane.seen()[before].request;
    assert_eq!(
        (
            resubscribe.version_info.as_str(),
            resubscribe.response_nonce.as_str()
        ),
        ("2", "")
    );
    assert_eq!(codes(&server, "api", "key", "k4", 4).await, [1, 1, 1, 2]);
    let health = reqwest::get(server.http_url("/healthcheck")).await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn tls_to_the_xds_server_carries_the_additional_headers() {
    let pki = temp_pki();
    let plane = ControlPlane::default();
    plane.publish(Snapshot::of(
        "1",
        &[domain("shop", vec![rule("user", RateLimitUnit::Hour, 1)])],
    ));
    let port = free_port();
    let _running = Running::start(&plane, port, Some(pki.path()));
    // The server's certificate names elsewhere.example only: the SAN override is needed.
    let server = xds_server(
        port,
        &[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                pki.path().join("ca.crt").display().to_string(),
            ),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "elsewhere.example".into()),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-tenant:blue,Authorization:Bearer abc".into(),
            ),
        ],
    );
    assert_eq!(codes(&server, "shop", "user", "alice", 2).await, [1, 2]);
    let headers = &plane.seen()[0].headers;
    for (name, value) in [("x-tenant", "blue"), ("authorization", "Bearer abc")] {
        assert!(
            headers.iter().any(|(k, v)| k == name && v == value),
            "{name}: {headers:?}"
        );
    }
}

#[tokio::test]
async fn force_start_serves_at_once_and_picks_the_rules_up_when_the_server_appears() {
    let port = free_port();
    let server = xds_server(
        port,
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into())],
    );
    let mut client = server.client().await;
    let refused = client
        .should_rate_limit(request("shop", &[&[("user", "alice")]]))
        .await
        .unwrap_err();
    assert!(
        refused.message().contains("no rate limit configuration"),
        "{refused:?}"
    );
    let plane = ControlPlane::default();
    plane.publish(Snapshot::of(
        "1",
        &[domain("shop", vec![rule("user", RateLimitUnit::Hour, 1)])],
    ));
    let _running = Running::start(&plane, port, None);
    let applied = eventually(Duration::from_secs(10), || async {
        codes(&server, "shop", "user", "carol", 1).await == [1]
    })
    .await;
    assert!(applied, "{}", server.log());
    assert_eq!(codes(&server, "shop", "user", "carol", 1).await, [2]);
}

#[test]
fn unusable_xds_tls_files_stop_start_up_naming_them() {
    let log = Server::refused(Options::with_env(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.crt"),
    ]));
    assert!(
        log.contains("CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/nonexistent/ca.crt"),
        "{log}"
    );
}
