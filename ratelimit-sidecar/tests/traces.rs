//! OpenTelemetry traces from the real binary to OTLP collectors in the test (gRPC and
//! HTTP): spans, their attributes and resource, the caller's trace continued from W3C
//! `traceparent` and B3, the sampling rate, and the start-up errors.

use ratelimit_tests::sidecar as support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use ratelimit_tests::on_every_backend;
use ratelimit_tests::pki::temp_pki;
use support::{Options, Server, Store, ask, eventually, request};
use tokio_stream::wrappers::TcpListenerStream;
use warp::Filter;

const RULES: &str =
    "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// One exported span with its resource's attributes.
#[derive(Clone, Debug)]
struct Received {
    resource: Vec<KeyValue>,
    span: opentelemetry_proto::tonic::trace::v1::Span,
}

impl Received {
    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    fn attribute(&self, key: &str) -> Option<Value> {
        find(&self.span.attributes, key)
    }

    fn resource(&self, key: &str) -> Option<Value> {
        find(&self.resource, key)
    }
}

fn find(attributes: &[KeyValue], key: &str) -> Option<Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|value| value.value)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: &str) -> Option<Value> {
    Some(Value::StringValue(value.into()))
}

fn texts(values: &[&str]) -> Option<Value> {
    Some(Value::ArrayValue(
        opentelemetry_proto::tonic::common::v1::ArrayValue {
            values: values.iter().map(|v| AnyValue { value: text(v) }).collect(),
        },
    ))
}

/// What a collector received.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Received>>>);

impl Collector {
    fn store(&self, request: ExportTraceServiceRequest) {
        let mut spans = self.0.lock().unwrap();
        for resource_spans in request.resource_spans {
            let resource = resource_spans.resource.unwrap_or_default().attributes;
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(Received {
                        resource: resource.clone(),
                        span,
                    });
                }
            }
        }
    }

    fn spans(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }

    /// The spans of `trace`, once `count` of them have arrived.
    async fn wait_for(&self, trace: &str, count: usize) -> Vec<Received> {
        let of_trace = || -> Vec<Received> {
            let spans = self.spans();
            spans
                .into_iter()
                .filter(|s| s.trace_id() == trace)
                .collect()
        };
        let arrived = eventually(Duration::from_secs(20), || async {
            of_trace().len() >= count
        })
        .await;
        assert!(arrived, "{count} spans of {trace}: {:#?}", self.spans());
        of_trace()
    }

    /// An OTLP/gRPC collector on a free loopback port.
    async fn grpc() -> (Collector, u16) {
        Collector::grpc_with(tonic::transport::Server::builder()).await
    }

    /// An OTLP/gRPC collector answering TLS only, with `pki`'s server certificate.
    async fn grpc_tls(pki: &std::path::Path) -> (Collector, u16) {
        let read = |name: &str| std::fs::read(pki.join(name)).unwrap();
        let identity = tonic::transport::Identity::from_pem(read("server.crt"), read("server.key"));
        let tls = tonic::transport::ServerTlsConfig::new().identity(identity);
        let builder = tonic::transport::Server::builder().tls_config(tls).unwrap();
        Collector::grpc_with(builder).await
    }

    async fn grpc_with(mut builder: tonic::transport::Server) -> (Collector, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(
            builder
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        (collector, port)
    }

    /// An OTLP/HTTP (protobuf) collector answering TLS only, with `pki`'s server
    /// certificate.
    async fn https(pki: &std::path::Path) -> (Collector, u16) {
        use rustls::pki_types::pem::PemObject;
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(pki.join("server.crt"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(pki.join("server.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let collector = Collector::default();
        let store = collector.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, store) = (acceptor.clone(), store.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let export = hyper::service::service_fn(
                        move |request: hyper::Request<hyper::body::Incoming>| {
                            let store = store.clone();
                            async move {
                                use http_body_util::BodyExt;
                                let body = request.into_body().collect().await?.to_bytes();
                                store.store(
                                    ExportTraceServiceRequest::decode(body).expect("OTLP protobuf"),
                                );
                                let answer = ExportTraceServiceResponse::default().encode_to_vec();
                                Ok::<_, hyper::Error>(hyper::Response::new(
                                    http_body_util::Full::new(Bytes::from(answer)),
                                ))
                            }
                        },
                    );
                    let io = hyper_util::rt::TokioIo::new(tls);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, export)
                        .await;
                });
            }
        });
        (collector, port)
    }

    /// An OTLP/HTTP (protobuf) collector on a free loopback port.
    async fn http() -> (Collector, u16) {
        let collector = Collector::default();
        let store = collector.clone();
        let route = warp::path!("v1" / "traces")
            .and(warp::post())
            .and(warp::header::exact(
                "content-type",
                "application/x-protobuf",
            ))
            .and(warp::body::bytes())
            .map(move |body: Bytes| {
                store.store(ExportTraceServiceRequest::decode(body).expect("OTLP protobuf"));
                let body = ExportTraceServiceResponse::default().encode_to_vec();
                warp::reply::with_header(body, "content-type", "application/x-protobuf")
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(warp::serve(route).incoming(listener).run());
        (collector, port)
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.store(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn traced(protocol: &str, port: u16, extra: &[(&'static str, &str)]) -> Options {
    let mut env = vec![
        ("TRACING_ENABLED", "true".to_owned()),
        ("TRACING_EXPORTER_PROTOCOL", protocol.to_owned()),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    Options {
        env,
        ..Options::rules(RULES)
    }
}

async fn grpc_spans_carry_the_decision_and_continue_the_callers_trace(store: &Store) {
    let (collector, port) = Collector::grpc().await;
    let mut options = traced(
        "grpc",
        port,
        &[
            ("TRACING_SERVICE_NAME", "edge-limits"),
            ("TRACING_SERVICE_NAMESPACE", "payments"),
        ],
    );
    options.env.extend(store.env());
    let server = Server::start_with(options);
    let mut client = server.client().await;
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let mut codes = Vec::new();
    for _ in 0..2 {
        let mut call = tonic::Request::new(request("t", &[&[("user", "alice")]]));
        call.metadata_mut()
            .insert("traceparent", traceparent.parse().unwrap());
        codes.push(
            client
                .should_rate_limit(call)
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
    }
    assert_eq!(codes, [1, 2]);

    let spans = collector.wait_for(TRACE, 4).await;
    let (servers, backends): (Vec<_>, Vec<_>) = spans
        .iter()
        .partition(|s| s.span.kind == SpanKind::Server as i32);
    assert_eq!(servers.len(), 2, "{spans:#?}");
    let backend = store.name();
    for (server_span, code) in servers.iter().zip(["OK", "OVER_LIMIT"]) {
        let span = &server_span.span;
        assert_eq!(
            span.name,
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        );
        assert_eq!(hex(&span.parent_span_id), PARENT, "{span:#?}");
        assert_eq!(server_span.attribute("ratelimit.domain"), text("t"));
        assert_eq!(
            server_span.attribute("ratelimit.descriptors"),
            texts(&["user=alice"])
        );
        assert_eq!(server_span.attribute("ratelimit.overall_code"), text(code));
        assert_eq!(server_span.attribute("ratelimit.statuses"), texts(&[code]));
        assert_eq!(server_span.resource("service.name"), text("edge-limits"));
        assert_eq!(server_span.resource("service.namespace"), text("payments"));
        let Some(Value::StringValue(instance)) = server_span.resource("service.instance.id") else {
            panic!("no instance id: {server_span:#?}");
        };
        assert_eq!(instance.len(), 36, "{instance}");
        let child = backends
            .iter()
            .find(|b| b.span.parent_span_id == span.span_id)
            .unwrap_or_else(|| panic!("no backend span under {span:#?}: {backends:#?}"));
        assert_eq!(child.span.kind, SpanKind::Client as i32);
        assert_eq!(child.span.name, format!("{backend} counters"));
        assert_eq!(child.attribute("db.system.name"), text(backend));
        assert!(child.span.start_time_unix_nano >= span.start_time_unix_nano);
        assert!(child.span.end_time_unix_nano <= span.end_time_unix_nano);
    }
}

on_every_backend!(grpc_spans_carry_the_decision_and_continue_the_callers_trace);

#[tokio::test]
async fn http_export_follows_b3_parents_and_the_sampling_rate() {
    let (collector, port) = Collector::http().await;
    let server = Server::start_with(traced("http", port, &[("TRACING_SAMPLING_RATE", "0")]));
    let http = reqwest::Client::new();
    let json = |headers: &[(&'static str, &str)]| {
        let mut post = http
            .post(server.http_url("/json"))
            .body(r#"{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#);
        for (name, value) in headers {
            post = post.header(*name, *value);
        }
        post.send()
    };
    // Not sampled: a new trace at rate 0, and a parent that says not to.
    let unsampled = "80f198ee56343ba864fe8b2a57d3eff7";
    assert_eq!(json(&[]).await.unwrap().status(), 200);
    let b3_off = format!("{unsampled}-e457b5a2e4d86bd1-0");
    assert_eq!(json(&[("b3", &b3_off)]).await.unwrap().status(), 429);
    // Sampled by its B3 parent (multi-header form, 64-bit trace id).
    let sampled = json(&[
        ("x-b3-traceid", "a3ce929d0e0e4736"),
        ("x-b3-spanid", PARENT),
        ("x-b3-sampled", "1"),
    ]);
    assert_eq!(sampled.await.unwrap().status(), 429);

    let spans = collector
        .wait_for("0000000000000000a3ce929d0e0e4736", 2)
        .await;
    let root = spans
        .iter()
        .find(|s| s.span.kind == SpanKind::Server as i32)
        .expect("server span");
    assert_eq!(root.span.name, "POST /json");
    assert_eq!(hex(&root.span.parent_span_id), PARENT);
    assert_eq!(root.attribute("ratelimit.overall_code"), text("OVER_LIMIT"));
    assert_eq!(root.resource("service.name"), text("RateLimit"));
    // The unsampled requests ended before the sampled one: their spans would be in the
    // same or an earlier batch.
    let exported = collector.spans();
    assert_eq!(exported.len(), 2, "{exported:#?}");
}

/// The http exporter speaks TLS to an `https://` collector, as upstream's does.
#[tokio::test]
async fn http_export_reaches_an_https_collector_the_system_roots_trust() {
    let pki = temp_pki();
    let (collector, port) = Collector::https(pki.path()).await;
    export_to_an_https_collector(
        &collector,
        &pki,
        "http",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        port,
    )
    .await;
}

#[tokio::test]
async fn grpc_export_reaches_an_https_collector_the_system_roots_trust() {
    let pki = temp_pki();
    let (collector, port) = Collector::grpc_tls(pki.path()).await;
    export_to_an_https_collector(
        &collector,
        &pki,
        "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        port,
    )
    .await;
}

/// A traced call exported with `protocol` to the TLS collector on `port`, named by
/// `variable` as `https://`, trusted through `SSL_CERT_FILE` (`pki`'s CA).
async fn export_to_an_https_collector(
    collector: &Collector,
    pki: &tempfile::TempDir,
    protocol: &str,
    variable: &'static str,
    port: u16,
) {
    let mut options = traced(protocol, port, &[]);
    options
        .env
        .retain(|(name, _)| *name != "OTEL_EXPORTER_OTLP_ENDPOINT");
    options.env.extend([
        (variable, format!("https://127.0.0.1:{port}")),
        (
            "SSL_CERT_FILE",
            pki.path().join("ca.crt").display().to_string(),
        ),
    ]);
    let server = Server::start_with(options);
    let mut call = tonic::Request::new(request("t", &[&[("user", "carol")]]));
    call.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE}-{PARENT}-01").parse().unwrap(),
    );
    let answer = server.client().await.should_rate_limit(call).await.unwrap();
    assert_eq!(answer.into_inner().overall_code, 1);
    let spans = collector.wait_for(TRACE, 2).await;
    assert!(spans.iter().any(|s| s.span.kind == SpanKind::Server as i32));
}

#[tokio::test]
async fn a_collector_that_is_down_never_delays_a_decision() {
    // A collector that is down: every decision is still answered.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let server = Server::start_with(traced("grpc", port, &[]));
    let mut client = server.client().await;
    for i in 0..50 {
        let user = format!("u{i}");
        let answer = ask(&mut client, "t", &[&[("user", &user)]]).await;
        assert_eq!(answer.overall_code, 1);
    }
}
