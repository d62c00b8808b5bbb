//! Response-time statistics of the gRPC methods.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Count, total and maximum of a duration, in microseconds.
#[derive(Debug, Default)]
pub struct Timer {
    count: AtomicU64,
    total_us: AtomicU64,
    max_us: AtomicU64,
}

impl Timer {
    /// Records one duration.
    pub fn record(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// `(count, total, max)` in microseconds.
    pub fn read(&self) -> (u64, u64, u64) {
        (
            self.count.load(Ordering::Relaxed),
            self.total_us.load(Ordering::Relaxed),
            self.max_us.load(Ordering::Relaxed),
        )
    }
}
