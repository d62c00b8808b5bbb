//! Buffers recycled from one decision to the next: each worker thread keeps a few of the
//! core's requests (a call's message is decoded into one, reusing its strings and
//! vectors) and a few remote plans' buffers ([`PlanBuffers`]: their counters' vector and
//! key strings), so that a decision allocates nothing for either once the thread has
//! seen one as large.
//!
//! Bounded twice: a thread keeps at most [`KEPT`] of each, and only those that hold at
//! most [`KEPT_BYTES`] (one that held more is dropped, as before).

use std::cell::RefCell;
use std::thread::LocalKey;

use ratelimit_core::{Descriptor, Entry, PlanBuffers, Request, RequestBounds};
use ratelimit_proto::wire::{self, RequestError};

/// How many of each a thread keeps at most: more than a worker's calls in flight under
/// the usual load (a call decided on the memory store gives its request back before the
/// next call is read).
const KEPT: usize = 64;

/// The bytes a kept value may hold: buffers for several descriptors of a few entries.
const KEPT_BYTES: usize = 4096;

/// What a thread keeps of one kind.
type Recycled<T> = RefCell<Vec<T>>;

thread_local! {
    static REQUESTS: Recycled<Request> = const { RefCell::new(Vec::new()) };
    static PLAN_BUFFERS: Recycled<PlanBuffers> = const { RefCell::new(Vec::new()) };
}

/// `message` decoded into a kept request, or into a new one when the thread keeps none,
/// with at most as many descriptors and entries as `bounds` allow.
pub(crate) fn decode(message: &[u8], bounds: &RequestBounds) -> Result<Request, RequestError> {
    let mut request = take(&REQUESTS);
    match wire::decode_request_into(message, &mut request, bounds) {
        Ok(()) => Ok(request),
        Err(error) => {
            recycle_request(request);
            Err(error)
        }
    }
}

/// Keeps `request` for a later call to decode into.
pub(crate) fn recycle_request(request: Request) {
    keep(&REQUESTS, held(&request), request);
}

/// A kept plan's buffers, or an empty one when the thread keeps none.
pub(crate) fn plan_buffers() -> PlanBuffers {
    take(&PLAN_BUFFERS)
}

/// Keeps `buffers` for a later plan.
pub(crate) fn recycle_plan_buffers(buffers: PlanBuffers) {
    keep(&PLAN_BUFFERS, buffers.held(), buffers);
}

fn take<T: Default>(kept: &'static LocalKey<Recycled<T>>) -> T {
    kept.with_borrow_mut(Vec::pop).unwrap_or_default()
}

/// Keeps `value`, which holds `bytes`, unless the thread keeps enough already or it holds
/// more than [`KEPT_BYTES`].
fn keep<T>(kept: &'static LocalKey<Recycled<T>>, bytes: usize, value: T) {
    if bytes > KEPT_BYTES {
        return;
    }
    kept.with_borrow_mut(|kept| {
        if kept.len() < KEPT {
            kept.push(value);
        }
    });
}

/// The bytes `request` holds on the heap (its vectors' buffers and its strings').
fn held(request: &Request) -> usize {
    let descriptors = request.descriptors.iter().map(|descriptor| {
        let strings: usize = (descriptor.entries.iter())
            .map(|entry| entry.key.capacity() + entry.value.capacity())
            .sum();
        descriptor.entries.capacity() * size_of::<Entry>() + strings
    });
    let buffers = request.descriptors.capacity() * size_of::<Descriptor>();
    request.domain.capacity() + buffers + descriptors.sum::<usize>()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use prost::Message;

    use super::*;

    fn kept() -> usize {
        REQUESTS.with_borrow(Vec::len)
    }

    fn message(value: &str) -> Vec<u8> {
        let entries = vec![PbEntry {
            key: "k".into(),
            value: value.into(),
        }];
        let descriptors = vec![RateLimitDescriptor {
            entries,
            ..RateLimitDescriptor::default()
        }];
        let domain = "d".into();
        (RateLimitRequest {
            domain,
            descriptors,
            hits_addend: 0,
        })
        .encode_to_vec()
    }

    #[test]
    fn a_kept_request_is_decoded_into_and_its_room_reused() {
        let first = decode(&message("a longer value"), &RequestBounds::default()).unwrap();
        let value = first.descriptors[0].entries[0].value.as_ptr();
        recycle_request(first);
        assert_eq!(kept(), 1);
        let second = decode(&message("short"), &RequestBounds::default()).unwrap();
        assert_eq!(kept(), 0);
        assert_eq!(second.descriptors[0].entries[0].value, "short");
        assert_eq!(second.descriptors[0].entries[0].value.as_ptr(), value);
    }

    #[test]
    fn a_thread_keeps_a_bounded_number_of_small_requests() {
        let large = decode(&message(&"x".repeat(KEPT_BYTES)), &RequestBounds::default()).unwrap();
        recycle_request(large);
        assert_eq!(
            kept(),
            0,
            "a request holding more than KEPT_BYTES is dropped"
        );
        for _ in 0..KEPT + 5 {
            recycle_request(decode(&message("v"), &RequestBounds::default()).unwrap());
            recycle_request(Request::default());
        }
        assert_eq!(kept(), KEPT);
    }
}
