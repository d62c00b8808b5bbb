//! A minimal xDS control plane for rate-limit rules: an Aggregated Discovery Service
//! (state of the world) that sends every stream the current set of
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` resources when it subscribes and
//! again whenever [`ControlPlane::publish`] replaces them. It keeps what clients sent
//! (the last [`MAX_SEEN`] requests, with their metadata), which tells ACKs from NACKs.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use ratelimit_proto::xds::TYPE_URL;
use ratelimit_proto::xds::pb::RateLimitConfig;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Requests kept for [`ControlPlane::seen`].
pub const MAX_SEEN: usize = 1000;

/// One version of the whole configuration.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The version clients ACK.
    pub version: String,
    /// Every resource, as Any values (a test may send anything).
    pub resources: Vec<Any>,
}

impl Snapshot {
    /// A snapshot of rate-limit configurations.
    pub fn of(version: &str, configs: &[RateLimitConfig]) -> Snapshot {
        Snapshot {
            version: version.to_owned(),
            resources: configs
                .iter()
                .map(|config| Any {
                    type_url: TYPE_URL.to_owned(),
                    value: config.encode_to_vec(),
                })
                .collect(),
        }
    }
}

/// A request a client sent, with the stream's metadata.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The stream's gRPC metadata, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The request.
    pub request: DiscoveryRequest,
}

impl Seen {
    /// A NACK's message, if this is one.
    pub fn nack(&self) -> Option<&str> {
        self.request
            .error_detail
            .as_ref()
            .map(|e| e.message.as_str())
    }
}

/// The server's state, shared by its streams (and kept across restarts of the server
/// when the same one is served again).
#[derive(Clone, Debug)]
pub struct ControlPlane {
    snapshot: watch::Sender<Option<Snapshot>>,
    seen: Arc<Mutex<VecDeque<Seen>>>,
}

impl Default for ControlPlane {
    fn default() -> Self {
        ControlPlane {
            snapshot: watch::Sender::new(None),
            seen: Arc::default(),
        }
    }
}

impl ControlPlane {
    /// Replaces the configuration: every stream gets it.
    pub fn publish(&self, snapshot: Snapshot) {
        self.snapshot.send_replace(Some(snapshot));
    }

    /// The requests received so far, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().iter().cloned().collect()
    }

    /// Whether the node `node_id` has asked with version `version`: it acknowledged that
    /// version's rules.
    pub fn acknowledged(&self, node_id: &str, version: &str) -> bool {
        self.seen.lock().unwrap().iter().any(|s| {
            let node = s.request.node.as_ref();
            node.is_some_and(|n| n.id == node_id) && s.request.version_info == version
        })
    }

    /// The gRPC service.
    pub fn service(&self) -> AggregatedDiscoveryServiceServer<ControlPlane> {
        AggregatedDiscoveryServiceServer::new(self.clone())
    }

    fn record(&self, headers: &[(String, String)], request: &DiscoveryRequest) {
        match &request.error_detail {
            Some(error) => eprintln!(
                "NACK of version {:?} (nonce {:?}): {}",
                request.version_info, request.response_nonce, error.message
            ),
            None if !request.response_nonce.is_empty() => {
                eprintln!("ACK of version {:?}", request.version_info);
            }
            None => {}
        }
        let mut seen = self.seen.lock().unwrap();
        if seen.len() == MAX_SEEN {
            seen.pop_front();
        }
        seen.push_back(Seen {
            headers: headers.to_vec(),
            request: request.clone(),
        });
    }
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for ControlPlane {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let headers: Vec<(String, String)> = request
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let mut inbound = request.into_inner();
        let mut snapshots = self.snapshot.subscribe();
        let plane = self.clone();
        let (responses, outbound) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut nonce = 0u64;
            let mut subscribed = false;
            loop {
                let send_now = tokio::select! {
                    request = inbound.message() => match request {
                        Ok(Some(request)) => {
                            plane.record(&headers, &request);
                            let first = !subscribed;
                            subscribed = true;
                            first
                        }
                        _ => return,
                    },
                    changed = snapshots.changed(), if subscribed => {
                        if changed.is_err() {
                            return;
                        }
                        true
                    }
                };
                let current = snapshots.borrow_and_update().clone();
                if let (true, Some(snapshot)) = (send_now, current) {
                    nonce += 1;
                    let response = DiscoveryResponse {
                        version_info: snapshot.version,
                        resources: snapshot.resources,
                        type_url: TYPE_URL.to_owned(),
                        nonce: nonce.to_string(),
                        ..DiscoveryResponse::default()
                    };
                    if responses.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(outbound))))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented(
            "this server speaks state of the world (StreamAggregatedResources) only",
        ))
    }
}
