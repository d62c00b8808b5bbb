//! Statistics, kept as the sidecar keeps its own (ratelimit-core's registry) and served
//! as Prometheus text on `GET /metrics` through the sidecar's renderer, with the mapping
//! in `mapping.yaml`. Every name is fixed or from a short fixed list: nothing here is
//! keyed by request data.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::stats::{Counter, Gauge, StatsRegistry, Timer};
use ratelimit_service_kit::prometheus::mapper::Mapper;
use ratelimit_service_kit::prometheus::render;

use crate::names;
use warp::http::StatusCode;

/// The statuses the service answers with; any other is counted as `other`.
const STATUSES: [u16; 13] = [
    202, 400, 401, 403, 404, 405, 409, 413, 415, 429, 500, 503, 0,
];

/// The intake's statistics.
pub struct Metrics {
    registry: Arc<StatsRegistry>,
    mapper: Mapper,
    requests: Vec<(u16, Arc<Counter>)>,
    /// Operations in acknowledged batches.
    pub operations_produced: Arc<Counter>,
    /// Acknowledged batches.
    pub batches_produced: Arc<Counter>,
    /// From handing a batch to the producer to the broker's answer.
    pub produce_latency: Arc<Timer>,
    /// Answers sent again for an `Idempotency-Key`.
    pub idempotent_replays: Arc<Counter>,
    /// Batches refused by a rate limit (429).
    pub limit_refusals: Arc<Counter>,
}

impl Metrics {
    /// A registry with every statistic at zero.
    pub fn new() -> Metrics {
        let registry = Arc::new(StatsRegistry::new(0));
        let requests = STATUSES
            .iter()
            .map(|&status| (status, registry.counter(&names::requests(status))))
            .collect();
        Metrics {
            operations_produced: registry.counter(names::OPERATIONS_PRODUCED),
            batches_produced: registry.counter(names::BATCHES_PRODUCED),
            produce_latency: registry.timer(names::PRODUCE_LATENCY),
            idempotent_replays: registry.counter(names::IDEMPOTENT_REPLAYS),
            limit_refusals: registry.counter(names::LIMIT_REFUSALS),
            requests,
            mapper: Mapper::parse(include_str!("mapping.yaml")).expect("the mapping parses"),
            registry,
        }
    }

    /// The load counters of a followed file: `intake.<file>.load_success` and `_error`.
    pub fn loads(&self, file: &str) -> (Arc<Counter>, Arc<Counter>) {
        (
            self.registry.counter(&names::load(file, true)),
            self.registry.counter(&names::load(file, false)),
        )
    }

    /// Registers `intake.kafka_up`, 1 while the broker is known to be up.
    pub fn kafka_up(&self, read: Gauge) {
        self.registry.gauge(names::KAFKA_UP, read);
    }

    /// Counts an answer to `POST /operations`.
    pub fn answered(&self, status: StatusCode) {
        let code = status.as_u16();
        let found = self.requests.iter().find(|(s, _)| *s == code);
        let counter = found.or_else(|| self.requests.last());
        if let Some((_, counter)) = counter {
            counter.add(1);
        }
    }

    /// Records one produce call that took `elapsed`.
    pub fn produced(&self, elapsed: Duration, operations: u64) {
        self.produce_latency.record(elapsed);
        self.batches_produced.add(1);
        self.operations_produced.add(operations);
    }

    /// The Prometheus text: these statistics, then `limiter`'s (per rule), if any.
    pub fn render(&self, limiter: Option<&Arc<StatsRegistry>>) -> String {
        let mut text = render(&self.registry.snapshot(), &self.mapper, &[]);
        if let Some(limiter) = limiter {
            let rules = Mapper::default_mapping(false);
            text.push_str(&render(&limiter.snapshot(), &rules, &[]));
        }
        text
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_produce_and_reloads_render_under_their_prometheus_names() {
        let metrics = Metrics::new();
        metrics.answered(StatusCode::ACCEPTED);
        metrics.answered(StatusCode::ACCEPTED);
        metrics.answered(StatusCode::UNAUTHORIZED);
        metrics.answered(StatusCode::IM_A_TEAPOT);
        metrics.produced(Duration::from_millis(3), 10);
        metrics.loads("api_keys").1.add(1);
        metrics.kafka_up(Arc::new(|| 1));
        let text = metrics.render(None);
        for line in [
            "intake_requests_total{status=\"202\"} 2",
            "intake_requests_total{status=\"401\"} 1",
            "intake_requests_total{status=\"other\"} 1",
            "intake_operations_produced_total 10",
            "intake_batches_produced_total 1",
            "intake_produce_latency_seconds_count 1",
            "intake_reloads_total{file=\"api_keys\",outcome=\"rejected\"} 1",
            "intake_kafka_up 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}
