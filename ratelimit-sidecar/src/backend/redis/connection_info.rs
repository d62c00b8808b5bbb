//! Where and as whom a Redis deployment is reached: `REDIS_URL` as an address for its
//! socket type, `REDIS_AUTH`-style credentials, and the TLS client of `rediss://`.

use redis::{
    Client, ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    RedisConnectionInfo, TlsCertificates,
};

use super::TlsFiles;
use crate::backend::BackendError;

/// `password` or `user:password`.
pub(super) fn credentials(auth: &str) -> (Option<String>, Option<String>) {
    match auth.split_once(':') {
        _ if auth.is_empty() => (None, None),
        Some((user, password)) => (Some(user.to_owned()), Some(password.to_owned())),
        None => (None, Some(auth.to_owned())),
    }
}

/// A client for `rediss://host:port` with the configured CA and client certificate.
pub(super) fn tls_client(
    url: &str,
    info: RedisConnectionInfo,
    files: &TlsFiles,
) -> Result<redis::RedisResult<Client>, BackendError> {
    let read = |what: &str, path: &str| {
        std::fs::read(path).map_err(|e| BackendError::Settings(format!("{what} {path}: {e}")))
    };
    let client_tls = match (files.client_cert.is_empty(), files.client_key.is_empty()) {
        (true, true) => None,
        (false, false) => Some(ClientTlsConfig {
            client_cert: read("REDIS_TLS_CLIENT_CERT", &files.client_cert)?,
            client_key: read("REDIS_TLS_CLIENT_KEY", &files.client_key)?,
        }),
        _ => {
            return Err(BackendError::Settings(
                "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together".into(),
            ));
        }
    };
    let root_cert = (!files.ca_cert.is_empty())
        .then(|| read("REDIS_TLS_CACERT", &files.ca_cert))
        .transpose()?;
    let info = format!("rediss://{url}")
        .into_connection_info()
        .map_err(|e| BackendError::Settings(format!("REDIS_URL '{url}': {e}")))?
        .set_redis_settings(info);
    let client = match Client::build_with_tls(
        info,
        TlsCertificates {
            client_tls,
            root_cert,
        },
    ) {
        Ok(client) => client,
        Err(error) => return Ok(Err(error)),
    };
    if !files.skip_hostname_verification {
        return Ok(Ok(client));
    }
    // The chain is still verified against the CA; only the name check is dropped.
    let info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    addr.set_danger_accept_invalid_hostnames(true);
    Ok(Client::open(info.set_addr(addr)))
}

/// A sentinel's address, with `REDIS_SENTINEL_AUTH` credentials when given.
pub(super) fn sentinel_address(
    socket_type: &str,
    url: &str,
    auth: &str,
) -> Result<ConnectionInfo, BackendError> {
    let (user, password) = credentials(auth);
    let mut info = RedisConnectionInfo::default();
    if let Some(user) = user {
        info = info.set_username(user);
    }
    if let Some(password) = password {
        info = info.set_password(password);
    }
    Ok(address(socket_type, url)?.set_redis_settings(info))
}

pub(super) fn address(socket_type: &str, url: &str) -> Result<ConnectionInfo, BackendError> {
    let addr = match socket_type {
        "unix" if !std::path::Path::new(url).exists() => {
            let host_port = url
                .rsplit_once(':')
                .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
            return Err(if host_port {
                BackendError::Settings(format!(
                    "REDIS_URL '{url}' looks like host:port, but REDIS_SOCKET_TYPE is unix (the default) and no socket exists at that path: set REDIS_SOCKET_TYPE=tcp"
                ))
            } else {
                BackendError::Unavailable(format!(
                    "REDIS_URL '{url}': no unix socket at this path (REDIS_SOCKET_TYPE=unix)"
                ))
            });
        }
        "unix" => ConnectionAddr::Unix(url.into()),
        "tcp" => {
            let (host, port) = url
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                .ok_or_else(|| {
                    BackendError::Settings(format!("REDIS_URL '{url}' is not host:port"))
                })?;
            ConnectionAddr::Tcp(host, port)
        }
        other => {
            return Err(BackendError::Settings(format!(
                "REDIS_SOCKET_TYPE={other}: expected tcp or unix"
            )));
        }
    };
    addr.into_connection_info()
        .map_err(|e| BackendError::Settings(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_password_or_user_and_password() {
        assert_eq!(credentials(""), (None, None));
        assert_eq!(credentials("secret"), (None, Some("secret".into())));
        assert_eq!(
            credentials("alice:s:3"),
            (Some("alice".into()), Some("s:3".into()))
        );
    }

    #[test]
    fn addresses_by_socket_type() {
        assert!(
            matches!(address("tcp", "127.0.0.1:6379").unwrap().addr(), ConnectionAddr::Tcp(h, 6379) if h == "127.0.0.1")
        );
        let socket = std::env::temp_dir();
        assert!(matches!(
            address("unix", socket.to_str().unwrap()).unwrap().addr(),
            ConnectionAddr::Unix(_)
        ));
        // Upstream's default socket type with a host:port is a settings error with a hint;
        // a socket path that does not exist yet is retried.
        let hint = address("unix", "127.0.0.1:28379").unwrap_err();
        assert!(
            matches!(&hint, BackendError::Settings(m) if m.contains("set REDIS_SOCKET_TYPE=tcp")),
            "{hint}"
        );
        let missing = address("unix", "/nonexistent/redis.sock").unwrap_err();
        assert!(
            matches!(&missing, BackendError::Unavailable(m) if m.contains("/nonexistent/redis.sock")),
            "{missing}"
        );
        assert!(address("tcp", "nohost").is_err());
        assert!(address("udp", "x:1").is_err());
    }
}
