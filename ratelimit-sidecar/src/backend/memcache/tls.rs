//! `MEMCACHE_TLS`: connections to the nodes over TLS, trusting the system's CAs and
//! `MEMCACHE_TLS_CACERT`, presenting `MEMCACHE_TLS_CLIENT_CERT` when given, and checking
//! the node's name unless `MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION` (the chain is always
//! checked). A node's name is the host of its address (the SRV target for discovered
//! nodes; upstream checks the resolved IP).

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, Error, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::backend::BackendError;
use crate::settings::MemcacheSettings;

/// How to open TLS to a node.
#[derive(Clone)]
pub struct Tls(TlsConnector);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// The TLS the settings ask for, or nothing when MEMCACHE_TLS is off.
    pub fn new(settings: &MemcacheSettings) -> Result<Option<Tls>, BackendError> {
        if !settings.memcache_tls {
            return Ok(None);
        }
        let bad = BackendError::Settings;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        if !settings.memcache_tls_cacert.is_empty() {
            let extra = ratelimit_service_kit::tls::roots(
                Path::new(&settings.memcache_tls_cacert),
                "MEMCACHE_TLS_CACERT",
            )
            .map_err(bad)?;
            roots.roots.extend(extra.roots);
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                .build()
                .map_err(|e| bad(format!("MEMCACHE_TLS: {e}")))?;
        let verifier: Arc<dyn ServerCertVerifier> =
            if settings.memcache_tls_skip_hostname_verification {
                Arc::new(AnyName(verifier))
            } else {
                verifier
            };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(format!("MEMCACHE_TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (
            settings.memcache_tls_client_cert.as_str(),
            settings.memcache_tls_client_key.as_str(),
        ) {
            ("", "") => builder.with_no_client_auth(),
            (cert, key) if !cert.is_empty() && !key.is_empty() => {
                let chain = ratelimit_service_kit::tls::read_certificates(
                    Path::new(cert),
                    "MEMCACHE_TLS_CLIENT_CERT",
                )
                .map_err(bad)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| bad(format!("MEMCACHE_TLS_CLIENT_KEY={key}: {e}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad(format!("MEMCACHE_TLS_CLIENT_CERT={cert}: {e}")))?
            }
            _ => {
                return Err(bad(
                    "MEMCACHE_TLS_CLIENT_CERT and MEMCACHE_TLS_CLIENT_KEY go together".into(),
                ));
            }
        };
        Ok(Some(Tls(TlsConnector::from(Arc::new(config)))))
    }

    /// TLS over `stream` to the node named `address` (`host:port`).
    pub async fn wrap(
        &self,
        address: &str,
        stream: TcpStream,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let host = address
            .rsplit_once(':')
            .map_or(address, |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.');
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        self.0.connect(name, stream).await
    }
}

/// The chain check without the name check.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
