//! TLS handshakes against silent connections: clients that open a connection and never
//! send a ClientHello are dropped quickly and cannot hold the handshake places a working
//! client needs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_service_kit::tls::{CertificateFiles, ServerCertificate, incoming};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt;

/// A server configuration on a new self-signed certificate for localhost, and the
/// client configuration that trusts it.
fn configs(dir: &std::path::Path) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let files = CertificateFiles {
        cert: (&cert, "CERT"),
        key: (&key, "KEY"),
        client_ca: None,
    };
    let server = ServerCertificate::new(files, "")
        .unwrap()
        .config(b"h2")
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (server, Arc::new(client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_do_not_keep_a_client_from_its_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = configs(dir.path());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut connections = incoming(listener, server);
    tokio::spawn(async move {
        while let Some(Ok(mut tls)) = connections.next().await {
            tokio::spawn(async move {
                let _ = tls.write_all(b"ok").await;
                let _ = tls.shutdown().await;
            });
        }
    });
    // More silent connections than handshakes may run at once.
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(client);
    let name = ServerName::try_from("localhost").unwrap();
    let handshake = tokio::time::timeout(Duration::from_secs(8), connector.connect(name, tcp));
    let mut tls = handshake.await.expect("served in time").unwrap();
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.unwrap();
    assert_eq!(answer, b"ok");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "a working client waited {:?} behind silent connections",
        started.elapsed()
    );
    drop(silent);
}
