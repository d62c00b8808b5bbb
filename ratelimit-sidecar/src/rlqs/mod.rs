//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`) on the
//! sidecar's gRPC port, next to RateLimitService, from the same rules and counters.
//!
//! Envoy's `rate_limit_quota` filter sorts requests into buckets, enforces an assignment
//! locally and reports usage on a stream. Here a bucket id maps onto the rule tree
//! ([`ratelimit_core::QuotaRule`]); a limited bucket's quota for the window is reserved
//! in the rule's counter ([`reserve`]) and split between the Envoys as the core's
//! [`ratelimit_core::grants`] says; what streams hold and queue is bounded in bytes
//! ([`budget`]).

mod assign;
mod bucket;
mod budget;
mod reserve;
mod stream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use ratelimit_core::stats::{Counter, StatsRegistry, names};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use self::budget::{Answers, Budget, QUEUED_ANSWERS};
use self::stream::EnvoyStream;
use crate::decider::Decider;

/// The service, shared by every worker.
#[derive(Clone)]
pub struct Rlqs(Arc<Shared>);

/// What every stream shares.
struct Shared {
    service: Arc<Decider>,
    /// The bucket state of every stream.
    budget: Budget,
    /// The process's bytes of answers waiting for their readers.
    queue: Arc<Semaphore>,
    /// Streams open per domain (at most RLQS_MAX_STREAMS entries): the Envoys that may
    /// share a bucket of it.
    domains: Mutex<HashMap<String, u64>>,
    /// BACKEND_FALLBACK_REPLICAS: each is taken to serve as many Envoys as this one.
    replicas: u64,
    /// The streams holding each bucket (by its canonical key), to nudge when an Envoy
    /// joins it short of its even share (bounded with the buckets: an entry per bucket a
    /// stream holds).
    holders: Mutex<HashMap<Arc<str>, Vec<Holder>>>,
    /// RLQS_ASSIGNMENT_TTL.
    ttl: Duration,
    streams: AtomicU64,
    /// Streams open now, and RLQS_MAX_STREAMS.
    open: Arc<AtomicUsize>,
    max_streams: usize,
    stats: Stats,
}

/// `ratelimit.rlqs.*`.
struct Stats {
    streams: Arc<Counter>,
    reports: Arc<Counter>,
    assignments: Arc<Counter>,
    abandoned: Arc<Counter>,
    buckets_refused: Arc<Counter>,
    streams_refused: Arc<Counter>,
    reserve_failed: Arc<Counter>,
    usage_refused: Arc<Counter>,
    streams_idle: Arc<Counter>,
    streams_slow: Arc<Counter>,
    answers_split: Arc<Counter>,
}

impl Stats {
    fn new(stats: &StatsRegistry) -> Stats {
        let counter = |name: &str| stats.counter(&names::rlqs(name));
        Stats {
            streams: counter("streams"),
            reports: counter("usage_reports"),
            assignments: counter("assignments"),
            abandoned: counter("abandoned"),
            buckets_refused: counter("buckets_refused"),
            streams_refused: counter("streams_refused"),
            reserve_failed: counter("reserve_failed"),
            usage_refused: counter("usage_refused"),
            streams_idle: counter("streams_idle"),
            streams_slow: counter("streams_slow"),
            answers_split: counter("answers_split"),
        }
    }
}

impl Rlqs {
    /// The service on `service`'s rules and backend; assignments live for `ttl`, and at
    /// most `max_streams` streams are open at once.
    pub fn new(service: Arc<Decider>, ttl: Duration, max_streams: usize) -> Rlqs {
        let stats = Stats::new(service.limiter.stats());
        let replicas = u64::from(service.outage.replicas().max(1));
        Rlqs(Arc::new(Shared {
            service,
            budget: Budget::default(),
            queue: budget::queue(),
            domains: Mutex::new(HashMap::new()),
            replicas,
            holders: Mutex::new(HashMap::new()),
            ttl,
            streams: AtomicU64::new(0),
            open: Arc::new(AtomicUsize::new(0)),
            max_streams,
            stats,
        }))
    }

    /// The tonic service to add to a server.
    pub fn server(&self) -> RateLimitQuotaServiceServer<Rlqs> {
        RateLimitQuotaServiceServer::new(self.clone())
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let open = Arc::clone(&self.0.open);
        if open.fetch_add(1, Ordering::AcqRel) >= self.0.max_streams {
            open.fetch_sub(1, Ordering::AcqRel);
            self.0.stats.streams_refused.add(1);
            tracing::warn!(
                max = self.0.max_streams,
                "RLQS stream refused: RLQS_MAX_STREAMS are open"
            );
            return Err(Status::resource_exhausted(format!(
                "{} quota streams are open (RLQS_MAX_STREAMS); try again later",
                self.0.max_streams
            )));
        }
        let id = self.0.streams.fetch_add(1, Ordering::Relaxed);
        self.0.stats.streams.add(1);
        let (tx, rx) = mpsc::channel(QUEUED_ANSWERS);
        let stream = EnvoyStream::new(id, Arc::clone(&self.0));
        tokio::spawn(async move {
            stream.run(request.into_inner(), tx).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
        Ok(Response::new(Answers(ReceiverStream::new(rx))))
    }
}

/// A stream holding a bucket, and where to nudge it.
type Holder = (u64, mpsc::Sender<Nudge>);

/// What one stream asks of the others holding a bucket.
#[derive(Debug, Clone)]
enum Nudge {
    /// An Envoy joined the bucket short of its even share: give back what you surely have
    /// not spent above yours.
    Give(Arc<str>),
    /// Quota of the bucket was given back: a joiner that started short may take it.
    Take(Arc<str>),
}

impl Shared {
    /// Stream `stream` holds bucket `key` and hears of it through `nudges` (`None`: no
    /// longer holds it).
    fn holds(&self, key: &Arc<str>, stream: u64, nudges: Option<&mpsc::Sender<Nudge>>) {
        let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        let list = holders.entry(Arc::clone(key)).or_default();
        list.retain(|(id, _)| *id != stream);
        if let Some(nudges) = nudges {
            list.push((stream, nudges.clone()));
        }
        if list.is_empty() {
            holders.remove(key);
        }
    }

    /// Tells every other stream holding `key` `nudge` (dropped for a stream whose nudges
    /// are full: it has work queued that will look at the bucket anyway).
    fn nudge(&self, key: &Arc<str>, from: u64, nudge: &Nudge) {
        let holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        for (stream, nudges) in holders.get(key).into_iter().flatten() {
            if *stream != from {
                let _ = nudges.try_send(nudge.clone());
            }
        }
    }

    /// A stream of `domain` opened (`true`) or ended.
    fn count_stream(&self, domain: &str, opened: bool) {
        let mut domains = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        if opened {
            *domains.entry(domain.to_owned()).or_default() += 1;
        } else if let Some(open) = domains.get_mut(domain) {
            *open -= 1;
            if *open == 0 {
                domains.remove(domain);
            }
        }
    }

    /// The Envoys that may share a bucket of `domain`: its streams open here, times the
    /// replicas.
    fn envoys(&self, domain: &str) -> u64 {
        let domains = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        domains.get(domain).copied().unwrap_or(1).max(1) * self.replicas
    }
}
