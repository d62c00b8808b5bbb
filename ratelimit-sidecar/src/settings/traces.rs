//! OpenTelemetry traces (envoyproxy/ratelimit's `TRACING_*` variables). Where spans go is
//! read from the standard `OTEL_EXPORTER_OTLP_*` variables, as the OTLP exporters do.

use clap::{ArgAction, Args};

use ratelimit_service_kit::values::{go_bool, ratio};

/// Trace export settings.
#[derive(Clone, Debug, Args)]
pub struct TracingSettings {
    /// Export one span per decision (and one per backend round trip) over OTLP.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub tracing_enabled: bool,
    /// OTLP over `http` (protobuf, to `<endpoint>/v1/traces`) or `grpc`.
    #[arg(long, env, default_value = "http", value_parser = ["http", "grpc"])]
    pub tracing_exporter_protocol: String,
    /// `service.name` of the spans' resource.
    #[arg(long, env, default_value = "RateLimit")]
    pub tracing_service_name: String,
    /// `service.namespace` of the spans' resource.
    #[arg(long, env, default_value = "")]
    pub tracing_service_namespace: String,
    /// `service.instance.id` of the spans' resource (default: a random version 4 UUID).
    #[arg(long, env, default_value = "")]
    pub tracing_service_instance_id: String,
    /// Share of traces started here that are kept, 0 to 1; a sampled parent (W3C
    /// `traceparent` or B3) is always followed.
    #[arg(long, env, default_value = "1", value_parser = ratio)]
    pub tracing_sampling_rate: f32,
}
