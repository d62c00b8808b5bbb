//! The decision service shared by the gRPC and HTTP front ends, with what it does when
//! its backend is away ([`outage`]), the dynamic metadata of its answers
//! ([`metadata`]) and the room each worker keeps for the next decision ([`spare`]).

pub mod metadata;
pub mod outage;
pub(crate) mod spare;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ratelimit_service_kit::clock::{unix_ms, unix_now_ms};

use bytes::BytesMut;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http::{HeaderMap, HeaderName, HeaderValue};
use ratelimit_core::stats::{Counter, Timer, names};
use ratelimit_core::{
    Explanation, HeaderFormat, Limiter, MemoryStore, Plan, Request, RequestError, Response,
};
use ratelimit_proto::envoy::{InvalidRequest, request_from_pb, response_to_pb};
use ratelimit_proto::wire::encode_response;

use crate::backend::{Backend, BackendError, Remote, Totals};
use crate::observe::health::Health;
use crate::observe::traces::{self, RequestSpan, Traces};
use crate::service::metadata::dynamic_metadata;
use crate::service::outage::{Outage, Overloaded, Place};

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
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

/// A request in the core's form and its decision, which [`Service::encode`] encodes.
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

/// What the last configuration load did.
#[derive(Clone, Debug)]
pub struct LoadResult {
    /// Unix seconds.
    pub at: u64,
    /// The domains loaded, or the error that kept the previous rules.
    pub outcome: Result<Vec<String>, String>,
}

/// The gRPC method whose statistics the service keeps, as envoyproxy/ratelimit names it.
const METHOD: &str = "ShouldRateLimit";

/// The span of a gRPC decision, named as OpenTelemetry names RPC spans.
const GRPC_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The span of a `/json` decision.
const JSON_SPAN: &str = "POST /json";

/// The running service: rules, counters, health and statistics.
#[derive(Debug)]
pub struct Service {
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

impl Service {
    /// A service around `limiter` and `backend`.
    pub fn new(
        limiter: Limiter,
        backend: Backend,
        health: Health,
        headers: Option<HeaderFormat>,
        dynamic_metadata: bool,
        traces: Option<Traces>,
        outage: Outage,
    ) -> Service {
        let stats = limiter.stats();
        Service {
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

    /// Decides one request from gRPC, counted in `ratelimit_server.ShouldRateLimit.*`
    /// as upstream's gRPC interceptor counts every call.
    pub async fn should_rate_limit_grpc(
        &self,
        request: RateLimitRequest,
        headers: &HeaderMap,
    ) -> Result<RateLimitResponse, ServiceError> {
        self.counted_call(self.traced(GRPC_SPAN, request, headers))
            .await
    }

    /// A gRPC call's `decision`, counted in `ratelimit_server.ShouldRateLimit.*`: one
    /// more call, and its response time.
    async fn counted_call(
        &self,
        decision: impl Future<Output = Result<RateLimitResponse, ServiceError>>,
    ) -> Result<RateLimitResponse, ServiceError> {
        let started = std::time::Instant::now();
        self.total_requests.add(1);
        let result = decision.await;
        self.response_time.record(started.elapsed());
        result
    }

    /// Runs `plan`'s counters as a decision's plan is run: on a remote store within its
    /// deadline, through its breakers and counted in its error statistic (the Rate Limit
    /// Quota Service's reservations). The totals, in plan order.
    pub async fn run_counters(&self, plan: &mut Plan) -> Result<Totals, BackendError> {
        let remote = match &self.backend {
            Backend::Memory(store) => {
                return Ok(plan.increments().iter().map(|i| store.apply(i)).collect());
            }
            Backend::Remote(remote) => remote,
        };
        let totals = remote.run(plan, None).await?;
        self.outage.recovered();
        Ok(totals)
    }

    /// Whether a decision waits for nothing (the memory store, without tracing): then
    /// [`Service::should_rate_limit_grpc_now`] answers without a future.
    pub fn decides_now(&self) -> bool {
        matches!(self.backend, Backend::Memory(_)) && self.traces.is_none()
    }

    /// [`Service::should_rate_limit_grpc`] without a future, counted the same way, on the
    /// memory store (on another, `Unavailable`: see [`Service::decides_now`]). It never
    /// waits, so it takes no place among the requests in flight (MAX_INFLIGHT_REQUESTS
    /// bounds the ones that wait). The request comes decoded into the core's form (or
    /// the reason it cannot be).
    pub fn should_rate_limit_grpc_now(
        &self,
        request: Result<Request, InvalidRequest>,
    ) -> Result<Decided, ServiceError> {
        // One clock for the decision and the response time: two reads instead of three
        // (a wall clock stepped back during the request records zero).
        let started = SystemTime::now();
        self.total_requests.add(1);
        let result = request.map_err(ServiceError::from).and_then(|request| {
            let Backend::Memory(store) = &self.backend else {
                let error = "only the memory store decides without waiting";
                return Err(BackendError::Unavailable(error.into()).into());
            };
            let response = self.decide_core(store, &request, unix_ms(started))?;
            Ok(Decided { request, response })
        });
        self.count_error(&result);
        let elapsed = SystemTime::now().duration_since(started);
        self.response_time.record(elapsed.unwrap_or_default());
        result
    }

    /// Whether a gRPC request may come decoded into the core's form (nothing needs
    /// envoy-types' request: it is not traced): then
    /// [`Service::should_rate_limit_grpc_decoded`] decides it.
    pub fn decodes_to_core(&self) -> bool {
        self.traces.is_none()
    }

    /// [`Service::should_rate_limit_grpc`] of a request decoded into the core's form
    /// (or the reason it cannot be), untraced, counted the same way.
    pub async fn should_rate_limit_grpc_decoded(
        &self,
        request: Result<Request, InvalidRequest>,
        headers: &HeaderMap,
    ) -> Result<Decided, ServiceError> {
        // Written out in one function rather than through `counted_call` and a helper: a
        // future awaited in another is copied into it, and this one holds the store's call.
        let started = std::time::Instant::now();
        self.total_requests.add(1);
        let result = match self.admit(request) {
            Err(error) => Err(error),
            // In its place among the requests in flight until decided.
            Ok((_place, request)) => match &self.backend {
                Backend::Memory(store) => self.decide_core(store, &request, unix_now_ms()),
                Backend::Remote(remote) => {
                    let caller_deadline = grpc_timeout(headers).ok().flatten();
                    self.decide_remote(remote, &request, None, caller_deadline)
                        .await
                }
            }
            .map(|response| Decided { request, response }),
        };
        self.count_error(&result);
        self.response_time.record(started.elapsed());
        result
    }

    /// A place among the requests in flight for `request` (refused first when there is
    /// none), and the request.
    fn admit(
        &self,
        request: Result<Request, InvalidRequest>,
    ) -> Result<(Place<'_>, Request), ServiceError> {
        let place = self.outage.enter()?;
        Ok((place, request?))
    }

    /// Decides one request from `/json`, not counted as a gRPC call (as upstream's
    /// handler does).
    pub async fn should_rate_limit_json(
        &self,
        request: RateLimitRequest,
        headers: &HeaderMap,
    ) -> Result<RateLimitResponse, ServiceError> {
        self.traced(JSON_SPAN, request, headers).await
    }

    /// Decides one request, in a span named `span` when tracing, child of the trace
    /// `headers` carry.
    async fn traced(
        &self,
        span: &'static str,
        request: RateLimitRequest,
        headers: &HeaderMap,
    ) -> Result<RateLimitResponse, ServiceError> {
        let _place = self.outage.enter()?;
        let span = self
            .traces
            .as_ref()
            .map(|traces| traces.request(span, headers, &request));
        let result = self
            .decide(request, span.as_ref(), grpc_timeout(headers).ok().flatten())
            .await;
        self.count_error(&result);
        if let Some(span) = span {
            span.finish(&result);
        }
        result
    }

    async fn decide(
        &self,
        request: RateLimitRequest,
        span: Option<&RequestSpan>,
        caller_deadline: Option<Duration>,
    ) -> Result<RateLimitResponse, ServiceError> {
        let backend = self.backend.name();
        let remote = match &self.backend {
            Backend::Memory(store) => {
                let round_trip = traces::backend(span, backend, None);
                let result = self.decide_in_process(store, request, unix_now_ms());
                round_trip.end(&result);
                return result;
            }
            Backend::Remote(remote) => remote,
        };
        let request = request_from_pb(request)?;
        let response = self
            .decide_remote(remote, &request, span, caller_deadline)
            .await?;
        Ok(self.answer(&request, &response))
    }

    /// The decision of `request` on the remote store: its plan run there, or the
    /// failure mode's answer when the store fails.
    async fn decide_remote(
        &self,
        remote: &Remote,
        request: &Request,
        span: Option<&RequestSpan>,
        caller_deadline: Option<Duration>,
    ) -> Result<Response, ServiceError> {
        let now_ms = unix_now_ms();
        let room = spare::plan_room();
        let mut plan = self.limiter.plan_millis_in(request, now_ms, room)?;
        let counters = Some(plan.increments().len());
        let round_trip = traces::backend(span, self.backend.name(), counters);
        let counts = remote.run(&mut plan, caller_deadline).await;
        round_trip.end(&counts);
        let response = match counts {
            Ok(counts) => {
                self.outage.recovered();
                let (response, room) = plan.decide_keeping_room(&counts);
                spare::keep_plan_room(room);
                response
            }
            Err(error @ BackendError::Key(_)) => return Err(error.into()),
            Err(error) => self.outage.answer(&self.limiter, request, now_ms, error)?,
        };
        Ok(response)
    }

    /// The decision against the memory store, which waits for nothing.
    fn decide_in_process(
        &self,
        store: &MemoryStore,
        request: RateLimitRequest,
        now_ms: u64,
    ) -> Result<RateLimitResponse, ServiceError> {
        let request = request_from_pb(request)?;
        let response = self.decide_core(store, &request, now_ms)?;
        Ok(self.answer(&request, &response))
    }

    /// [`Service::decide_in_process`] of a request in the core's form.
    fn decide_core(
        &self,
        store: &MemoryStore,
        request: &Request,
        now_ms: u64,
    ) -> Result<Response, ServiceError> {
        Ok(self
            .limiter
            .should_rate_limit_millis(request, store, now_ms)?)
    }

    /// The Envoy response to `request` for `response`.
    fn answer(&self, request: &Request, response: &Response) -> RateLimitResponse {
        let mut answer = response_to_pb(response, self.headers.as_ref());
        if self.dynamic_metadata {
            answer.dynamic_metadata = Some(dynamic_metadata(request, response));
        }
        answer
    }

    /// Appends the Envoy response of `decided`, encoded: the bytes of
    /// [`Service::answer`]'s message, without building it.
    pub fn encode(&self, decided: &Decided, buf: &mut BytesMut) {
        let Decided { request, response } = decided;
        encode_response(response, self.headers.as_ref(), buf);
        if self.dynamic_metadata {
            // Field 6, after the fields the response has (1 to 3; 4 and 5 are never set).
            prost::encoding::message::encode(6, &dynamic_metadata(request, response), buf);
        }
    }

    /// Counts a request the caller got wrong, as upstream's `service_error` counts.
    fn count_error<T>(&self, result: &Result<T, ServiceError>) {
        if matches!(
            result,
            Err(ServiceError::Invalid(_) | ServiceError::Request(_))
        ) {
            self.service_errors.add(1);
        }
    }
}

impl Service {
    /// Why `request` would get its answer, the counters' current values, and that
    /// answer, without counting anything.
    pub async fn explain(
        &self,
        request: RateLimitRequest,
    ) -> Result<(Explanation, Vec<u64>, Response), ServiceError> {
        let request = request_from_pb(request)?;
        let explanation = self.limiter.explain_millis(&request, unix_now_ms())?;
        let current = match &self.backend {
            Backend::Memory(store) => explanation
                .increments()
                .iter()
                .map(|increment| store.current(increment))
                .collect(),
            Backend::Remote(remote) => remote.current(explanation.increments()).await?.into_vec(),
        };
        let answer = explanation.answer(&current);
        Ok((explanation, current, answer))
    }
}

/// The first value of the header `name`, as [`HeaderMap::get`] finds it. A call
/// carries a handful of headers: comparing a name with each of theirs first costs less
/// than hashing it to look it up, which is left for a header that is there.
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    if !headers.keys().any(|key| key == name) {
        return None;
    }
    headers.get(name)
}

/// The caller's deadline from gRPC's `grpc-timeout` header (`100m`, `2S`, ...), read as
/// grpc-go reads it: one to eight digits and a unit; anything else is malformed, with
/// grpc-go's words.
pub(crate) fn grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, String> {
    // A name made once: looking a `&str` up parses and classifies it on every call.
    static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
    let Some(value) = header(headers, &GRPC_TIMEOUT) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(value.as_bytes());
    let malformed = |why: String| Err(format!("malformed grpc-timeout: {why}"));
    if text.len() < 2 {
        return malformed(format!("transport: timeout string is too short: {text:?}"));
    }
    if text.len() > 9 {
        return malformed(format!("transport: timeout string is too long: {text:?}"));
    }
    let (digits, unit) = text.split_at(text.len() - 1);
    let unit: fn(u64) -> Duration = match unit {
        "H" => |n| Duration::from_secs(n * 3_600),
        "M" => |n| Duration::from_secs(n * 60),
        "S" => Duration::from_secs,
        "m" => Duration::from_millis,
        "u" => Duration::from_micros,
        "n" => Duration::from_nanos,
        _ => {
            return malformed(format!(
                "transport: timeout unit is not recognized: {text:?}"
            ));
        }
    };
    match digits.bytes().all(|b| b.is_ascii_digit()) {
        // At most eight digits: no unit overflows.
        true => Ok(Some(unit(digits.parse().unwrap_or(0)))),
        false => malformed(format!(
            "strconv.ParseUint: parsing {digits:?}: invalid syntax"
        )),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever the names, their order and repeats: the value `get` finds.
        #[test]
        fn a_header_is_the_value_get_finds(
            pairs in prop::collection::vec((0..6usize, "[a-z]{0,3}"), 0..12),
            wanted in 0..7usize,
        ) {
            const NAMES: [&str; 7] = [
                "grpc-timeout", "grpc-encoding", "content-type", "te", "x-request-id",
                "grpc-timeouts", "user-agent",
            ];
            let mut headers = HeaderMap::new();
            for (name, value) in &pairs {
                let name = HeaderName::from_static(NAMES[*name]);
                headers.append(name, HeaderValue::from_str(value).unwrap());
            }
            let name = HeaderName::from_static(NAMES[wanted]);
            prop_assert_eq!(header(&headers, &name), headers.get(&name));
        }
    }

    #[test]
    fn a_caller_deadline_reads_every_grpc_unit_and_refuses_what_grpc_go_refuses() {
        let deadline = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-other", HeaderValue::from_static("1S"));
            headers.insert("grpc-timeout", HeaderValue::from_static(value));
            grpc_timeout(&headers)
        };
        assert_eq!(deadline("2H"), Ok(Some(Duration::from_secs(7_200))));
        assert_eq!(deadline("3M"), Ok(Some(Duration::from_secs(180))));
        assert_eq!(deadline("4S"), Ok(Some(Duration::from_secs(4))));
        assert_eq!(deadline("250m"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(deadline("7u"), Ok(Some(Duration::from_micros(7))));
        assert_eq!(
            deadline("99999999n"),
            Ok(Some(Duration::from_nanos(99_999_999)))
        );
        assert_eq!(
            deadline("99999999H"),
            Ok(Some(Duration::from_secs(359_999_996_400)))
        );
        for (malformed, why) in [
            ("9x", "transport: timeout unit is not recognized: \"9x\""),
            ("S", "transport: timeout string is too short: \"S\""),
            (
                "123456789S",
                "transport: timeout string is too long: \"123456789S\"",
            ),
            ("-5S", "strconv.ParseUint: parsing \"-5\": invalid syntax"),
            ("1.5S", "strconv.ParseUint: parsing \"1.5\": invalid syntax"),
        ] {
            assert_eq!(
                deadline(malformed),
                Err(format!("malformed grpc-timeout: {why}"))
            );
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), Ok(None));
    }
}
