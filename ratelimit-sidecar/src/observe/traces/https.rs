//! The OTLP/HTTP exporter over TLS: a hyper connector that opens TLS (rustls, the
//! system's roots, which honour `SSL_CERT_FILE` and `SSL_CERT_DIR`) to an `https://`
//! collector, for the exporter's hyper client.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use opentelemetry_http::hyper::HyperClient;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// How long one export may take, as the exporter's own default.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exporter's hyper client, speaking TLS to the collector.
pub fn client() -> HyperClient<Https> {
    HyperClient::new(Https::with_system_roots(), EXPORT_TIMEOUT, None)
}

/// Opens TCP, then TLS checked against the system's roots and the URI's host.
#[derive(Clone)]
pub struct Https(TlsConnector);

impl Https {
    fn with_system_roots() -> Https {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Https(TlsConnector::from(Arc::new(config)))
    }
}

impl std::fmt::Debug for Https {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Https")
    }
}

impl tower_service::Service<Uri> for Https {
    type Response = Stream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.0.clone();
        Box::pin(async move {
            let invalid =
                |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {what}"));
            if uri.scheme_str() != Some("https") {
                return Err(invalid("not an https:// address"));
            }
            let host = uri.host().ok_or_else(|| invalid("no host"))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let name =
                ServerName::try_from(host.clone()).map_err(|_| invalid("not a server name"))?;
            let tcp = TcpStream::connect((host.as_str(), uri.port_u16().unwrap_or(443))).await?;
            Ok(Stream(TokioIo::new(tls.connect(name, tcp).await?)))
        })
    }
}

/// A TLS connection to the collector, as hyper reads and writes it.
pub struct Stream(TokioIo<TlsStream<TcpStream>>);

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
