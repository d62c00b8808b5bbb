//! Server TLS for the gRPC listener (and, with HTTP_SERVER_USE_TLS, the HTTP one), from
//! the settings: GRPC_SERVER_TLS_CERT and _KEY, reloaded when their files change, and
//! client certificates checked against GRPC_CLIENT_TLS_CACERT (and GRPC_CLIENT_TLS_SAN)
//! when mutual TLS is on.

use std::path::Path;
use std::sync::Arc;

use ratelimit_service_kit::tls::{CertificateFiles, ServerCertificate};
use ratelimit_service_kit::watch::Watch;
use rustls::ServerConfig;

use crate::settings::TlsSettings;

/// The listeners' TLS: one configuration per protocol, sharing the reloaded
/// certificate and the client check.
#[derive(Debug)]
pub struct ServerTls {
    /// For gRPC (ALPN `h2`).
    pub grpc: Arc<ServerConfig>,
    /// For the HTTP listener (ALPN `http/1.1`), when HTTP_SERVER_USE_TLS.
    pub http: Option<Arc<ServerConfig>>,
    _watch: Option<Watch>,
}

impl ServerTls {
    /// The TLS the settings ask for, or nothing when GRPC_SERVER_USE_TLS is off.
    pub fn load(settings: &TlsSettings) -> Result<Option<ServerTls>, String> {
        if !settings.grpc_server_use_tls {
            return Ok(None);
        }
        let files = CertificateFiles {
            cert: (
                Path::new(&settings.grpc_server_tls_cert),
                "GRPC_SERVER_TLS_CERT",
            ),
            key: (
                Path::new(&settings.grpc_server_tls_key),
                "GRPC_SERVER_TLS_KEY",
            ),
            client_ca: settings
                .client_ca()
                .map(|(path, name)| (Path::new(path), name)),
        };
        let parts = ServerCertificate::new(files, &settings.grpc_client_tls_san)?;
        let grpc = parts.config(b"h2")?;
        let http = settings
            .http_server_use_tls
            .then(|| parts.config(b"http/1.1"))
            .transpose()?;
        let watcher = parts.watch();
        tracing::warn!(
            cert = %settings.grpc_server_tls_cert,
            mutual = settings.client_ca().is_some(),
            http = settings.http_server_use_tls,
            "serving gRPC over TLS"
        );
        Ok(Some(ServerTls {
            grpc,
            http,
            _watch: watcher,
        }))
    }
}
