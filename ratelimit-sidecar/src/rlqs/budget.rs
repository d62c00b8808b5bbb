//! What the service's streams may hold in memory, in bytes: the buckets they hold (a
//! bucket id may be 64 KiB: 32 entries of up to 1 KiB keys and values), per stream and
//! per process; each answer's size (under the 4 MiB a gRPC client receives by default,
//! Envoy's Google gRPC client and C-core included); and the answers queued for a reader
//! that is slow to take them.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaResponse};
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// Bucket state one process holds, in bytes, over all its streams (the same id held by
/// two streams counts twice).
pub const MAX_PROCESS_BYTES: usize = 128 << 20;
/// Bucket state one stream holds, in bytes.
pub const MAX_STREAM_BYTES: usize = 16 << 20;
/// Buckets one process holds, over all its streams, and one stream holds.
pub const MAX_PROCESS_BUCKETS: usize = 100_000;
pub const MAX_STREAM_BUCKETS: usize = 10_000;
/// The largest answer: an answer with more actions is split into several.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Answers waiting for their reader: per stream, and bytes in the process.
pub const QUEUED_ANSWERS: usize = 4;
pub const MAX_QUEUED_BYTES: usize = 64 << 20;

/// What holding the bucket `id` costs: its text is held three times (the id sent back in
/// each action, the entries the rules match and the key the stream finds it by), and a
/// bucket's own state.
pub fn bucket_cost(id: &BucketId) -> usize {
    let text: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
    3 * text + 256
}

/// The bucket state of a process.
#[derive(Debug, Default)]
pub struct Budget {
    bytes: AtomicUsize,
    buckets: AtomicUsize,
}

impl Budget {
    /// Takes a bucket of `cost` bytes; `false` (and nothing taken) past either bound.
    pub fn take(&self, cost: usize) -> bool {
        let bytes = self.bytes.fetch_add(cost, Ordering::AcqRel);
        let buckets = self.buckets.fetch_add(1, Ordering::AcqRel);
        if bytes + cost > MAX_PROCESS_BYTES || buckets >= MAX_PROCESS_BUCKETS {
            self.give(cost);
            return false;
        }
        true
    }

    /// Gives back a bucket of `cost` bytes.
    pub fn give(&self, cost: usize) {
        self.bytes.fetch_sub(cost, Ordering::AcqRel);
        self.buckets.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `actions` in answers of at most [`MAX_ANSWER_BYTES`] each, in order.
pub fn answers(actions: Vec<BucketAction>) -> Vec<RateLimitQuotaResponse> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    let mut size = 0;
    for action in actions {
        // The field's tag and length prefix: at most 1 + 10 bytes.
        let len = action.encoded_len() + 11;
        if !current.is_empty() && size + len > MAX_ANSWER_BYTES {
            out.push(RateLimitQuotaResponse {
                bucket_action: std::mem::take(&mut current),
            });
            size = 0;
        }
        size += len;
        current.push(action);
    }
    if !current.is_empty() {
        out.push(RateLimitQuotaResponse {
            bucket_action: current,
        });
    }
    out
}

/// An answer in the queue, holding its bytes of the process's queue until the reader
/// takes it.
pub type Queued = (
    Result<RateLimitQuotaResponse, Status>,
    Option<OwnedSemaphorePermit>,
);

/// The answers of one stream, as its reader takes them.
pub struct Answers(pub ReceiverStream<Queued>);

impl Stream for Answers {
    type Item = Result<RateLimitQuotaResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0)
            .poll_next(cx)
            .map(|queued| queued.map(|(answer, _permit)| answer))
    }
}

/// The process's bytes of queued answers.
pub fn queue() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(MAX_QUEUED_BYTES))
}

/// Bytes of `answer` in the queue (at least one, at most the whole queue).
pub fn queued_size(answer: &RateLimitQuotaResponse) -> u32 {
    let size = answer.encoded_len().clamp(1, MAX_QUEUED_BYTES);
    u32::try_from(size).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn action(text: usize) -> BucketAction {
        BucketAction {
            bucket_id: Some(BucketId {
                bucket: HashMap::from([("k".to_owned(), "v".repeat(text))]),
            }),
            bucket_action: None,
        }
    }

    #[test]
    fn answers_are_split_under_the_bound_and_keep_every_action_in_order() {
        let actions: Vec<BucketAction> = (0..50).map(|_| action(60_000)).collect();
        let answers = answers(actions.clone());
        assert!(answers.len() > 2, "{}", answers.len());
        assert!(answers.iter().all(|a| a.encoded_len() <= MAX_ANSWER_BYTES));
        let back: Vec<BucketAction> = answers.into_iter().flat_map(|a| a.bucket_action).collect();
        assert_eq!(back, actions);
        assert!(super::answers(Vec::new()).is_empty());
    }

    #[test]
    fn the_budget_refuses_past_its_bytes_and_gives_back() {
        let budget = Budget::default();
        assert!(budget.take(MAX_PROCESS_BYTES - 10));
        assert!(!budget.take(11));
        assert!(budget.take(10));
        budget.give(10);
        budget.give(MAX_PROCESS_BYTES - 10);
        assert!(budget.take(MAX_PROCESS_BYTES));
        let id = BucketId {
            bucket: HashMap::from([("user".to_owned(), "bob".to_owned())]),
        };
        assert_eq!(bucket_cost(&id), 3 * 7 + 256);
    }
}
