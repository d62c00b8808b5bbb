//! The counter store interface used by the in-process path.

/// Fixed-window counters that can be incremented synchronously.
///
/// [`crate::MemoryStore`] implements it for one process; the proxy-wasm filter implements
/// it over Envoy's shared data. Remote stores (Redis, memcached) use [`crate::Plan`]
/// instead, so that a request costs one round trip.
pub trait CounterStore {
    /// Adds `hits` to the counter `key`, which belongs to a window ending at `window_end`
    /// (unix seconds), and returns its value after the addition.
    fn increment(&self, key: &str, hits: u64, window_end: u64, now: u64) -> u64;

    /// The value of counter `key`, 0 when it does not exist or its window has ended.
    fn get(&self, key: &str, now: u64) -> u64;
}
