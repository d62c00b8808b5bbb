//! The decider shared by the gRPC and HTTP front ends: one entry point,
//! [`Decider::decide`], takes a [`Call`] (the request decoded into the core's form, its
//! transport, its deadline and trace span) and answers it. Around it, once for every
//! transport: the call's statistics, the bound on calls in flight, the failure mode when
//! the store is away ([`outage`]) and the span's end. The dynamic metadata of answers is
//! [`metadata`]'s; the buffers recycled from one decision to the next are [`buffers`]'.

pub(crate) mod buffers;
pub mod metadata;
pub mod outage;

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ratelimit_service_kit::clock::{unix_ms, unix_now_ms};

use bytes::BytesMut;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http::HeaderMap;
use ratelimit_core::stats::{Counter, Timer, names};
use ratelimit_core::{
    Explanation, HeaderFormat, Limiter, MemoryStore, Plan, Request, RequestError, Response,
    UnixMillis,
};
use ratelimit_proto::envoy::{InvalidRequest, request_from_pb, response_to_pb};
use ratelimit_proto::wire::encode_response;

use crate::backend::write_behind::WriteBehind;
use crate::backend::{Backend, BackendError, Remote, Totals};
use crate::decider::metadata::dynamic_metadata;
use crate::decider::outage::{Outage, Overloaded};
use crate::observe::health::Health;
use crate::observe::traces::{self, RequestSpan, Traces};

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    /// The request is malformed beyond what envoyproxy/ratelimit reports (a bad override).
    #[error("{0}")]
    Invalid(#[from] InvalidRequest),
    /// Empty domain, no descriptors, or no configuration loaded.
    #[error("{0}")]
    Request(#[from] RequestError),
    /// The counter store failed or did not answer in time.
    #[error("{0}")]
    Backend(#[from] BackendError),
    /// MAX_INFLIGHT_REQUESTS requests are being decided.
    #[error("{0}")]
    Overloaded(#[from] Overloaded),
}

/// How a call came in, which decides how it is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `ShouldRateLimit`, counted in `ratelimit_server.ShouldRateLimit.*` as upstream's
    /// gRPC interceptor counts every call.
    Grpc,
    /// `POST /json`, not counted as a gRPC call (as upstream's handler does).
    Json,
}

impl Transport {
    /// The name of a call's trace span, as OpenTelemetry names RPC and HTTP spans.
    pub fn span_name(self) -> &'static str {
        match self {
            Transport::Grpc => "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            Transport::Json => "POST /json",
        }
    }
}

/// One call to decide.
#[derive(Debug)]
pub struct Call {
    /// The request in the core's form, or why it could not be decoded into it.
    pub request: Result<Request, InvalidRequest>,
    /// How it came in.
    pub transport: Transport,
    /// The caller's deadline (`grpc-timeout`), which bounds a remote store's call.
    pub deadline: Option<Duration>,
    /// Its trace span, when tracing ([`Decider::span`]).
    pub span: Option<RequestSpan>,
}

/// A request in the core's form and its decision, which [`Decider::encode`] encodes.
#[derive(Debug)]
pub struct Decided {
    request: Request,
    response: Response,
}

impl Decided {
    /// The request decided, for another to be decoded into.
    pub fn into_request(self) -> Request {
        self.request
    }
}

/// A call's decision: ready at once on the memory store, which waits for nothing (no
/// task switch, no allocation), or a future waiting for a remote store.
pub enum Decision {
    /// Decided.
    Ready(Result<Decided, DecisionError>),
    /// Waiting for the store.
    Waiting(Waiting),
}

/// A decision waiting for a remote store.
pub type Waiting = Pin<Box<dyn Future<Output = Result<Decided, DecisionError>> + Send>>;

impl Decision {
    /// The decision, once it is made.
    pub async fn made(self) -> Result<Decided, DecisionError> {
        match self {
            Decision::Ready(decided) => decided,
            Decision::Waiting(waiting) => waiting.await,
        }
    }
}

/// What the last configuration load did.
#[derive(Clone, Debug)]
pub struct LoadResult {
    /// Unix seconds.
    pub at: u64,
    /// The domains loaded, or the error that kept the previous rules.
    pub outcome: Result<Vec<String>, String>,
}

/// The gRPC method whose statistics the decider keeps, as envoyproxy/ratelimit names it.
const METHOD: &str = "ShouldRateLimit";

/// The running decider: rules, counters, health and statistics.
#[derive(Debug)]
pub struct Decider {
    /// The rules and the engine.
    pub limiter: Limiter,
    /// The counter store.
    pub backend: Backend,
    /// Health components.
    pub health: Health,
    /// Header names when LIMIT_RESPONSE_HEADERS_ENABLED is on.
    pub headers: Option<HeaderFormat>,
    /// RESPONSE_DYNAMIC_METADATA.
    pub dynamic_metadata: bool,
    /// The result of the last configuration load.
    pub last_load: std::sync::Mutex<Option<LoadResult>>,
    /// The span exporter, when TRACING_ENABLED.
    pub traces: Option<Traces>,
    /// The answer while the store is unavailable, and the bound on work in flight.
    pub outage: Outage,
    response_time: Arc<Timer>,
    total_requests: Arc<Counter>,
    service_errors: Arc<Counter>,
}

/// When a call began, and how it is counted.
struct Started {
    at: SystemTime,
    transport: Transport,
}

impl Decider {
    /// A decider around `limiter` and `backend`.
    pub fn new(
        limiter: Limiter,
        backend: Backend,
        health: Health,
        headers: Option<HeaderFormat>,
        dynamic_metadata: bool,
        traces: Option<Traces>,
        outage: Outage,
    ) -> Decider {
        let stats = limiter.stats();
        Decider {
            total_requests: stats.counter(&names::total_requests(METHOD)),
            service_errors: stats.counter(names::SERVICE_ERROR),
            response_time: stats.timer(&names::response_time(METHOD)),
            limiter,
            backend,
            health,
            headers,
            dynamic_metadata,
            last_load: std::sync::Mutex::new(None),
            traces,
            outage,
        }
    }

    /// A span for `request`, child of the trace `headers` carry, when tracing.
    pub fn span(
        &self,
        transport: Transport,
        headers: &HeaderMap,
        request: &Result<Request, InvalidRequest>,
    ) -> Option<RequestSpan> {
        let traces = self.traces.as_ref()?;
        let request = request.as_ref().ok()?;
        Some(traces.request(transport.span_name(), headers, request))
    }

    /// Decides `call`: on the memory store or write-behind counters at once, on a remote
    /// store within its place among the calls in flight (MAX_INFLIGHT_REQUESTS), by the
    /// failure mode when the store fails. Counted, timed and traced here, for every transport.
    pub fn decide(self: &Arc<Self>, call: Call) -> Decision {
        let started = self.begin(call.transport);
        let Call {
            request,
            deadline,
            span,
            ..
        } = call;
        let now_ms = unix_ms(started.at);
        let decided = match &self.backend {
            Backend::Memory(store) => self.decide_now(store, request, now_ms, span.as_ref()),
            Backend::WriteBehind(behind) => self.decide_behind(behind, request, now_ms),
            Backend::Remote(_) => {
                let decider = Arc::clone(self);
                return Decision::Waiting(Box::pin(async move {
                    let decided = decider.decide_later(request, deadline, span.as_ref()).await;
                    decider.finish(started, span, &decided);
                    decided
                }));
            }
        };
        self.finish(started, span, &decided);
        Decision::Ready(decided)
    }

    /// The decision of a call on the memory store.
    fn decide_now(
        &self,
        store: &MemoryStore,
        request: Result<Request, InvalidRequest>,
        now_ms: u64,
        span: Option<&RequestSpan>,
    ) -> Result<Decided, DecisionError> {
        let request = request?;
        let at = UnixMillis(now_ms);
        let response = match span {
            None => self.limiter.should_rate_limit(&request, store, at),
            Some(span) => {
                let round_trip = traces::backend(Some(span), self.backend.name(), None);
                let response = self.limiter.should_rate_limit(&request, store, at);
                round_trip.end(&response);
                response
            }
        };
        Ok(Decided {
            response: response?,
            request,
        })
    }

    /// The decision of a call from write-behind counters: the plan a remote store would
    /// run, counted here at once.
    fn decide_behind(
        &self,
        behind: &WriteBehind,
        request: Result<Request, InvalidRequest>,
        now_ms: u64,
    ) -> Result<Decided, DecisionError> {
        let request = request?;
        let at = UnixMillis(now_ms).reusing(buffers::plan_buffers());
        let mut plan = self.limiter.plan(&request, at)?;
        if plan.needs_current_counts() {
            plan.apply_current(&behind.current(plan.increments()));
        }
        let totals = behind.apply(plan.increments());
        let (response, buffers) = plan.decide_keeping_buffers(&totals);
        buffers::recycle_plan_buffers(buffers);
        Ok(Decided { request, response })
    }

    /// The decision of a call on the remote store, in its place among those in flight.
    async fn decide_later(
        &self,
        request: Result<Request, InvalidRequest>,
        deadline: Option<Duration>,
        span: Option<&RequestSpan>,
    ) -> Result<Decided, DecisionError> {
        let Backend::Remote(remote) = &self.backend else {
            unreachable!("a call waits only for a remote store");
        };
        let _in_flight = self.outage.enter()?;
        let request = request?;
        let response = self.decide_remote(remote, &request, span, deadline).await?;
        Ok(Decided { request, response })
    }

    /// The decision of `request` on the remote store: its plan run there, or the
    /// failure mode's answer when the store fails.
    async fn decide_remote(
        &self,
        remote: &Remote,
        request: &Request,
        span: Option<&RequestSpan>,
        deadline: Option<Duration>,
    ) -> Result<Response, DecisionError> {
        let now_ms = unix_now_ms();
        let mut plan =
            (self.limiter).plan(request, UnixMillis(now_ms).reusing(buffers::plan_buffers()))?;
        let counters = Some(plan.increments().len());
        let round_trip = traces::backend(span, self.backend.name(), counters);
        let counts = remote.run(&mut plan, deadline).await;
        round_trip.end(&counts);
        match counts {
            Ok(counts) => {
                self.outage.recovered();
                let (response, buffers) = plan.decide_keeping_buffers(&counts);
                buffers::recycle_plan_buffers(buffers);
                Ok(response)
            }
            Err(error @ BackendError::Key(_)) => Err(error.into()),
            Err(error) => Ok(self.outage.answer(&self.limiter, request, now_ms, error)?),
        }
    }

    /// Counts a gRPC call, and notes when it began.
    fn begin(&self, transport: Transport) -> Started {
        if transport == Transport::Grpc {
            self.total_requests.add(1);
        }
        let at = SystemTime::now();
        Started { at, transport }
    }

    /// Counts a request the caller got wrong (as upstream's `service_error` counts),
    /// times a gRPC call (a wall clock stepped back during it records zero), and ends its
    /// span.
    fn finish(
        &self,
        started: Started,
        span: Option<RequestSpan>,
        decided: &Result<Decided, DecisionError>,
    ) {
        if matches!(
            decided,
            Err(DecisionError::Invalid(_) | DecisionError::Request(_))
        ) {
            self.service_errors.add(1);
        }
        if started.transport == Transport::Grpc {
            let elapsed = SystemTime::now().duration_since(started.at);
            self.response_time.record(elapsed.unwrap_or_default());
        }
        if let Some(span) = span {
            span.finish(decided.as_ref().map(|decided| &decided.response));
        }
    }

    /// Runs `plan`'s counters as a decision's plan is run: on a remote store within its
    /// deadline, through its breakers and counted in its error statistic (the Rate Limit
    /// Quota Service's reservations). The totals, in plan order.
    pub async fn run_counters(&self, plan: &mut Plan) -> Result<Totals, BackendError> {
        let remote = match &self.backend {
            Backend::Memory(store) => {
                return Ok(plan.increments().iter().map(|i| store.apply(i)).collect());
            }
            Backend::WriteBehind(behind) => return Ok(behind.apply(plan.increments())),
            Backend::Remote(remote) => remote,
        };
        let totals = remote.run(plan, None).await?;
        self.outage.recovered();
        Ok(totals)
    }

    /// The Envoy response of `decided`, as a message (for `/json`).
    pub fn answer(&self, decided: &Decided) -> RateLimitResponse {
        let Decided { request, response } = decided;
        let mut answer = response_to_pb(response, self.headers.as_ref());
        if self.dynamic_metadata {
            answer.dynamic_metadata = Some(dynamic_metadata(request, response));
        }
        answer
    }

    /// Appends the Envoy response of `decided`, encoded: the bytes of
    /// [`Decider::answer`]'s message, without building it.
    pub fn encode(&self, decided: &Decided, buf: &mut BytesMut) {
        let Decided { request, response } = decided;
        encode_response(response, self.headers.as_ref(), buf);
        if self.dynamic_metadata {
            // Field 6, after the fields the response has (1 to 3; 4 and 5 are never set).
            prost::encoding::message::encode(6, &dynamic_metadata(request, response), buf);
        }
    }

    /// Why `request` would get its answer, the counters' current values, and that
    /// answer, without counting anything.
    pub async fn explain(
        &self,
        request: RateLimitRequest,
    ) -> Result<(Explanation, Vec<u64>, Response), DecisionError> {
        let request = request_from_pb(request)?;
        let explanation = self.limiter.explain(&request, UnixMillis(unix_now_ms()))?;
        let current = match &self.backend {
            Backend::Memory(store) => explanation
                .increments()
                .iter()
                .map(|increment| store.current(increment))
                .collect(),
            Backend::Remote(remote) => remote.current(explanation.increments()).await?.into_vec(),
            Backend::WriteBehind(behind) => behind.current(explanation.increments()).into_vec(),
        };
        let answer = explanation.answer(&current);
        Ok((explanation, current, answer))
    }
}
