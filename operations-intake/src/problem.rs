//! RFC 9457 problem details, for a client whose `Accept` names
//! `application/problem+json`: `type` (a stable URI per kind of refusal), `title`,
//! `status`, `detail`, and as extensions the batch `id`, the validation `errors` (each a
//! `detail` with a JSON `pointer` into the body, or the `header` at fault) with
//! `errors_omitted`, and for 429 the IANA `quota-exceeded` type with `violated-policies`.
//! Other clients keep the service's JSON ([`crate::answer`]).

use serde::Serialize;
use warp::http::header::{ACCEPT, CONTENT_TYPE};
use warp::http::{HeaderMap, HeaderValue};

use crate::answer::{Failure, Kind, Refusal, Reply, json_reply, listed};
use crate::batch::Problem;

/// The media type of a problem.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The prefix of this service's problem types; the kind's name follows.
pub const TYPE_PREFIX: &str = "tag:operations-intake,2026:problem:";

/// The IANA-registered type of an answer over a rate limit.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// How refusals are written for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// The service's JSON: `error`, `message`, …
    Json,
    /// RFC 9457 problem details.
    Problem,
}

impl Style {
    /// [`Style::Problem`] when an `Accept` header names `application/problem+json`
    /// (not with `q=0`).
    pub fn of(headers: &HeaderMap) -> Style {
        let wanted = headers
            .get_all(ACCEPT)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(accepts_problems);
        if wanted { Style::Problem } else { Style::Json }
    }
}

/// Whether one `Accept` element is `application/problem+json` with a non-zero weight.
fn accepts_problems(element: &str) -> bool {
    let mut parts = element.split(';');
    let media = parts.next().unwrap_or_default().trim();
    let refused = parts.any(|parameter| {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        name.trim().eq_ignore_ascii_case("q") && value.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
    });
    media.eq_ignore_ascii_case(PROBLEM_JSON) && !refused
}

/// The `type` of a kind of refusal.
pub fn type_uri(kind: Kind) -> String {
    let name = match kind {
        Kind::QuotaExceeded => return QUOTA_EXCEEDED.to_owned(),
        Kind::MalformedJson => "malformed-json",
        Kind::Invalid => "invalid-request",
        Kind::Unauthenticated => "unauthenticated",
        Kind::Forbidden => "forbidden-operation",
        Kind::NotFound => "not-found",
        Kind::MethodNotAllowed => "method-not-allowed",
        Kind::KeyInUse => "idempotency-key-in-use",
        Kind::KeyReused => "idempotency-key-reused",
        Kind::TooLarge => "too-large",
        Kind::UnsupportedMediaType => "unsupported-media-type",
        Kind::Unavailable => "unavailable",
        Kind::Unacknowledged => "unacknowledged",
        Kind::Internal => "internal",
    };
    format!("{TYPE_PREFIX}{name}")
}

/// One validation problem: where, and what.
#[derive(Serialize)]
struct Located<'a> {
    detail: &'a str,
    /// A JSON Pointer into the body, as a URI fragment (`#/0/unit-cost`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pointer: Option<String>,
    /// The request header at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<&'a str>,
}

impl<'a> Located<'a> {
    fn new(problem: &'a Problem) -> Located<'a> {
        let (pointer, header) = match (problem.index, problem.field.as_deref()) {
            (None, Some(header)) => (None, Some(header)),
            (None, None) => (Some("#".to_owned()), None),
            (Some(index), None) => (Some(format!("#/{index}")), None),
            (Some(index), Some(field)) => (Some(format!("#/{index}/{}", fragment(field))), None),
        };
        Located {
            detail: &problem.message,
            pointer,
            header,
        }
    }
}

/// `name` as a JSON Pointer reference token (RFC 6901: `~` as `~0`, `/` as `~1`) in a
/// URI fragment (RFC 3986: any other byte that may not appear there percent-encoded).
fn fragment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        match byte {
            b'~' => out.push_str("~0"),
            b'/' => out.push_str("~1"),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => out.push(byte as char),
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' => {
                out.push(byte as char);
            }
            b':' | b'@' | b'?' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// The problem details of `refusal`, with its headers.
/// `failure` in `style`: today's JSON, or problem details.
pub fn render(failure: Failure, style: Style) -> Reply {
    match style {
        Style::Json => failure.into_reply(),
        Style::Problem => reply(failure.into_refusal()),
    }
}

pub(crate) fn reply(refusal: Refusal) -> Reply {
    #[derive(Serialize)]
    struct Body<'a> {
        #[serde(rename = "type")]
        kind: String,
        title: &'static str,
        status: u16,
        detail: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        errors: Vec<Located<'a>>,
        #[serde(skip_serializing_if = "is_zero")]
        errors_omitted: usize,
        #[serde(
            rename = "violated-policies",
            skip_serializing_if = "<[String]>::is_empty"
        )]
        violated: &'a [String],
    }
    let (shown, errors_omitted) = listed(&refusal);
    let status = refusal.kind.status();
    let mut reply = json_reply(
        status,
        &Body {
            kind: type_uri(refusal.kind),
            title: refusal.kind.title(),
            status: status.as_u16(),
            detail: &refusal.message,
            id: refusal.id.as_deref(),
            errors: shown.iter().map(Located::new).collect(),
            errors_omitted,
            violated: &refusal.violated,
        },
    );
    reply.headers_mut().extend(refusal.headers);
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    reply
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::Failure;

    fn accept(values: &[&str]) -> Style {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(ACCEPT, HeaderValue::from_str(value).unwrap());
        }
        Style::of(&headers)
    }

    #[test]
    fn problems_are_written_only_for_clients_that_accept_them() {
        assert_eq!(accept(&["application/problem+json"]), Style::Problem);
        assert_eq!(
            accept(&["application/json", "Application/Problem+JSON; q=0.5"]),
            Style::Problem
        );
        assert_eq!(
            accept(&["text/html, application/problem+json"]),
            Style::Problem
        );
        assert_eq!(accept(&[]), Style::Json);
        assert_eq!(accept(&["application/json, */*"]), Style::Json);
        assert_eq!(accept(&["application/problem+json;q=0"]), Style::Json);
        assert_eq!(accept(&["application/problem+xml"]), Style::Json);
    }

    #[test]
    fn pointers_escape_the_field_names_they_carry() {
        assert_eq!(fragment("unit-cost"), "unit-cost");
        assert_eq!(fragment("a/b~c"), "a~1b~0c");
        assert_eq!(fragment("has space\"é#"), "has%20space%22%C3%A9%23");
    }

    #[test]
    fn a_400_lists_each_problem_with_a_pointer_or_its_header() {
        let problems = vec![
            Problem::header("Idempotency-Key", "bad key"),
            Problem::body("not an array"),
        ];
        let reply = render(Failure::invalid(problems, false), Style::Problem);
        assert_eq!(reply.headers()[CONTENT_TYPE], PROBLEM_JSON);
        let body: serde_json::Value = serde_json::from_slice(reply.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "tag:operations-intake,2026:problem:invalid-request",
                "title": "Invalid request.",
                "status": 400,
                "detail": "the operations are not valid; nothing was recorded",
                "errors": [
                    {"detail": "bad key", "header": "Idempotency-Key"},
                    {"detail": "not an array", "pointer": "#"},
                ],
            })
        );
    }
}
