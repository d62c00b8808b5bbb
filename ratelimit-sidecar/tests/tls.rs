//! TLS and mutual TLS on the real binary, with certificates made in the test: who is
//! accepted and refused, certificate rotation without a restart, a bad certificate at
//! reload, the HTTP listener's TLS, and the start-up errors.

use ratelimit_tests::pki::{CLIENT_NAME, make_pki, temp_pki};
use ratelimit_tests::sidecar as support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::{Options, Server, eventually, request};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const RULES: &str = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// A server on `pki`'s certificate, with the extra settings.
fn tls_server(pki: &Path, extra: &[(&'static str, String)]) -> Server {
    let file = |name: &str| pki.join(name).display().to_string();
    let mut env = vec![
        ("GRPC_SERVER_USE_TLS", "true".to_owned()),
        ("GRPC_SERVER_TLS_CERT", file("server.crt")),
        ("GRPC_SERVER_TLS_KEY", file("server.key")),
    ];
    env.extend(extra.iter().cloned());
    Server::start_with(Options {
        env,
        ..Options::rules(RULES)
    })
}

/// A client's credentials: the CA it trusts and the certificate it presents.
struct Client {
    ca: PathBuf,
    identity: Option<PathBuf>,
}

impl Client {
    fn trusting(pki: &Path) -> Client {
        Client {
            ca: pki.join("ca.crt"),
            identity: None,
        }
    }

    fn presenting(mut self, pki: &Path) -> Client {
        self.identity = Some(pki.to_path_buf());
        self
    }

    /// One ShouldRateLimit over a new TLS connection: the overall code, or why not.
    async fn call(&self, server: &Server) -> Result<i32, String> {
        let read = |path: PathBuf| std::fs::read(path).unwrap();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(self.ca.clone())))
            .domain_name("localhost");
        if let Some(pki) = &self.identity {
            tls = tls.identity(Identity::from_pem(
                read(pki.join("client.crt")),
                read(pki.join("client.key")),
            ));
        }
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", server.grpc))
            .unwrap()
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        RateLimitServiceClient::new(channel)
            .should_rate_limit(request("t", &[&[("user", "alice")]]))
            .await
            .map(|answer| answer.into_inner().overall_code)
            .map_err(|status| format!("{status:?}"))
    }
}

#[tokio::test]
async fn tls_serves_clients_that_trust_the_ca_and_refuses_plaintext() {
    let pki = temp_pki();
    let server = tls_server(pki.path(), &[]);
    assert_eq!(Client::trusting(pki.path()).call(&server).await, Ok(1));
    let mut plaintext = server.client().await;
    let refused = plaintext
        .should_rate_limit(request("t", &[&[("user", "alice")]]))
        .await;
    assert!(refused.is_err(), "plaintext was answered: {refused:?}");
    let other = temp_pki();
    let untrusted = Client::trusting(other.path()).call(&server).await;
    assert!(untrusted.is_err(), "{untrusted:?}");
}

#[tokio::test]
async fn mutual_tls_takes_only_client_certificates_of_the_ca_with_the_name() {
    let pki = temp_pki();
    let stranger = temp_pki();
    let ca = (
        "GRPC_CLIENT_TLS_CACERT",
        pki.path().join("ca.crt").display().to_string(),
    );

    let server = tls_server(pki.path(), std::slice::from_ref(&ca));
    let ours = Client::trusting(pki.path()).presenting(pki.path());
    assert_eq!(ours.call(&server).await, Ok(1));
    let anonymous = Client::trusting(pki.path()).call(&server).await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let theirs = Client::trusting(pki.path()).presenting(stranger.path());
    let foreign = theirs.call(&server).await;
    assert!(foreign.is_err(), "another CA's client: {foreign:?}");
    drop(server);

    let named = tls_server(
        pki.path(),
        &[ca.clone(), ("GRPC_CLIENT_TLS_SAN", CLIENT_NAME.to_owned())],
    );
    assert_eq!(ours.call(&named).await, Ok(1));
    drop(named);
    let other_name = tls_server(
        pki.path(),
        &[ca, ("GRPC_CLIENT_TLS_SAN", "someone-else.test".to_owned())],
    );
    let wrong = ours.call(&other_name).await;
    assert!(wrong.is_err(), "a client without the name: {wrong:?}");
}

#[tokio::test]
async fn a_new_certificate_is_served_to_new_connections_and_a_bad_one_is_not() {
    let live = tempfile::tempdir().unwrap();
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    make_pki(first.path());
    make_pki(second.path());
    for name in ["server.crt", "server.key"] {
        std::fs::copy(first.path().join(name), live.path().join(name)).unwrap();
    }
    let server = tls_server(live.path(), &[]);
    assert_eq!(Client::trusting(first.path()).call(&server).await, Ok(1));

    // A half-written certificate: logged, and the previous one stays.
    std::fs::write(
        live.path().join("server.crt"),
        "-----BEGIN CERTIFICATE-----\nnot\n",
    )
    .unwrap();
    let logged = eventually(Duration::from_secs(10), || async {
        server.log().contains("cannot reload the TLS certificate")
    })
    .await;
    assert!(logged, "{}", server.log());
    assert_eq!(Client::trusting(first.path()).call(&server).await, Ok(1));

    // Rotation as a deployment does it: new files renamed over the old ones.
    for name in ["server.key", "server.crt"] {
        let staged = live.path().join(format!(".{name}.new"));
        std::fs::copy(second.path().join(name), &staged).unwrap();
        std::fs::rename(&staged, live.path().join(name)).unwrap();
    }
    let rotated = eventually(Duration::from_secs(10), || async {
        Client::trusting(second.path()).call(&server).await == Ok(1)
    })
    .await;
    assert!(rotated, "{}", server.log());
    let old = Client::trusting(first.path()).call(&server).await;
    assert!(old.is_err(), "the old certificate is still served: {old:?}");
}

#[tokio::test]
async fn the_http_listener_takes_the_same_tls_when_asked() {
    let pki = temp_pki();
    let ca = (
        "GRPC_CLIENT_TLS_CACERT",
        pki.path().join("ca.crt").display().to_string(),
    );
    let server = tls_server(
        pki.path(),
        &[ca, ("HTTP_SERVER_USE_TLS", "true".to_owned())],
    );
    let read = |name: &str| std::fs::read(pki.path().join(name)).unwrap();
    let trusted = reqwest::Certificate::from_pem(&read("ca.crt")).unwrap();
    let mut identity = read("client.crt");
    identity.extend(read("client.key"));
    let body = r#"{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    let url = format!("https://localhost:{}/json", server.http);
    let with_identity = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(trusted.clone())
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .build()
        .unwrap();
    let answer = with_identity.post(&url).body(body).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let anonymous = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(trusted)
        .build()
        .unwrap();
    assert!(anonymous.post(&url).body(body).send().await.is_err());
    let plaintext = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/json", server.http))
        .body(body)
        .send()
        .await;
    assert!(plaintext.is_err(), "{plaintext:?}");
}

#[test]
fn a_missing_or_unusable_certificate_stops_start_up_naming_the_file() {
    let pki = temp_pki();
    let file = |name: &str| pki.path().join(name).display().to_string();
    for (cert, key, named) in [
        (
            "/nonexistent/server.crt".to_owned(),
            file("server.key"),
            "GRPC_SERVER_TLS_CERT=/nonexistent/server.crt",
        ),
        (
            file("server.key"),
            file("server.key"),
            "GRPC_SERVER_TLS_CERT=",
        ),
        (
            file("server.crt"),
            file("client.key"),
            "GRPC_SERVER_TLS_KEY=",
        ),
    ] {
        let log = Server::refused(Options {
            env: vec![
                ("GRPC_SERVER_USE_TLS", "true".into()),
                ("GRPC_SERVER_TLS_CERT", cert.clone()),
                ("GRPC_SERVER_TLS_KEY", key.clone()),
            ],
            ..Options::default()
        });
        assert!(log.contains(named), "{named}: {}", log);
    }
}
