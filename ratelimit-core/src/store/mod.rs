//! The counter store interface used by the in-process path, and the in-memory store
//! ([`memory`], with its concurrency limits in [`leases`]).

pub(crate) mod leases;
pub(crate) mod memory;

use crate::counting::counter_key::CounterKey;
use crate::counting::gcra::Bucket;
use crate::counting::lease::Lease;

/// Counters that can be changed synchronously.
///
/// [`crate::MemoryStore`] implements it for one process, keyed by each [`CounterKey`]'s
/// parts; the proxy-wasm filter implements it over Envoy's shared data, keyed by its text.
/// Remote stores (Redis, memcached) use [`crate::Plan`] instead, so that a request costs
/// one round trip.
pub trait CounterStore {
    /// Adds `hits` to the counter `key`, which is needed until `expires` (unix seconds),
    /// and returns its value after the addition.
    fn increment(&self, key: &CounterKey<'_>, hits: u64, expires: u64, now: u64) -> u64;

    /// The value of counter `key`, 0 when it does not exist or is no longer needed.
    fn get(&self, key: &CounterKey<'_>, now: u64) -> u64;

    /// Takes `hits` off the counter `key`, never below 0, and returns what is left; a
    /// counter that does not exist is 0 (a store may create it at 0, needed until
    /// `expires`).
    fn decrement(&self, key: &CounterKey<'_>, hits: u64, expires: u64, now: u64) -> u64;

    /// Gives `cost` tokens back to the bucket `key` ([`Bucket::refund`]) atomically and
    /// returns its new TAT; 0 when there is no bucket (it is full).
    fn gcra_refund(&self, key: &CounterKey<'_>, bucket: Bucket, cost: u64, now_ms: u64) -> u64;

    /// Runs one [`Bucket::step`] of `cost` tokens at `now_ms` on the bucket `key`,
    /// atomically, and returns the TAT the request asked for (the step's second value).
    fn gcra(&self, key: &CounterKey<'_>, bucket: Bucket, cost: u64, now_ms: u64) -> u64;

    /// Runs a concurrency limit's request on the lease set `key`
    /// ([`LeaseSet::acquire`](crate::LeaseSet::acquire): a place is taken unless `hits`
    /// is 0) atomically, and returns the places in use with the request.
    fn acquire(&self, key: &CounterKey<'_>, lease: Lease, hits: u64, now_ms: u64) -> u64;

    /// Gives the place of `lease` back on the lease set `key` atomically (nothing when it
    /// holds none) and returns the places still in use.
    fn release(&self, key: &CounterKey<'_>, lease: Lease, now_ms: u64) -> u64;
}
