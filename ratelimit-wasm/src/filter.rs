//! The filter inside Envoy: descriptors from the request, a local decision with the
//! core over counters in Envoy's shared data, a local 429 when over.

use ratelimit_core::UnixMillis;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use prost::Message;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType, Status};
use ratelimit_core::stats::{Deltas, Name, Value};
use ratelimit_core::{Code, Descriptor, Request};
use ratelimit_proto as proto;

use crate::actions;
use crate::config::{FilterConfig, Global};
use crate::fleet::{Pending, admits, fleet_key, known_from};
use crate::metrics::metric_name;
use crate::slots::{SharedData, SlotCounters, Unreadable};

/// How often each worker exports its statistics as metrics.
const METRICS_PERIOD: Duration = Duration::from_secs(1);

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

#[derive(Default)]
struct Root {
    config: Option<Rc<FilterConfig>>,
    /// Metric id per statistic.
    metric_ids: HashMap<Name, u32>,
    /// What was exported so far.
    exported: Deltas,
    /// This worker's hits not yet reported to the global tier (reporting mode).
    pending: Rc<RefCell<Pending>>,
    /// Reports in flight: the descriptor's shared-data name, the descriptor, its hits.
    reports: HashMap<u32, (String, Descriptor, u64)>,
    /// Ticks since the metrics were last exported.
    ticks: u64,
}

impl Context for Root {
    /// A report's answer: the fleet's count for its descriptor, kept in shared data for
    /// every worker until the window ends. A report that failed is sent again.
    fn on_grpc_call_response(&mut self, token: u32, status_code: u32, response_size: usize) {
        let Some((key, descriptor, sent)) = self.reports.remove(&token) else {
            return;
        };
        let response = (status_code == 0)
            .then(|| self.get_grpc_call_response_body(0, response_size))
            .flatten()
            .and_then(|body| proto::RateLimitResponse::decode(body.as_slice()).ok());
        let Some(response) = response else {
            self.pending.borrow_mut().add(&key, &descriptor, sent);
            return;
        };
        let (Some(config), Some((known, seconds))) = (&self.config, known_from(&response)) else {
            return;
        };
        let now = unix_ms(self) / 1_000;
        let counters = SlotCounters::new(EnvoySharedData, config.shared_slots);
        counters.put_known(&key, known, now + seconds, now);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let parsed = match self.get_plugin_configuration() {
            Some(bytes) => FilterConfig::parse(&bytes),
            None => Err("plugin configuration: missing".to_owned()),
        };
        match parsed {
            Ok(config) => {
                self.set_tick_period(tick_period(&config));
                self.config = Some(Rc::new(config));
                true
            }
            Err(error) => {
                let _ = hostcalls::log(LogLevel::Error, &format!("ratelimit-wasm: {error}"));
                false
            }
        }
    }

    /// Reports this worker's hits to the global tier (reporting mode), and exports what it
    /// counted as proxy-wasm counters, which Envoy sums over the workers, once a second.
    fn on_tick(&mut self) {
        let Some(config) = self.config.clone() else {
            return;
        };
        let period = tick_period(&config);
        if let Some(global) = &config.global {
            self.report(global);
        }
        self.ticks += 1;
        if u128::from(self.ticks) * period.as_millis() < METRICS_PERIOD.as_millis() {
            return;
        }
        self.ticks = 0;
        for sample in config.limiter.stats().snapshot().samples {
            let (Some(metric), Value::Counter(value)) = (metric_name(&sample.name), sample.value)
            else {
                continue;
            };
            let id = match self.metric_ids.get(&sample.name) {
                Some(&id) => id,
                None => match hostcalls::define_metric(MetricType::Counter, &metric) {
                    Ok(id) => *self.metric_ids.entry(sample.name.clone()).or_insert(id),
                    Err(_) => continue,
                },
            };
            let delta = self.exported.counter(&sample.name, value);
            if delta > 0 {
                let _ = hostcalls::increment_metric(id, i64::try_from(delta).unwrap_or(i64::MAX));
            }
        }
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        let config = Rc::clone(self.config.as_ref()?);
        Some(Box::new(Filter {
            config,
            headers: Vec::new(),
            pending: Rc::clone(&self.pending),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

impl Root {
    /// Sends each descriptor's pending hits in one `ShouldRateLimit` with `hits_addend`
    /// (reporting mode; nothing in callout mode, where nothing is pending).
    fn report(&mut self, global: &Global) {
        let taken = self.pending.borrow_mut().take();
        for (key, descriptor, hits) in taken {
            let report = [descriptor.clone().with_hits(hits)];
            match call_service(self, global, &report) {
                Ok(token) => {
                    self.reports.insert(token, (key, descriptor, hits));
                }
                Err(_) => {
                    self.pending.borrow_mut().add(&key, &descriptor, hits);
                }
            }
        }
    }
}

/// Sends `descriptors` to the global tier's service (one `ShouldRateLimit`); the call's
/// token, whose answer comes to `context`'s `on_grpc_call_response`.
fn call_service(
    context: &dyn Context,
    global: &Global,
    descriptors: &[Descriptor],
) -> Result<u32, Status> {
    let request = Request::new(global.domain.clone(), descriptors.to_vec());
    let message = proto::client::request_to_pb(&request).encode_to_vec();
    context.dispatch_grpc_call(
        &global.cluster,
        proto::SERVICE,
        proto::METHOD,
        vec![],
        Some(&message),
        Duration::from_millis(global.timeout_ms),
    )
}

/// The tick period `config` asks for: the report interval, at most the metrics period.
fn tick_period(config: &FilterConfig) -> Duration {
    let report = config.global.as_ref().and_then(|g| g.report_interval_ms);
    report
        .map_or(METRICS_PERIOD, Duration::from_millis)
        .min(METRICS_PERIOD)
}

/// The host's clock, in unix milliseconds.
fn unix_ms(context: &dyn Context) -> u64 {
    context
        .get_current_time()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct Filter {
    config: Rc<FilterConfig>,
    /// The rate-limit headers for the response, in the configured format.
    headers: Vec<(String, String)>,
    /// This worker's hits not yet reported (reporting mode).
    pending: Rc<RefCell<Pending>>,
}

impl Filter {
    /// Asks the sidecar tier about descriptors that passed locally; the request waits
    /// for [`Context::on_grpc_call_response`].
    fn ask_global(&mut self, global: &Global, descriptors: &[Descriptor]) -> Action {
        match call_service(self, global, descriptors) {
            Ok(_) => Action::Pause,
            Err(_) => self.global_failed(),
        }
    }

    /// Decides descriptors that passed locally from what the global tier last reported
    /// and this worker's unreported hits (reporting mode); a request with more new
    /// descriptors than the worker can hold asks with a callout.
    fn decide_from_reports(
        &mut self,
        global: &Global,
        descriptors: &[Descriptor],
        now_ms: u64,
    ) -> Action {
        let counters = SlotCounters::new(EnvoySharedData, self.config.shared_slots);
        let keys: Vec<String> = descriptors
            .iter()
            .map(|d| fleet_key(&global.domain, d))
            .collect();
        let now = now_ms / 1_000;
        let over = descriptors.iter().zip(&keys).any(|(d, key)| {
            let pending = self.pending.borrow().get(key);
            !admits(
                counters.known(key, now),
                pending,
                d.hits_addend.unwrap_or(1),
            )
        });
        if over {
            let headers = [("x-envoy-ratelimited", "true")];
            self.send_http_response(429, headers.to_vec(), Some(b"Too Many Requests\n"));
            return Action::Pause;
        }
        if !self.pending.borrow().fits(&keys) {
            return self.ask_global(global, descriptors);
        }
        let mut pending = self.pending.borrow_mut();
        for (d, key) in descriptors.iter().zip(&keys) {
            pending.add(key, d, d.hits_addend.unwrap_or(1));
        }
        Action::Continue
    }

    /// The sidecar could not answer: deny with 500, or let the request through.
    fn global_failed(&mut self) -> Action {
        if self.config.failure_mode_deny {
            self.send_http_response(500, vec![], Some(b"rate limit service unavailable\n"));
            Action::Pause
        } else {
            self.resume_http_request();
            Action::Continue
        }
    }
}

impl Context for Filter {
    fn on_grpc_call_response(&mut self, _: u32, status_code: u32, response_size: usize) {
        let response = (status_code == 0)
            .then(|| self.get_grpc_call_response_body(0, response_size))
            .flatten()
            .and_then(|body| proto::RateLimitResponse::decode(body.as_slice()).ok());
        match response {
            Some(r) if proto::client::code_from_pb(r.overall_code) == Code::OverLimit => {
                let mut headers = vec![("x-envoy-ratelimited".to_owned(), "true".to_owned())];
                headers.extend(
                    r.response_headers_to_add
                        .into_iter()
                        .map(|h| (h.key, h.value)),
                );
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                self.send_http_response(429, headers, Some(b"Too Many Requests\n"));
            }
            Some(_) => self.resume_http_request(),
            None => {
                self.global_failed();
            }
        }
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let peer = self
            .get_property(vec!["source", "address"])
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map(|address| {
                address
                    .rsplit_once(':')
                    .map_or(address.clone(), |(ip, _)| ip.to_owned())
            });
        let descriptors = actions::build(
            &self.config.descriptors,
            |name| self.get_http_request_header(name),
            peer.as_deref(),
        );
        if descriptors.is_empty() {
            return Action::Continue;
        }
        let now_ms = unix_ms(self);
        let request = Request::new(self.config.domain.clone(), descriptors);
        let config = Rc::clone(&self.config);
        let counters = SlotCounters::new(EnvoySharedData, config.shared_slots);
        match config
            .limiter
            .should_rate_limit(&request, &counters, UnixMillis(now_ms))
        {
            Ok(response) if response.overall_code == Code::OverLimit => {
                let mut headers = vec![("x-envoy-ratelimited".to_owned(), "true".to_owned())];
                headers.extend(response.header_pairs(&config.headers_format));
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                self.send_http_response(429, headers, Some(b"Too Many Requests\n"));
                Action::Pause
            }
            Ok(response) => {
                if config.response_headers {
                    self.headers = response.header_pairs(&config.headers_format);
                }
                match &config.global {
                    Some(global) if global.report_interval_ms.is_some() => {
                        self.decide_from_reports(global, &request.descriptors, now_ms)
                    }
                    Some(global) => self.ask_global(global, &request.descriptors),
                    None => Action::Continue,
                }
            }
            Err(error) if config.failure_mode_deny => {
                let message = format!("rate limit check failed: {error}\n");
                self.send_http_response(500, vec![], Some(message.as_bytes()));
                Action::Pause
            }
            Err(_) => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        for (name, value) in std::mem::take(&mut self.headers) {
            self.add_http_response_header(&name, &value);
        }
        Action::Continue
    }
}

/// Envoy's shared data, common to every worker thread of the VM.
struct EnvoySharedData;

impl SharedData for EnvoySharedData {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Unreadable> {
        hostcalls::get_shared_data(key).map_err(|_| Unreadable)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        !matches!(
            hostcalls::set_shared_data(key, Some(value), cas),
            Err(Status::CasMismatch)
        )
    }
}
