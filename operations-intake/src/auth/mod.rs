//! Who is calling. With `AUTH=api-keys` (the default) a client sends
//! `Authorization: Bearer <key>` and is the client its key belongs to in
//! `API_KEYS_FILE`; with `AUTH=none` (development only) the client is whoever
//! `X-Client-Id` says, else the peer's address, as before authentication existed.
//!
//! The authenticated id, never a header, is what the limits count, what idempotency keys
//! are scoped to and what each message records.

pub mod keys;

use std::sync::Arc;

use arc_swap::ArcSwap;
use clap::ValueEnum;
use ratelimit_service_kit::serve::PeerCertificate;
use warp::http::header::AUTHORIZATION;
use warp::http::{HeaderMap, HeaderValue};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

pub use self::keys::{Client, KeyRing, Scopes};
use crate::batch::Batch;

/// `AUTH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Bearer keys from API_KEYS_FILE.
    #[value(name = "api-keys")]
    ApiKeys,
    /// Client certificates (mutual TLS, TLS_CLIENT_CA): the client is the certificate's
    /// first DNS or URI subject alternative name.
    Mtls,
    /// No authentication: `X-Client-Id` names the client. For development.
    None,
}

/// Why a request was not authenticated (401).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not `Bearer <key>`.
    Malformed,
    /// More than one `Authorization` header: which one counts would depend on who reads
    /// the request (a proxy may check the last, this service would read the first).
    Repeated,
    /// A key no client has.
    Unknown,
    /// `AUTH=mtls` and no client certificate (the handshake normally refuses first).
    NoCertificate,
    /// A client certificate without a DNS or URI name usable as a client id.
    Unnamed,
}

impl Refusal {
    /// The answer's message.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => {
                "authentication required: send Authorization: Bearer <key>; nothing was recorded"
            }
            Refusal::Malformed => {
                "the Authorization header must be Bearer followed by a key; nothing was recorded"
            }
            Refusal::Repeated => {
                "send one Authorization header; this request has several; nothing was recorded"
            }
            Refusal::Unknown => "unknown API key; nothing was recorded",
            Refusal::NoCertificate => "a client certificate is required; nothing was recorded",
            Refusal::Unnamed => {
                "the client certificate has no DNS or URI subject alternative name of 1 to 255 visible ASCII characters to name the client; nothing was recorded"
            }
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750).
    pub fn challenge(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Refusal::Missing => r#"Bearer realm="operations-intake""#,
            Refusal::Malformed | Refusal::Repeated => {
                r#"Bearer realm="operations-intake", error="invalid_request""#
            }
            Refusal::Unknown => r#"Bearer realm="operations-intake", error="invalid_token""#,
            // No HTTP scheme names TLS client certificates; this says what is expected.
            Refusal::NoCertificate | Refusal::Unnamed => r#"Mutual realm="operations-intake""#,
        })
    }
}

/// What the headers say about the caller.
#[derive(Debug)]
pub enum Caller {
    /// An authenticated client.
    Client(Client),
    /// `AUTH=none`: the client is named by `X-Client-Id` or its address.
    Unauthenticated,
    /// 401.
    Refused(Refusal),
}

/// The authentication in force; the keys are replaced whole on each reload.
pub struct Auth {
    mode: Mode,
    keys: ArcSwap<KeyRing>,
}

impl Auth {
    /// Authentication of `mode`, with no key until [`Auth::set_keys`].
    pub fn new(mode: Mode) -> Auth {
        Auth {
            mode,
            keys: ArcSwap::from_pointee(KeyRing::default()),
        }
    }

    /// Parses and puts in use the text of API_KEYS_FILE; on error nothing changes.
    pub fn set_keys(&self, text: &str) -> Result<(), String> {
        let ring = KeyRing::parse(text)?;
        if ring.is_empty() {
            tracing::warn!("API_KEYS_FILE lists no key: every request is refused (401)");
        } else {
            tracing::info!(keys = ring.len(), "API keys loaded");
        }
        self.keys.store(Arc::new(ring));
        Ok(())
    }

    /// Who sent a request with `headers` over a connection whose client presented
    /// `certificate`.
    pub fn caller(&self, headers: &HeaderMap, certificate: Option<&PeerCertificate>) -> Caller {
        match self.mode {
            Mode::None => return Caller::Unauthenticated,
            Mode::Mtls => {
                return match certificate {
                    None => Caller::Refused(Refusal::NoCertificate),
                    Some(PeerCertificate(der)) => match certificate_name(der) {
                        Some(id) => Caller::Client(Client {
                            id: id.into(),
                            scopes: Scopes::ALL,
                        }),
                        None => Caller::Refused(Refusal::Unnamed),
                    },
                };
            }
            Mode::ApiKeys => {}
        }
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let Some(value) = values.next() else {
            return Caller::Refused(Refusal::Missing);
        };
        if values.next().is_some() {
            return Caller::Refused(Refusal::Repeated);
        }
        let Some(key) = bearer(value.as_bytes()) else {
            return Caller::Refused(Refusal::Malformed);
        };
        match self.keys.load().client(key) {
            Some(client) => Caller::Client(client.clone()),
            None => Caller::Refused(Refusal::Unknown),
        }
    }
}

/// The key of a `Bearer` credential (the scheme in any case, then spaces, then a key of
/// visible ASCII up to [`keys::MAX_KEY_LEN`] bytes).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let key = value[7..].trim_ascii();
    let usable =
        (1..=keys::MAX_KEY_LEN).contains(&key.len()) && key.iter().all(u8::is_ascii_graphic);
    usable.then_some(key)
}

/// The client id a certificate names: its first DNS or URI subject alternative name
/// that is a valid client id.
pub fn certificate_name(der: &[u8]) -> Option<String> {
    let (_, certificate) = X509Certificate::from_der(der).ok()?;
    let names = certificate.subject_alternative_name().ok()??;
    names
        .value
        .general_names
        .iter()
        .find_map(|name| match name {
            GeneralName::DNSName(id) | GeneralName::URI(id) if keys::valid_client_id(id) => {
                Some((*id).to_owned())
            }
            _ => None,
        })
}

/// The first kind of operation in `batch` that `scopes` do not allow, if any (403).
pub fn forbidden(scopes: Scopes, batch: &Batch) -> Option<&'static str> {
    batch
        .kinds()
        .find(|(kind, _)| !scopes.allows(*kind))
        .map(|(kind, _)| kind.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn bearer_keys_name_their_client_and_anything_else_is_refused() {
        let (key, entry) = keys::generate("acme", None).unwrap();
        let auth = Auth::new(Mode::ApiKeys);
        auth.set_keys(&entry).unwrap();
        let caller = |value: Option<&str>| auth.caller(&headers(value), None);
        assert!(
            matches!(caller(Some(&format!("Bearer {key}"))), Caller::Client(c) if &*c.id == "acme")
        );
        assert!(matches!(
            caller(Some(&format!("bearer   {key} "))),
            Caller::Client(_)
        ));
        assert!(matches!(caller(None), Caller::Refused(Refusal::Missing)));
        assert!(matches!(
            caller(Some(&format!("Basic {key}"))),
            Caller::Refused(Refusal::Malformed)
        ));
        assert!(matches!(
            caller(Some("Bearer ")),
            Caller::Refused(Refusal::Malformed)
        ));
        assert!(matches!(
            caller(Some("Bearer oik_0000")),
            Caller::Refused(Refusal::Unknown)
        ));
        // A bad file changes nothing.
        assert!(auth.set_keys("- client_id: x\n").is_err());
        assert!(matches!(
            caller(Some(&format!("Bearer {key}"))),
            Caller::Client(_)
        ));
        // Rotation: the file without the key.
        auth.set_keys("[]").unwrap();
        assert!(matches!(
            caller(Some(&format!("Bearer {key}"))),
            Caller::Refused(Refusal::Unknown)
        ));
    }

    #[test]
    fn two_authorization_headers_are_refused_whatever_their_order() {
        let (key, entry) = keys::generate("acme", None).unwrap();
        let auth = Auth::new(Mode::ApiKeys);
        auth.set_keys(&entry).unwrap();
        let good = HeaderValue::from_str(&format!("Bearer {key}")).unwrap();
        let bad = HeaderValue::from_static("Bearer oik_0000");
        for pair in [[&good, &bad], [&bad, &good], [&good, &good]] {
            let mut headers = HeaderMap::new();
            for value in pair {
                headers.append(AUTHORIZATION, value.clone());
            }
            assert!(matches!(
                auth.caller(&headers, None),
                Caller::Refused(Refusal::Repeated)
            ));
        }
    }

    #[test]
    fn without_authentication_nobody_is_refused() {
        let auth = Auth::new(Mode::None);
        assert!(matches!(
            auth.caller(&headers(None), None),
            Caller::Unauthenticated
        ));
    }

    #[test]
    fn scopes_cover_every_kind_in_the_batch_or_name_the_first_that_is_not() {
        let buy_only = KeyRing::parse(&format!(
            "- client_id: a\n  key_sha256: {}\n  scopes: [buy]\n",
            keys::sha256_hex(b"k")
        ))
        .unwrap();
        let scopes = buy_only.client(b"k").unwrap().scopes;
        let batch = |buys, sells| Batch {
            count: buys + sells,
            buys,
            sells,
        };
        assert_eq!(forbidden(scopes, &batch(3, 0)), None);
        assert_eq!(forbidden(scopes, &batch(3, 1)), Some("sell"));
        assert_eq!(forbidden(Scopes::ALL, &batch(3, 1)), None);
    }
}
