//! TLS on the gRPC listener (envoyproxy/ratelimit's `GRPC_SERVER_*` and `GRPC_CLIENT_*`
//! variables) and, as this project's addition, on the HTTP `/json` listener.

use clap::{ArgAction, Args};

use ratelimit_service_kit::values::go_bool;

/// Server TLS and client certificates.
#[derive(Clone, Debug, Args)]
pub struct TlsSettings {
    /// Serve gRPC over TLS only (the TCP port; not with GRPC_UDS).
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub grpc_server_use_tls: bool,
    /// The server's certificate chain, PEM (watched: a change is loaded for new connections).
    #[arg(long, env, default_value = "")]
    pub grpc_server_tls_cert: String,
    /// The server's private key, PEM (watched with the certificate).
    #[arg(long, env, default_value = "")]
    pub grpc_server_tls_key: String,
    /// CA certificates, PEM, that client certificates must chain to: mutual TLS. Only
    /// these CAs are trusted (envoyproxy/ratelimit also trusts the system's).
    #[arg(long, env, default_value = "")]
    pub grpc_client_tls_cacert: String,
    /// Client certificates must chain to this CA when GRPC_CLIENT_TLS_CACERT is empty:
    /// Envoy Gateway's rate limit deployment sets this name (envoyproxy/ratelimit ignores it).
    #[arg(long, env, default_value = "")]
    pub grpc_server_tls_ca_cert: String,
    /// A DNS name the client certificate must carry (with GRPC_CLIENT_TLS_CACERT).
    #[arg(long, env, default_value = "")]
    pub grpc_client_tls_san: String,
    /// Serve the HTTP `/json` and `/healthcheck` listener over the same TLS, client
    /// certificates included (this project's addition; upstream's is plaintext).
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub http_server_use_tls: bool,
}

impl TlsSettings {
    /// The CA file client certificates must chain to, and the setting that named it.
    pub fn client_ca(&self) -> Option<(&str, &'static str)> {
        if !self.grpc_client_tls_cacert.is_empty() {
            Some((&self.grpc_client_tls_cacert, "GRPC_CLIENT_TLS_CACERT"))
        } else if !self.grpc_server_tls_ca_cert.is_empty() {
            Some((&self.grpc_server_tls_ca_cert, "GRPC_SERVER_TLS_CA_CERT"))
        } else {
            None
        }
    }

    /// Settings that contradict each other.
    pub fn check(&self, grpc_uds: &str) -> Result<(), String> {
        let server = self.grpc_server_use_tls;
        if let (false, Some((_, name))) = (server, self.client_ca()) {
            return Err(format!("{name}: mutual TLS needs GRPC_SERVER_USE_TLS=true"));
        }
        if self.client_ca().is_none() && !self.grpc_client_tls_san.is_empty() {
            return Err(
                "GRPC_CLIENT_TLS_SAN: checking client certificates needs GRPC_CLIENT_TLS_CACERT"
                    .into(),
            );
        }
        if !server && self.http_server_use_tls {
            return Err(
                "HTTP_SERVER_USE_TLS: the HTTP listener's TLS is GRPC_SERVER_USE_TLS's; set it too"
                    .into(),
            );
        }
        if server && (self.grpc_server_tls_cert.is_empty() || self.grpc_server_tls_key.is_empty()) {
            return Err(
                "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
                    .into(),
            );
        }
        if server && !grpc_uds.is_empty() {
            return Err(format!(
                "GRPC_SERVER_USE_TLS: gRPC is served on the unix socket GRPC_UDS={grpc_uds}, which takes no TLS; unset one of them"
            ));
        }
        Ok(())
    }
}
