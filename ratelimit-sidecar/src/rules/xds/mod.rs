//! The xDS configuration source (`CONFIG_TYPE=GRPC_XDS_SOTW`): a state-of-the-world ADS
//! client of `CONFIG_GRPC_XDS_SERVER_URL`, subscribed to every
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` resource.
//!
//! Each response is the whole configuration: its resources are turned into YAML rules
//! and loaded as one set of files would be (all or nothing, `MERGE_DOMAIN_CONFIG`
//! applies, the same validation and messages). A good set is applied and ACKed; a bad
//! one is NACKed with the loader's message while the previous rules keep serving. When
//! the stream breaks the rules stay, and the client reconnects: every
//! `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` until a first response arrived, then
//! with the `XDS_CLIENT_BACKOFF_*` back-off, which a response resets.

mod connect;

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use prost::Message;
use ratelimit_core::Config;
use ratelimit_proto::xds::pb::RateLimitConfig;
use ratelimit_proto::xds::{TYPE_URL, to_yaml};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

pub use self::connect::Connection;
use crate::decider::Decider;
use crate::rules;

/// Why the rules can be empty, for the warning.
const EMPTY: &str = "the xDS server sent no RateLimitConfig resource";

/// What the client keeps across streams.
struct State {
    /// The version of the last configuration applied.
    accepted: String,
    /// Told once the first response was handled (applied or rejected).
    first: Option<oneshot::Sender<()>>,
}

/// Keeps `service`'s rules in step with the server until the process exits. `first`
/// is told when the first response has been handled.
pub async fn run(
    connection: Connection,
    merge_domains: bool,
    service: Arc<Decider>,
    first: oneshot::Sender<()>,
) {
    let mut state = State {
        accepted: String::new(),
        first: Some(first),
    };
    tracing::warn!(server = %connection.url, "reading rate limit configuration over xDS");
    let mut failures = 0;
    loop {
        let (answered, error) = session(&connection, merge_domains, &service, &mut state).await;
        failures = if answered { 1 } else { failures + 1 };
        let wait = match state.first {
            Some(_) => connection.retry_interval,
            None => connection.backoff(failures),
        };
        tracing::error!(server = %connection.url, %error, retry_in = ?wait, "xDS stream ended; the current rules stay in use");
        tokio::time::sleep(wait).await;
    }
}

/// One stream, until it ends: whether the server sent anything, and why it ended.
async fn session(
    connection: &Connection,
    merge_domains: bool,
    service: &Decider,
    state: &mut State,
) -> (bool, String) {
    let mut client = match connection.client().await {
        Ok(client) => client,
        Err(error) => return (false, error),
    };
    let (requests, outbound) = mpsc::channel(4);
    let subscribe = connection.request(&state.accepted, "", None);
    let _ = requests.send(subscribe).await;
    let stream = connection.with_headers(ReceiverStream::new(outbound));
    let mut responses = match client.stream_aggregated_resources(stream).await {
        Ok(responses) => responses.into_inner(),
        Err(status) => return (false, format!("{:?}: {}", status.code(), status.message())),
    };
    tracing::info!(server = %connection.url, "connected to the xDS server");
    let mut answered = false;
    loop {
        let response = match responses.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return (answered, "the server closed the stream".into()),
            Err(status) => {
                return (
                    answered,
                    format!("{:?}: {}", status.code(), status.message()),
                );
            }
        };
        answered = true;
        let loaded = load(&response, merge_domains);
        let reply = match &loaded {
            Ok(_) => connection.request(&response.version_info, &response.nonce, None),
            Err(error) => connection.request(&state.accepted, &response.nonce, Some(error.clone())),
        };
        let accepted = loaded.is_ok();
        let source = format!("xDS {} version {}", connection.url, response.version_info);
        rules::apply_from(service, &source, EMPTY, loaded).await;
        if accepted {
            state.accepted = response.version_info;
        }
        if let Some(first) = state.first.take() {
            let _ = first.send(());
        }
        if requests.send(reply).await.is_err() {
            return (answered, "the stream closed".into());
        }
    }
}

/// The response's resources as one configuration, or why not.
fn load(response: &DiscoveryResponse, merge_domains: bool) -> Result<Config, String> {
    if response.type_url != TYPE_URL {
        return Err(format!("type {} is not {TYPE_URL}", response.type_url));
    }
    let mut files = Vec::with_capacity(response.resources.len());
    for (index, any) in response.resources.iter().enumerate() {
        if any.type_url != TYPE_URL {
            return Err(format!(
                "resource {index}: type {} is not {TYPE_URL}",
                any.type_url
            ));
        }
        let resource = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|error| format!("resource {index}: not a RateLimitConfig: {error}"))?;
        let name = match resource.name.as_str() {
            "" => format!("resource {index}"),
            name => name.to_owned(),
        };
        files.push((name, to_yaml(&resource)));
    }
    Config::from_files(files, merge_domains).map_err(|error| error.to_string())
}
