//! Server TLS: the certificate is reloaded when its files change, and client
//! certificates are checked against a CA (and a subject alternative name) when mutual
//! TLS is on.
//!
//! The certificate and key are read at start-up (a bad or missing file stops it, naming
//! the file) and again whenever their directories change. A reload that fails is
//! logged and the previous certificate stays; new connections get the new one, and
//! established connections keep theirs.

mod accept;
mod client_auth;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};

pub use self::accept::incoming;
use crate::watch::{Target, Watch};

/// A server certificate's files and the settings that name them, for messages.
#[derive(Clone, Copy, Debug)]
pub struct CertificateFiles<'a> {
    /// The certificate chain, PEM, and its setting.
    pub cert: (&'a Path, &'static str),
    /// The private key, PEM, and its setting.
    pub key: (&'a Path, &'static str),
    /// CA certificates that client certificates must chain to (mutual TLS), and their
    /// setting; none for no client certificates.
    pub client_ca: Option<(&'a Path, &'static str)>,
}

/// HTTP/1.1 over TLS for a service of this workspace other than the sidecar's listeners
/// (the intake): the certificate is reloaded when its files change while the returned
/// [`HttpTls`] lives; with a client CA, every client must present a certificate chaining to
/// it. A bad file is an error naming its setting.
pub fn http_server(files: CertificateFiles<'_>) -> Result<HttpTls, String> {
    let parts = ServerCertificate::new(files, "")?;
    Ok(HttpTls {
        config: parts.config(b"http/1.1")?,
        _watch: parts.watch(),
    })
}

/// What every server configuration is made of: the reloaded certificate and the check
/// of client certificates.
pub struct ServerCertificate {
    provider: Arc<CryptoProvider>,
    files: KeyFiles,
    current: Arc<Current>,
    clients: Arc<dyn ClientCertVerifier>,
}

impl ServerCertificate {
    /// Reads the certificate and the client CA (whose certificates must carry `san`
    /// when it is not empty).
    pub fn new(files: CertificateFiles<'_>, san: &str) -> Result<ServerCertificate, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key_files = KeyFiles {
            cert: files.cert.0.to_path_buf(),
            key: files.key.0.to_path_buf(),
            settings: (files.cert.1, files.key.1),
            provider: Arc::clone(&provider),
        };
        let current = Arc::new(Current(ArcSwap::new(key_files.read()?)));
        let clients = match files.client_ca {
            None => WebPkiClientVerifier::no_client_auth(),
            Some((ca, setting)) => {
                let ca = ca
                    .to_str()
                    .ok_or_else(|| format!("{setting}: not a UTF-8 path"))?;
                client_auth::verifier((ca, setting), san, &provider)?
            }
        };
        Ok(ServerCertificate {
            provider,
            files: key_files,
            current,
            clients,
        })
    }

    /// A configuration offering the ALPN protocol `alpn`.
    pub fn config(&self, alpn: &[u8]) -> Result<Arc<ServerConfig>, String> {
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_client_cert_verifier(Arc::clone(&self.clients))
            .with_cert_resolver(Arc::clone(&self.current) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(Arc::new(config))
    }

    /// Follows the certificate's files while the returned watch lives.
    pub fn watch(self) -> Option<Watch> {
        self.files.watch(self.current)
    }
}

/// The TLS of [`http_server`]: the certificate is followed while this lives.
#[derive(Debug)]
pub struct HttpTls {
    /// For [`crate::serve::serve`].
    pub config: Arc<ServerConfig>,
    _watch: Option<Watch>,
}

/// The certificate handed to every new connection.
#[derive(Debug)]
struct Current(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// Where the certificate and key are read from.
struct KeyFiles {
    cert: PathBuf,
    key: PathBuf,
    /// The settings naming the certificate and the key.
    settings: (&'static str, &'static str),
    provider: Arc<CryptoProvider>,
}

impl KeyFiles {
    /// The certificate chain and its key, checked to belong together.
    fn read(&self) -> Result<Arc<CertifiedKey>, String> {
        let (cert_setting, key_setting) = self.settings;
        let chain = read_certificates(&self.cert, cert_setting)?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|error| {
            format!(
                "{key_setting}={}: no usable private key: {error}",
                self.key.display()
            )
        })?;
        let certified = CertifiedKey::from_der(chain, key, &self.provider).map_err(|error| {
            format!(
                "{cert_setting}={} and {key_setting}={}: {error}",
                self.cert.display(),
                self.key.display()
            )
        })?;
        Ok(Arc::new(certified))
    }

    /// Reloads into `current` whenever the files' directories change, while the
    /// returned watch lives (none, with a warning, when they cannot be watched).
    fn watch(self, current: Arc<Current>) -> Option<Watch> {
        let mut targets = vec![
            Target::directory_of(&self.cert),
            Target::directory_of(&self.key),
        ];
        targets.dedup();
        let files = Arc::new(self);
        crate::watch::follow("the TLS certificate", targets, move || {
            match files.read() {
                Ok(next) if next.cert != current.0.load().cert => {
                    current.0.store(next);
                    tracing::warn!(cert = %files.cert.display(), "loaded a new TLS certificate for new connections");
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::error!(%error, "cannot reload the TLS certificate; keeping the previous one");
                }
            }
            std::future::ready(())
        })
    }
}

/// Every certificate in a PEM file, at least one; `setting` names the file in errors.
pub fn read_certificates(
    file: &Path,
    setting: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |error: &dyn std::fmt::Display| format!("{setting}={}: {error}", file.display());
    let certificates = CertificateDer::pem_file_iter(file)
        .map_err(|e| bad(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    if certificates.is_empty() {
        return Err(bad(&"no PEM certificate in the file"));
    }
    Ok(certificates)
}

/// A store of the certificates in `file`.
pub fn roots(file: &Path, setting: &str) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    for certificate in read_certificates(file, setting)? {
        store
            .add(certificate)
            .map_err(|error| format!("{setting}={}: {error}", file.display()))?;
    }
    Ok(store)
}
