//! How the xDS client reaches its server: the endpoint (TLS when asked), the node it
//! announces, the metadata on the stream, the largest message, and the waits between
//! attempts. Everything is read and checked at start-up: a missing certificate file or
//! a header that cannot be sent stops it.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use envoy_types::pb::google::rpc::Status;
use ratelimit_proto::xds::TYPE_URL;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::settings::XdsSettings;

/// gRPC's default limit on a received message.
const DEFAULT_MAX_MESSAGE: usize = 4 * 1024 * 1024;
/// Time allowed to open a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK.
const INVALID_ARGUMENT: i32 = 3;

/// The server and how to talk to it.
#[derive(Debug)]
pub struct Connection {
    /// `CONFIG_GRPC_XDS_SERVER_URL`, for logs.
    pub url: String,
    endpoint: Endpoint,
    node: Node,
    headers: MetadataMap,
    max_message: usize,
    /// The wait between attempts until the first configuration arrives.
    pub retry_interval: Duration,
    backoff: Backoff,
}

impl Connection {
    /// The connection the settings describe.
    pub fn new(settings: &XdsSettings) -> Result<Connection, String> {
        let url = settings.xds_server_url.clone();
        let scheme = if settings.xds_server_use_tls {
            "https"
        } else {
            "http"
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{url}"))
            .map_err(|error| format!("CONFIG_GRPC_XDS_SERVER_URL={url}: {error}"))?
            .connect_timeout(CONNECT_TIMEOUT);
        if settings.xds_server_use_tls {
            endpoint = endpoint
                .tls_config(tls(settings)?)
                .map_err(|error| format!("CONFIG_GRPC_XDS_SERVER_USE_TLS: {error}"))?;
        }
        let mut headers = MetadataMap::new();
        for (name, value) in settings.xds_client_additional_headers.iter() {
            let bad = |error: &dyn std::fmt::Display| {
                format!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: '{name}:{value}': {error}")
            };
            let key = MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
                .map_err(|e| bad(&e))?;
            let value = MetadataValue::try_from(value.as_str()).map_err(|e| bad(&e))?;
            headers.insert(key, value);
        }
        let metadata = settings.xds_node_metadata.iter().map(|(key, value)| {
            let value = Value {
                kind: Some(Kind::StringValue(value.clone())),
            };
            (key.clone(), value)
        });
        Ok(Connection {
            url,
            endpoint,
            node: Node {
                id: settings.xds_node_id.clone(),
                metadata: Some(Struct {
                    fields: metadata.collect(),
                }),
                ..Node::default()
            },
            headers,
            max_message: match settings.xds_max_msg_size_in_bytes {
                0 => DEFAULT_MAX_MESSAGE,
                n => n,
            },
            retry_interval: settings.xds_server_connect_retry_interval,
            backoff: Backoff {
                initial: settings.xds_backoff_initial_interval,
                max: settings.xds_backoff_max_interval,
                spread: settings
                    .xds_backoff_jitter
                    .then_some(f64::from(settings.xds_backoff_random_factor)),
            },
        })
    }

    /// A client on a new connection.
    pub async fn client(&self) -> Result<AggregatedDiscoveryServiceClient<Channel>, String> {
        let channel = self
            .endpoint
            .connect()
            .await
            .map_err(|error| format!("cannot connect: {}", chain(&error)))?;
        Ok(AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.max_message))
    }

    /// `message` with the additional headers.
    pub fn with_headers<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        *request.metadata_mut() = self.headers.clone();
        request
    }

    /// A request for the rules: an ACK of `version` (the last accepted) answering
    /// `nonce`, or, with `error`, a NACK.
    pub fn request(&self, version: &str, nonce: &str, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(self.node.clone()),
            type_url: TYPE_URL.to_owned(),
            response_nonce: nonce.to_owned(),
            error_detail: error.map(|message| Status {
                code: INVALID_ARGUMENT,
                message,
                details: Vec::new(),
            }),
            ..DiscoveryRequest::default()
        }
    }

    /// The wait after `failures` attempts in a row failed since the last response.
    pub fn backoff(&self, failures: u32) -> Duration {
        self.backoff.wait(failures)
    }
}

/// Exponential back-off: the initial wait, doubled per failure, up to the maximum,
/// spread at random by up to `spread` of itself either way.
#[derive(Debug)]
struct Backoff {
    initial: Duration,
    max: Duration,
    spread: Option<f64>,
}

impl Backoff {
    fn wait(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        let base = self.initial.saturating_mul(1 << doublings).min(self.max);
        match self.spread {
            Some(spread) => base
                .mul_f64(1.0 + spread * (fastrand::f64() * 2.0 - 1.0))
                .min(self.max),
            None => base,
        }
    }
}

fn tls(settings: &XdsSettings) -> Result<ClientTlsConfig, String> {
    let read = |setting: &str, path: &str| {
        std::fs::read(path).map_err(|error| format!("{setting}={path}: {error}"))
    };
    let mut tls = ClientTlsConfig::new().with_native_roots();
    if !settings.xds_server_tls_cacert.is_empty() {
        let ca = read(
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            &settings.xds_server_tls_cacert,
        )?;
        tls = tls.ca_certificate(Certificate::from_pem(ca));
    }
    match (
        settings.xds_client_tls_cert.as_str(),
        settings.xds_client_tls_key.as_str(),
    ) {
        ("", "") => {}
        (cert, key) if !cert.is_empty() && !key.is_empty() => {
            let cert = read("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert)?;
            let key = read("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key)?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        _ => {
            return Err(
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together"
                    .into(),
            );
        }
    }
    if !settings.xds_server_tls_san.is_empty() {
        tls = tls.domain_name(settings.xds_server_tls_san.clone());
    }
    Ok(tls)
}

/// An error and its causes, on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_the_maximum_and_spreads_within_the_factor() {
        let fixed = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(700),
            spread: None,
        };
        let waits: Vec<u128> = (1..=5).map(|n| fixed.wait(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 700, 700]);
        let spread = Backoff {
            spread: Some(0.5),
            ..fixed
        };
        for _ in 0..100 {
            let wait = spread.wait(2).as_millis();
            assert!((100..=300).contains(&wait), "{wait}");
        }
    }
}
