//! Concurrency limits on memcached: a key's lease set is one value
//! ([`LeaseSet::encode`]), read with `gets` and written back with `cas` (`add` when there
//! is none), read again when another client changed it in between, as a token bucket is.
//! The value lives as long as its newest lease.

use ratelimit_core::{CounterOp, Increment, LeaseSet};

use super::protocol::Reply;

/// A lease set to write back, and what the request is answered once it is stored.
#[derive(Clone, Debug)]
pub(super) struct Put {
    pub text: Box<[u8]>,
    /// Seconds the value lives: until its newest lease lapses.
    pub lifetime: u64,
    /// `None`: there was no set, so `add`.
    pub token: Option<u64>,
    pub answer: u64,
}

/// What follows a lease set's `gets`.
pub(super) enum Next {
    Done(u64),
    Put(Put),
}

/// The request of `item` (a concurrency limit's) on the set `reply` holds.
pub(super) fn after_gets(item: &Increment, reply: Reply) -> Result<Next, String> {
    let (mut set, token) = match reply {
        Reply::NotFound => (LeaseSet::default(), None),
        Reply::Text { data, token } => (decode(&data)?, Some(token)),
        other => return Err(format!("a lease set holds {other:?}")),
    };
    let before = set.clone();
    let answer = match item.op {
        CounterOp::Acquire(lease) => set.acquire(lease, item.hits > 0, item.now_ms),
        CounterOp::Release(lease) => set.release(lease.id, item.now_ms),
        other => unreachable!("{other:?} is not a lease"),
    };
    if set == before || (token.is_none() && set.is_empty()) {
        return Ok(Next::Done(answer));
    }
    Ok(Next::Put(Put {
        text: set.encode().into_bytes().into(),
        lifetime: set.expires_ms().saturating_sub(item.now_ms).div_ceil(1_000) + 1,
        token,
        answer,
    }))
}

/// The places in use in a lease set read with `get`.
pub(super) fn in_use(item: &Increment, data: &[u8]) -> Result<u64, String> {
    Ok(decode(data)?.in_use(item.now_ms))
}

fn decode(data: &[u8]) -> Result<LeaseSet, String> {
    LeaseSet::decode(data).ok_or_else(|| {
        format!(
            "a lease set that does not read as one: {:?}",
            String::from_utf8_lossy(data)
        )
    })
}
