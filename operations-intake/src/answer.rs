//! The shapes of the service's answers: the acceptances, and every refusal as a
//! [`Failure`] of one [`Kind`], rendered in one place.
//!
//! A refusal's JSON keeps the members the service always had (`message`, and `id`,
//! `errors` where they apply) and adds the original service's `error`: a short human
//! string per kind (`Malformed JSON request body.`, `Not Found`, …). A client that
//! accepts `application/problem+json` gets RFC 9457 problem details instead
//! ([`crate::problem`]).

use bytes::Bytes;
use serde::Serialize;
use warp::http::header::CONTENT_TYPE;
use warp::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::batch::Problem;
use crate::limits::LimitHeaders;

/// An HTTP answer.
pub type Reply = Response<Bytes>;

/// The status of every acceptance: the broker acknowledged the batch, which is now on
/// the topic for later processing (or there was nothing to produce). A remembered answer
/// replayed for an `Idempotency-Key` has it too, since only acceptances are remembered.
pub const ACCEPTED: StatusCode = StatusCode::ACCEPTED;

/// The original service's answer to a batch it accepted; clients match on it.
pub const ACCEPTED_MESSAGE: &str = "Operations received and processing initiated.";

/// The original service's answer to an empty array.
pub const NOTHING_MESSAGE: &str = "No operations provided, but request accepted.";

/// Where an acknowledged batch landed.
#[derive(Serialize)]
pub struct Accepted<'a> {
    /// The batch id, also in the message key.
    pub id: &'a str,
    /// Its operations.
    pub count: u64,
    /// Its partition.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
}

/// 202 for an acknowledged batch; `message` comes first, as the original service's did.
pub fn accepted(batch: &Accepted<'_>) -> Reply {
    #[derive(Serialize)]
    struct Body<'a> {
        message: &'static str,
        #[serde(flatten)]
        batch: &'a Accepted<'a>,
    }
    json_reply(
        ACCEPTED,
        &Body {
            message: ACCEPTED_MESSAGE,
            batch,
        },
    )
}

/// 202 for an empty array: nothing was produced.
pub fn nothing_to_do() -> Reply {
    json_reply(
        ACCEPTED,
        &serde_json::json!({"message": NOTHING_MESSAGE, "count": 0}),
    )
}

/// Most problems listed in a 400; the rest are only counted, in `errors_omitted`, so a
/// 1 MiB body of 110 000 unknown fields is not answered with 11 MB of them.
pub const MAX_LISTED_PROBLEMS: usize = 100;

/// What kind of refusal an answer is: its status and its `error` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The body is not JSON at all (400).
    MalformedJson,
    /// The body or a header breaks the rules (400).
    Invalid,
    /// No usable credentials (401).
    Unauthenticated,
    /// The client's scopes do not cover the batch (403).
    Forbidden,
    /// No such route (404).
    NotFound,
    /// The route takes another method (405).
    MethodNotAllowed,
    /// The `Idempotency-Key` is held by a request still running (409).
    KeyInUse,
    /// The `Idempotency-Key` was used with another body (409).
    KeyReused,
    /// Over a size limit (413).
    TooLarge,
    /// Not `application/json` (415).
    UnsupportedMediaType,
    /// Over a rate limit (429).
    QuotaExceeded,
    /// Refused, nothing recorded: Kafka, the limits or the idempotency store is down (503).
    Unavailable,
    /// Sent, but the broker did not acknowledge: the batch may or may not be recorded (503).
    Unacknowledged,
    /// A bug (500).
    Internal,
}

impl Kind {
    /// The answer's status.
    pub fn status(self) -> StatusCode {
        match self {
            Kind::MalformedJson | Kind::Invalid => StatusCode::BAD_REQUEST,
            Kind::Unauthenticated => StatusCode::UNAUTHORIZED,
            Kind::Forbidden => StatusCode::FORBIDDEN,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Kind::KeyInUse | Kind::KeyReused => StatusCode::CONFLICT,
            Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Kind::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            Kind::Unavailable | Kind::Unacknowledged => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `error` member: the same for every answer of the kind.
    pub fn title(self) -> &'static str {
        match self {
            Kind::MalformedJson => "Malformed JSON request body.",
            Kind::Invalid => "Invalid request.",
            Kind::Unauthenticated => "Authentication required.",
            Kind::Forbidden => "Operation not allowed for this client.",
            Kind::NotFound => "Not Found",
            Kind::MethodNotAllowed => "Method not allowed.",
            Kind::KeyInUse => "Idempotency-Key in use.",
            Kind::KeyReused => "Idempotency-Key reused with a different body.",
            Kind::TooLarge => "Request too large.",
            Kind::UnsupportedMediaType => "Unsupported media type.",
            Kind::QuotaExceeded => "Rate limit exceeded.",
            Kind::Unavailable => "Service unavailable.",
            Kind::Unacknowledged => "Operations not acknowledged.",
            Kind::Internal => "Internal error.",
        }
    }
}

/// A refusal: its kind, today's `message`, and what else the answer carries (boxed, so
/// a `Result<_, Failure>` stays small).
#[derive(Debug)]
pub struct Failure(Box<Refusal>);

/// What a [`Failure`] holds.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) kind: Kind,
    /// Today's `message`, the problem's `detail`.
    pub(crate) message: String,
    pub(crate) id: Option<String>,
    pub(crate) errors: Vec<Problem>,
    /// Problems found but not kept (beyond those `errors` holds).
    pub(crate) omitted: usize,
    /// The names of the rate-limit policies a 429 is over.
    pub(crate) violated: Vec<String>,
    pub(crate) headers: HeaderMap,
}

impl Failure {
    /// A refusal of `kind` saying `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Failure {
        Failure(Box::new(Refusal {
            kind,
            message: message.into(),
            id: None,
            errors: Vec::new(),
            omitted: 0,
            violated: Vec::new(),
            headers: HeaderMap::new(),
        }))
    }

    /// A 400 listing `problems`; `Malformed JSON request body.` when the body is not JSON.
    pub fn invalid(problems: Vec<Problem>, malformed: bool) -> Failure {
        let kind = if malformed {
            Kind::MalformedJson
        } else {
            Kind::Invalid
        };
        let mut failure = Failure::new(kind, "the operations are not valid; nothing was recorded");
        failure.0.errors = problems;
        failure
    }

    /// The batch id the refusal concerns.
    pub fn with_id(mut self, id: &str) -> Failure {
        self.0.id = Some(id.to_owned());
        self
    }

    /// Adds a header to the answer.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Failure {
        self.0.headers.insert(name, value);
        self
    }

    /// Counts `n` more problems that were found but not kept.
    pub fn with_omitted(mut self, n: usize) -> Failure {
        self.0.omitted += n;
        self
    }

    /// Names the rate-limit policies the batch is over (problem details only).
    pub fn with_violated(mut self, policies: Vec<String>) -> Failure {
        self.0.violated = policies;
        self
    }

    /// Adds rate-limit headers to the answer.
    pub fn with_limit_headers(mut self, pairs: LimitHeaders) -> Failure {
        add_limit_headers(&mut self.0.headers, pairs);
        self
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        self.0.kind
    }

    /// The answer: JSON with `error`, `message`, and `id`, `errors` (at most
    /// [`MAX_LISTED_PROBLEMS`]) and `errors_omitted` where they apply.
    pub(crate) fn into_refusal(self) -> Refusal {
        *self.0
    }

    /// The answer as today's JSON.
    pub fn into_reply(self) -> Reply {
        let refusal = *self.0;
        #[derive(Serialize)]
        struct Body<'a> {
            error: &'static str,
            message: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            id: Option<&'a str>,
            #[serde(skip_serializing_if = "<[Problem]>::is_empty")]
            errors: &'a [Problem],
            #[serde(skip_serializing_if = "is_zero")]
            errors_omitted: usize,
        }
        let (errors, errors_omitted) = listed(&refusal);
        let mut reply = json_reply(
            refusal.kind.status(),
            &Body {
                error: refusal.kind.title(),
                message: &refusal.message,
                id: refusal.id.as_deref(),
                errors,
                errors_omitted,
            },
        );
        reply.headers_mut().extend(refusal.headers);
        reply
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The problems an answer lists, and how many more it leaves out.
pub(crate) fn listed(refusal: &Refusal) -> (&[Problem], usize) {
    let problems = &refusal.errors;
    let shown = problems.len().min(MAX_LISTED_PROBLEMS);
    (&problems[..shown], problems.len() - shown + refusal.omitted)
}

/// Adds rate-limit headers (name, value) to `headers`, skipping any that is not valid.
pub fn add_limit_headers(headers: &mut HeaderMap, pairs: LimitHeaders) {
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value),
        ) {
            headers.insert(name, value);
        }
    }
}

/// `body` as JSON with `status`.
pub fn json_reply(status: StatusCode, body: &impl Serialize) -> Reply {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut reply = Response::new(Bytes::from(bytes));
    *reply.status_mut() = status;
    reply.headers_mut().insert(CONTENT_TYPE, json_type());
    reply
}

/// `application/json`.
pub fn json_type() -> HeaderValue {
    HeaderValue::from_static("application/json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(reply: &Reply) -> serde_json::Value {
        serde_json::from_slice(reply.body()).unwrap()
    }

    #[test]
    fn refusals_keep_their_message_and_add_the_originals_error() {
        let reply = Failure::new(Kind::NotFound, "no such route").into_reply();
        assert_eq!(reply.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            body(&reply),
            serde_json::json!({"error": "Not Found", "message": "no such route"})
        );
        let reply = Failure::new(Kind::Unacknowledged, "retry")
            .with_id("b-1")
            .into_reply();
        assert_eq!(reply.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body(&reply)["id"], "b-1");
    }

    #[test]
    fn a_400_says_whether_the_body_was_json_at_all() {
        let malformed = Failure::invalid(vec![Problem::body("x")], true).into_reply();
        assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body(&malformed)["error"], "Malformed JSON request body.");
        assert_eq!(body(&malformed)["errors"][0]["message"], "x");
        let invalid = Failure::invalid(vec![Problem::body("x")], false).into_reply();
        assert_eq!(body(&invalid)["error"], "Invalid request.");
    }

    #[test]
    fn a_400_lists_at_most_100_problems_and_counts_the_rest() {
        let problems = (0..250).map(|i| Problem::header(&format!("h{i}"), "bad"));
        let json = body(&Failure::invalid(problems.collect(), false).into_reply());
        assert_eq!(
            json["errors"].as_array().unwrap().len(),
            MAX_LISTED_PROBLEMS
        );
        assert_eq!(json["errors"][99]["field"], "h99");
        assert_eq!(json["errors_omitted"], 150);
        let kept = (0..100).map(|i| Problem::header(&format!("h{i}"), "bad"));
        let counted = Failure::invalid(kept.collect(), false).with_omitted(7);
        assert_eq!(body(&counted.into_reply())["errors_omitted"], 7);
        let exactly = (0..100).map(|i| Problem::header(&format!("h{i}"), "bad"));
        let json = body(&Failure::invalid(exactly.collect(), false).into_reply());
        assert_eq!(json["errors"].as_array().unwrap().len(), 100);
        assert!(json.get("errors_omitted").is_none(), "{json}");
    }

    #[test]
    fn acceptances_are_202_with_the_originals_message_first() {
        let reply = accepted(&Accepted {
            id: "k",
            count: 2,
            partition: 0,
            offset: 7,
        });
        assert_eq!(reply.status(), StatusCode::ACCEPTED);
        let text = std::str::from_utf8(reply.body()).unwrap();
        assert!(
            text.starts_with(
                r#"{"message":"Operations received and processing initiated.","id":"k","count":2"#
            ),
            "{text}"
        );
        assert_eq!(nothing_to_do().status(), StatusCode::ACCEPTED);
        assert_eq!(body(&nothing_to_do())["message"], NOTHING_MESSAGE);
    }
}
