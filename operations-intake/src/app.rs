//! What every request of the service is served with.

use std::sync::Arc;

use ratelimit_core::HeaderFormat;

use crate::auth::Auth;
use crate::batch;
use crate::files::Followed;
use crate::idempotency;
use crate::kafka::Kafka;
use crate::limits::Limits;
use crate::metrics::Metrics;

/// Everything a request needs.
pub struct App {
    /// Who may send.
    pub auth: Arc<Auth>,
    /// Rate limits.
    pub limits: Arc<Limits>,
    /// LIMIT_RESPONSE_HEADERS_FORMAT.
    pub headers_format: HeaderFormat,
    /// The producer.
    pub kafka: Arc<Kafka>,
    /// Remembered answers for `Idempotency-Key`.
    pub idempotency: idempotency::Store,
    /// `MAX_BODY_BYTES`.
    pub max_body_bytes: usize,
    /// `MAX_OPERATIONS`.
    pub max_operations: usize,
    /// The domain checks: `MAX_UNIT_COST_DECIMALS` and `REJECT_OVERSELL`.
    pub rules: batch::Rules,
    /// Statistics.
    pub metrics: Metrics,
    /// The followed files, by the name `/health` gives them.
    pub files: Vec<(&'static str, Arc<Followed>)>,
}
