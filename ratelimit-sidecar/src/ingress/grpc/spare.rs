//! Requests kept to decode into: each worker thread keeps a few of the core's requests,
//! and a call's message is decoded into one of them, reusing its strings and vectors, so
//! that a call allocates nothing for its request once the thread has seen one as large.
//!
//! Bounded twice: a thread keeps at most [`KEPT`] requests, and only requests that hold
//! at most [`KEPT_BYTES`] (a request that held more is dropped, as before).

use std::cell::RefCell;

use ratelimit_core::{Descriptor, Entry, Request};
use ratelimit_proto::wire::{self, RequestError};

/// The requests a thread keeps at most: more than a worker's calls in flight under the
/// usual load (a call decided on the memory store gives its request back before the next
/// call is read).
const KEPT: usize = 64;

/// The bytes a kept request may hold: room for several descriptors of a few entries.
const KEPT_BYTES: usize = 4096;

thread_local! {
    static SPARE: RefCell<Vec<Request>> = const { RefCell::new(Vec::new()) };
}

/// `message` decoded into a kept request, or into a new one when the thread keeps none.
pub(super) fn decode(message: &[u8]) -> Result<Request, RequestError> {
    let mut request = SPARE.with_borrow_mut(Vec::pop).unwrap_or_default();
    match wire::decode_request_into(message, &mut request) {
        Ok(()) => Ok(request),
        Err(error) => {
            keep(request);
            Err(error)
        }
    }
}

/// Keeps `request` for a later call to decode into, unless the thread keeps enough
/// already or it holds more than [`KEPT_BYTES`].
pub(super) fn keep(request: Request) {
    if held(&request) > KEPT_BYTES {
        return;
    }
    SPARE.with_borrow_mut(|spare| {
        if spare.len() < KEPT {
            spare.push(request);
        }
    });
}

/// The bytes `request` holds on the heap (its vectors' room and its strings').
fn held(request: &Request) -> usize {
    let descriptors = request.descriptors.iter().map(|descriptor| {
        let strings: usize = (descriptor.entries.iter())
            .map(|entry| entry.key.capacity() + entry.value.capacity())
            .sum();
        descriptor.entries.capacity() * size_of::<Entry>() + strings
    });
    let room = request.descriptors.capacity() * size_of::<Descriptor>();
    request.domain.capacity() + room + descriptors.sum::<usize>()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as PbEntry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use prost::Message;

    use super::*;

    fn kept() -> usize {
        SPARE.with_borrow(Vec::len)
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
        let first = decode(&message("a longer value")).unwrap();
        let value = first.descriptors[0].entries[0].value.as_ptr();
        keep(first);
        assert_eq!(kept(), 1);
        let second = decode(&message("short")).unwrap();
        assert_eq!(kept(), 0);
        assert_eq!(second.descriptors[0].entries[0].value, "short");
        assert_eq!(second.descriptors[0].entries[0].value.as_ptr(), value);
    }

    #[test]
    fn a_thread_keeps_a_bounded_number_of_small_requests() {
        let large = decode(&message(&"x".repeat(KEPT_BYTES))).unwrap();
        keep(large);
        assert_eq!(
            kept(),
            0,
            "a request holding more than KEPT_BYTES is dropped"
        );
        for _ in 0..KEPT + 5 {
            keep(decode(&message("v")).unwrap());
            keep(Request::default());
        }
        assert_eq!(kept(), KEPT);
    }
}
