//! The operations intake service: clients POST batches of buy/sell operations; each batch
//! is validated, checked against rate limits decided by ratelimit-core, and produced to a
//! Kafka topic as one message, answered only once the broker acknowledged it.
//!
//! Money is involved, so a batch is never changed on the way (the message value is the
//! request body, byte for byte; numbers are never read as floats), never lost (the
//! answer waits for `acks=all`) and never recorded twice by a retry (`Idempotency-Key`).

pub mod answer;
#[cfg(feature = "kafka")]
pub mod app;
pub mod auth;
pub mod batch;
pub mod files;
#[cfg(feature = "kafka")]
pub mod health;
pub mod idempotency;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod limits;
pub mod metrics;
pub mod names;
pub mod problem;
pub mod request;
#[cfg(feature = "kafka")]
pub mod routes;
#[cfg(feature = "kafka")]
pub mod run;
pub mod settings;
