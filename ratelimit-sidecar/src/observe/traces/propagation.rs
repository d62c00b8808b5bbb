//! The caller's trace, from W3C `traceparent` (tried first, as envoyproxy/ratelimit's
//! composite propagator does) or from B3, in its single `b3` header or its `X-B3-*`
//! headers. Envoy sends B3 when its tracer is Zipkin; envoyproxy/ratelimit#1110.

use http::HeaderMap;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The context a request's span starts in: the remote parent its headers carry, if any.
pub fn parent(headers: &HeaderMap) -> Context {
    let w3c = TraceContextPropagator::new().extract(&Headers(headers));
    if w3c.span().span_context().is_valid() {
        return w3c;
    }
    match b3(headers) {
        Some(remote) => Context::new().with_remote_span_context(remote),
        None => Context::new(),
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A B3 parent: `b3: {trace}-{span}[-{sampling}[-{parent}]]`, else `X-B3-TraceId`,
/// `X-B3-SpanId` and `X-B3-Sampled` (or `X-B3-Flags: 1`, debug, which samples).
fn b3(headers: &HeaderMap) -> Option<SpanContext> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (trace, span, sampling) = match text("b3") {
        Some(single) => {
            let mut parts = single.split('-');
            let trace = parts.next()?;
            let span = parts.next()?;
            (trace, span, parts.next())
        }
        None => {
            let sampling = match text("x-b3-flags") {
                Some("1") => Some("d"),
                _ => text("x-b3-sampled"),
            };
            (text("x-b3-traceid")?, text("x-b3-spanid")?, sampling)
        }
    };
    let sampled = match sampling {
        Some("1" | "d" | "true") => TraceFlags::SAMPLED,
        Some("0" | "false") | None => TraceFlags::default(),
        Some(_) => return None,
    };
    let context = SpanContext::new(
        trace_id(trace)?,
        span_id(span)?,
        sampled,
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// A 64- or 128-bit trace id in lower-case hex (a 64-bit one is the low half).
fn trace_id(hex: &str) -> Option<TraceId> {
    if !matches!(hex.len(), 16 | 32) || !is_lower_hex(hex) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok().map(TraceId::from)
}

fn span_id(hex: &str) -> Option<SpanId> {
    if hex.len() != 16 || !is_lower_hex(hex) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok().map(SpanId::from)
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (http::HeaderName::from_static(k), v.parse().unwrap()))
            .collect()
    }

    fn remote(pairs: &[(&'static str, &'static str)]) -> Option<(String, String, bool)> {
        let context = parent(&headers(pairs));
        let span = context.span();
        let span = span.span_context();
        span.is_valid().then(|| {
            (
                span.trace_id().to_string(),
                span.span_id().to_string(),
                span.is_sampled(),
            )
        })
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn traceparent_wins_over_b3() {
        let got = remote(&[
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1"),
        ]);
        assert_eq!(got, Some((TRACE.into(), SPAN.into(), true)));
    }

    #[test]
    fn b3_single_and_multi_headers_are_read() {
        let single = remote(&[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1")]);
        assert_eq!(single, Some((TRACE.into(), SPAN.into(), true)));
        let unsampled = remote(&[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0")]);
        assert_eq!(unsampled, Some((TRACE.into(), SPAN.into(), false)));
        let multi = remote(&[
            ("x-b3-traceid", "a3ce929d0e0e4736"),
            ("x-b3-spanid", "00f067aa0ba902b7"),
            ("x-b3-flags", "1"),
        ]);
        assert_eq!(
            multi,
            Some(("0000000000000000a3ce929d0e0e4736".into(), SPAN.into(), true))
        );
    }

    #[test]
    fn malformed_parents_start_a_new_trace() {
        for pairs in [
            &[("traceparent", "00-zz-00f067aa0ba902b7-01")][..],
            &[("b3", "4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-1")],
            &[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-x")],
            &[("b3", "00000000000000000000000000000000-00f067aa0ba902b7")],
            &[("x-b3-traceid", "4bf92f3577b34da6a3ce929d0e0e4736")],
        ] {
            assert_eq!(remote(pairs), None, "{pairs:?}");
        }
    }
}
