//! OpenTelemetry traces: a server span per decision and a child span per backend round
//! trip, exported over OTLP (`TRACING_EXPORTER_PROTOCOL`, to the endpoint the standard
//! `OTEL_EXPORTER_OTLP_*` variables name) by a batch processor on the main runtime.
//!
//! Sampling is envoyproxy/ratelimit's: a parent's decision is followed, and a trace
//! started here is kept with probability `TRACING_SAMPLING_RATE`. The processor's queue
//! is bounded (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048 by default): when the collector is slow
//! spans are dropped, never the decision delayed.

mod https;
mod propagation;

use std::fmt::Display;

use http::HeaderMap;
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_otlp::{
    Protocol, SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use tonic::transport::ClientTlsConfig;

use ratelimit_core::{Code, Request, Response};

use crate::settings::TracingSettings;

/// Descriptors recorded on a span; a request may carry more (the count says how many).
const MAX_DESCRIPTORS: usize = 16;
/// Bytes of one descriptor's text recorded on a span.
const MAX_DESCRIPTOR_BYTES: usize = 256;

/// The tracer and the provider whose processor exports its spans.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Traces {
    /// The exporter the settings describe, or nothing when tracing is off. Must run on
    /// the runtime that is to export (its tasks carry the batches).
    pub fn start(settings: &TracingSettings) -> Result<Option<Traces>, String> {
        if !settings.tracing_enabled {
            return Ok(None);
        }
        let protocol = settings.tracing_exporter_protocol.as_str();
        let tls = configured_endpoint()
            .filter(|(_, endpoint)| endpoint.trim().to_ascii_lowercase().starts_with("https:"));
        let exporter = match (protocol, tls) {
            // The system's roots (SSL_CERT_FILE and SSL_CERT_DIR are honoured).
            ("grpc", Some(_)) => SpanExporter::builder()
                .with_tonic()
                .with_tls_config(ClientTlsConfig::new().with_native_roots())
                .build(),
            ("grpc", None) => SpanExporter::builder().with_tonic().build(),
            (_, Some(_)) => SpanExporter::builder()
                .with_http()
                .with_http_client(https::client())
                .with_protocol(Protocol::HttpBinary)
                .build(),
            (_, None) => SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build(),
        }
        .map_err(|error| format!("TRACING_ENABLED: the OTLP {protocol} exporter: {error}"))?;
        let instance = match settings.tracing_service_instance_id.as_str() {
            "" => random_uuid(),
            id => id.to_owned(),
        };
        let resource = Resource::builder()
            .with_service_name(settings.tracing_service_name.clone())
            .with_attributes([
                KeyValue::new(
                    "service.namespace",
                    settings.tracing_service_namespace.clone(),
                ),
                KeyValue::new("service.instance.id", instance.clone()),
            ])
            .build();
        let rate = f64::from(settings.tracing_sampling_rate);
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                rate,
            ))))
            .with_span_processor(BatchSpanProcessor::builder(exporter, Tokio).build())
            .with_resource(resource)
            .build();
        tracing::info!(
            protocol,
            service_name = %settings.tracing_service_name,
            service_namespace = %settings.tracing_service_namespace,
            service_instance_id = %instance,
            sampling_rate = rate,
            "exporting OTLP traces"
        );
        let tracer = provider.tracer("ratelimit");
        Ok(Some(Traces { provider, tracer }))
    }

    /// A server span named `name` for `request`, child of the trace its `headers` carry.
    pub fn request(
        &self,
        name: &'static str,
        headers: &HeaderMap,
        request: &Request,
    ) -> RequestSpan {
        let parent = propagation::parent(headers);
        let descriptors: Vec<StringValue> = request
            .descriptors
            .iter()
            .take(MAX_DESCRIPTORS)
            .map(|descriptor| {
                let mut text = String::new();
                for entry in &descriptor.entries {
                    if !text.is_empty() {
                        text.push(',');
                    }
                    text.push_str(&entry.key);
                    text.push('=');
                    text.push_str(&entry.value);
                }
                truncate(&mut text, MAX_DESCRIPTOR_BYTES);
                text.into()
            })
            .collect();
        let mut domain = request.domain.clone();
        truncate(&mut domain, MAX_DESCRIPTOR_BYTES);
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("ratelimit.domain", domain),
                KeyValue::new(
                    "ratelimit.descriptors",
                    Value::Array(Array::String(descriptors)),
                ),
                KeyValue::new(
                    "ratelimit.descriptor_count",
                    request.descriptors.len() as i64,
                ),
            ])
            .start_with_context(&self.tracer, &parent);
        RequestSpan {
            context: parent.with_span(span),
            tracer: self.tracer.clone(),
        }
    }

    /// Exports what is queued and stops the processor.
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        let result = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(error)) = result {
            tracing::warn!(%error, "the last spans were not exported");
        }
    }
}

/// The span of one decision.
#[derive(Debug)]
pub struct RequestSpan {
    context: Context,
    tracer: SdkTracer,
}

/// The span of a round trip to the `backend` for `counters` counters (a remote store's;
/// the memory store's are counted inside the engine), a child of `parent` when there is
/// one; [`BackendSpan::end`] ends it with the round trip's result. A span, not a wrapper
/// around the round trip's future, so that an untraced call is not copied into another.
pub fn backend(
    parent: Option<&RequestSpan>,
    backend: &'static str,
    counters: Option<usize>,
) -> BackendSpan {
    let Some(parent) = parent else {
        return BackendSpan(None);
    };
    let mut attributes = vec![KeyValue::new("db.system.name", backend)];
    if let Some(counters) = counters {
        attributes.push(KeyValue::new("ratelimit.counters", counters as i64));
    }
    let span = parent
        .tracer
        .span_builder(format!("{backend} counters"))
        .with_kind(SpanKind::Client)
        .with_attributes(attributes)
        .start_with_context(&parent.tracer, &parent.context);
    BackendSpan(Some(Box::new(span)))
}

/// A round trip's span, when the request is traced: boxed, so that an untraced request's
/// future, which holds it across the round trip, carries a pointer instead of a span.
pub struct BackendSpan(Option<Box<<SdkTracer as opentelemetry::trace::Tracer>::Span>>);

impl BackendSpan {
    /// Ends the span, with the error status when the round trip failed.
    pub fn end<T, E: Display>(self, result: &Result<T, E>) {
        let Some(mut span) = self.0 else { return };
        if let Err(error) = result {
            span.set_status(Status::error(error.to_string()));
        }
        span.end();
    }
}

impl RequestSpan {
    /// Ends the span with the decision, or with the error that took its place.
    pub fn finish<E: Display>(self, result: Result<&Response, &E>) {
        let span = self.context.span();
        match result {
            Ok(response) => {
                let statuses: Vec<StringValue> = response
                    .statuses
                    .iter()
                    .take(MAX_DESCRIPTORS)
                    .map(|status| code_name(status.code).into())
                    .collect();
                span.set_attribute(KeyValue::new(
                    "ratelimit.overall_code",
                    code_name(response.overall_code),
                ));
                span.set_attribute(KeyValue::new(
                    "ratelimit.statuses",
                    Value::Array(Array::String(statuses)),
                ));
            }
            Err(error) => span.set_status(Status::error(error.to_string())),
        }
        span.end();
    }
}

/// A code as Envoy's API names it.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// The variable that names the collector, and its value, as the exporters resolve it: an
/// `https://` collector is asked over TLS, with the system's roots.
fn configured_endpoint() -> Option<(&'static str, String)> {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .find_map(|name| {
        let value = std::env::var(name).ok().filter(|value| !value.is_empty())?;
        Some((name, value))
    })
}

/// A random version 4 UUID, as envoyproxy/ratelimit names an instance by default.
fn random_uuid() -> String {
    let bits = (u128::from(fastrand::u64(..)) << 64 | u128::from(fastrand::u64(..)))
        & !(0xf << 76 | 0x3 << 62)
        | 0x4 << 76
        | 0x2 << 62;
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_ids_are_version_4_uuids() {
        let id = random_uuid();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(&id[14..15], "4", "{id}");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, random_uuid());
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        let mut text = "é".repeat(200);
        truncate(&mut text, 255);
        assert_eq!(text.len(), 254);
    }
}
