//! Every statistic name of the intake's own `intake_*` series, built here and nowhere
//! else (the rate-limit statistics of its rules are named by the core's
//! `ratelimit_core::stats::names`). `mapping.yaml` gives them their Prometheus names.

/// Operations produced to the topic.
pub const OPERATIONS_PRODUCED: &str = "intake.operations_produced";
/// Batches produced to the topic.
pub const BATCHES_PRODUCED: &str = "intake.batches_produced";
/// How long the broker took to acknowledge a batch.
pub const PRODUCE_LATENCY: &str = "intake.produce_latency";
/// Answers sent again for an `Idempotency-Key`.
pub const IDEMPOTENT_REPLAYS: &str = "intake.idempotent_replays";
/// Batches refused by a rate limit (429).
pub const LIMIT_REFUSALS: &str = "intake.limit_refusals";
/// 1 while the broker is known to be up.
pub const KAFKA_UP: &str = "intake.kafka_up";

/// `intake.requests.<status>`: answers to `POST /operations` with `status`; 0 is
/// `intake.requests.other`, every status not counted on its own.
pub fn requests(status: u16) -> String {
    match status {
        0 => "intake.requests.other".to_owned(),
        _ => format!("intake.requests.{status}"),
    }
}

/// `intake.<file>.load_success` or `intake.<file>.load_error`: loads of a followed file.
pub fn load(file: &str, success: bool) -> String {
    let outcome = if success {
        "load_success"
    } else {
        "load_error"
    };
    format!("intake.{file}.{outcome}")
}
