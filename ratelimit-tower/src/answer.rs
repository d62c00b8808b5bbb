//! What the limiter says about one request, as HTTP.

use http::header::RETRY_AFTER;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use ratelimit_core::UnixMillis;
use ratelimit_core::{Code, CounterStore, Descriptor, Request, Retry};

use crate::layer::RateLimitLayer;

/// Whether a request goes on to the service, with the headers either answer carries.
pub(crate) enum Verdict {
    /// Within its limits, or not limited: these headers are added to the response.
    Pass(HeaderMap),
    /// Answered here, with this status and these headers.
    Refuse(StatusCode, HeaderMap),
}

impl<F, S> RateLimitLayer<F, S>
where
    F: Fn(&Parts) -> Vec<Descriptor>,
    S: CounterStore,
{
    /// Decides the request whose head is `parts`.
    pub(crate) fn judge(&self, parts: &Parts) -> Verdict {
        let descriptors = (self.descriptors)(parts);
        if descriptors.is_empty() {
            return Verdict::Pass(HeaderMap::new());
        }
        let request = Request::new(&*self.domain, descriptors);
        let now_ms = (self.clock)();
        let response =
            match self
                .limiter
                .should_rate_limit(&request, &*self.store, UnixMillis(now_ms))
            {
                Ok(response) => response,
                // Fail loudly: a request the limiter cannot judge is not let through.
                Err(error) if error.is_invalid_argument() => {
                    return Verdict::Refuse(StatusCode::BAD_REQUEST, HeaderMap::new());
                }
                Err(_) => {
                    return Verdict::Refuse(StatusCode::SERVICE_UNAVAILABLE, HeaderMap::new());
                }
            };
        let mut headers = HeaderMap::new();
        for (name, value) in response.header_pairs(&self.format) {
            // Names were checked when the format was set; values are numbers and
            // structured-field strings of printable ASCII.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                headers.insert(name, value);
            }
        }
        if response.overall_code == Code::Ok {
            return Verdict::Pass(headers);
        }
        if let Some(Retry::After(seconds)) = response.retry(&request) {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        }
        Verdict::Refuse(StatusCode::TOO_MANY_REQUESTS, headers)
    }
}
