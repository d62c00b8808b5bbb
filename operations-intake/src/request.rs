//! What a request to `POST /operations` says besides the caller: its body, read within
//! `MAX_BODY_BYTES`, and its `Content-Type`, `X-Client-Id` and `Idempotency-Key` headers.

use std::net::SocketAddr;

use bytes::{Buf, Bytes};
use futures_util::Stream;
use ratelimit_service_kit::body::{BodyError, read_bounded};
use warp::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use warp::http::{HeaderMap, HeaderValue};

use crate::answer::{Failure, Kind};
use crate::auth::keys::valid_client_id;
use crate::batch::Problem;
use crate::idempotency;

/// Reads the body, refusing more than `max` bytes (413) before reading them when the
/// length is announced; a body that cannot be read is a 400.
pub async fn read_body<S, B>(headers: &HeaderMap, body: S, max: usize) -> Result<Bytes, Failure>
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    let announced = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    read_bounded(announced, body, max as u64)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge => Failure::new(
                Kind::TooLarge,
                format!("the body is larger than MAX_BODY_BYTES ({max} bytes)"),
            ),
            BodyError::Read(error) => {
                let problem = Problem::body(format!("the body could not be read: {error}"));
                Failure::invalid(vec![problem], false)
            }
        })
}

/// Whether `body` is an empty JSON array (`[]`, with any JSON whitespace), which the
/// original service accepted and did nothing with.
pub fn is_empty_array(body: &[u8]) -> bool {
    let json_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut bytes = body.iter().filter(|b| !json_space(b));
    bytes.next() == Some(&b'[') && bytes.next() == Some(&b']') && bytes.next().is_none()
}

/// Whether `body` is not JSON at all (as opposed to JSON of the wrong shape).
pub fn is_malformed_json(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).is_err()
}

/// Whether the `Content-Type` is `application/json` (parameters allowed).
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// The `X-Client-Id` header, else the peer's IP address.
pub fn client_id(headers: &HeaderMap, peer: Option<SocketAddr>) -> Result<String, Problem> {
    Ok(client_header(headers)?.map_or_else(|| peer_id(peer), str::to_owned))
}

/// The `X-Client-Id` header, if any, checked.
pub fn client_header(headers: &HeaderMap) -> Result<Option<&str>, Problem> {
    let value = single(headers, "x-client-id").map_err(|()| repeated("X-Client-Id"))?;
    match value.map(HeaderValue::to_str) {
        Some(Ok(id)) if valid_client_id(id) => Ok(Some(id)),
        Some(_) => Err(Problem::header(
            "X-Client-Id",
            "must be 1 to 255 visible ASCII characters",
        )),
        None => Ok(None),
    }
}

/// A client named by its address.
pub fn peer_id(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "unknown".to_owned(), |p| p.ip().to_string())
}

/// The `Idempotency-Key` header, if any.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let value = single(headers, "idempotency-key").map_err(|()| repeated("Idempotency-Key"))?;
    match value.map(HeaderValue::to_str) {
        None => Ok(None),
        Some(Ok(key)) if idempotency::valid_key(key) => Ok(Some(key.to_owned())),
        Some(_) => Err(Problem::header(
            "Idempotency-Key",
            format!(
                "must be 1 to {} visible ASCII characters",
                idempotency::MAX_KEY_LEN
            ),
        )),
    }
}

/// The header `name`'s one value, if any; `Err` when the request has several, since
/// which one counts would depend on who reads the request (a proxy may read the last,
/// this service the first), and a batch resent with the other one would be recorded twice.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a HeaderValue>, ()> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (first, None) => Ok(first),
        (Some(_), Some(_)) => Err(()),
        (None, Some(_)) => unreachable!("a second value without a first"),
    }
}

fn repeated(header: &str) -> Problem {
    Problem::header(header, "send this header once; this request has several")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_sent_twice_is_refused_by_name() {
        let twice = |name: &'static str| {
            let mut headers = HeaderMap::new();
            headers.append(name, HeaderValue::from_static("first"));
            headers.append(name, HeaderValue::from_static("second"));
            headers
        };
        let message = "send this header once; this request has several";
        assert_eq!(
            idempotency_key(&twice("idempotency-key")),
            Err(Problem::header("Idempotency-Key", message))
        );
        assert_eq!(
            client_header(&twice("x-client-id")),
            Err(Problem::header("X-Client-Id", message))
        );
        let mut once = HeaderMap::new();
        once.insert("idempotency-key", HeaderValue::from_static("first"));
        assert_eq!(idempotency_key(&once), Ok(Some("first".to_owned())));
    }

    #[test]
    fn only_an_empty_array_is_empty() {
        for body in ["[]", " [ \n\t]\r\n"] {
            assert!(is_empty_array(body.as_bytes()), "{body:?}");
        }
        for body in ["", "[", "[[]]", "[] []", "[0]", "{}", "[\u{a0}]", "[]x"] {
            assert!(!is_empty_array(body.as_bytes()), "{body:?}");
        }
    }

    #[test]
    fn malformed_means_not_json_at_all() {
        for body in ["not json", "", "[", "[1,]", "{\"a\":}", "[] []"] {
            assert!(is_malformed_json(body.as_bytes()), "{body:?}");
        }
        for body in ["{}", "1", "null", "[{\"x\":1}]", "\"text\""] {
            assert!(!is_malformed_json(body.as_bytes()), "{body:?}");
        }
    }
}
