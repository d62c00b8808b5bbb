//! Durations as a histogram with fixed buckets: recording is a few atomic adds, and any
//! output (statsd timings, a Prometheus histogram, the debug text) is computed from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in microseconds; one more bucket holds everything above.
pub const BUCKET_BOUNDS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

const BUCKETS: usize = BUCKET_BOUNDS_US.len() + 1;

/// A histogram of durations. Recording one is two atomic adds when it is not the longest
/// yet: the count is the buckets' sum, and a sum of zero microseconds adds nothing.
#[derive(Debug, Default)]
pub struct Timer {
    sum_us: AtomicU64,
    max_us: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// A timer's totals at one moment (or, from [`TimerReading::since`], over an interval).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimerReading {
    /// Durations recorded.
    pub count: u64,
    /// Their sum, in microseconds.
    pub sum_us: u64,
    /// The longest, in microseconds (over the timer's life, not an interval).
    pub max_us: u64,
    /// Durations per bucket of [`BUCKET_BOUNDS_US`], the last one unbounded.
    pub buckets: [u64; BUCKETS],
}

impl Timer {
    /// Records one duration.
    pub fn record(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = BUCKET_BOUNDS_US.partition_point(|&bound| bound < us);
        if us > 0 {
            self.sum_us.fetch_add(us, Ordering::Relaxed);
        }
        if us > self.max_us.load(Ordering::Relaxed) {
            self.max_us.fetch_max(us, Ordering::Relaxed);
        }
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The totals now.
    pub fn read(&self) -> TimerReading {
        let buckets: [u64; BUCKETS] =
            std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        TimerReading {
            count: buckets.iter().sum(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
            max_us: self.max_us.load(Ordering::Relaxed),
            buckets,
        }
    }
}

impl TimerReading {
    /// What was recorded between `earlier` and this reading.
    pub fn since(&self, earlier: &TimerReading) -> TimerReading {
        TimerReading {
            count: self.count.saturating_sub(earlier.count),
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
            max_us: self.max_us,
            buckets: std::array::from_fn(|i| self.buckets[i].saturating_sub(earlier.buckets[i])),
        }
    }

    /// Each non-empty bucket as `(a representative duration in microseconds, how many)`:
    /// the middle of the bucket, or the maximum for the unbounded last one.
    pub fn representatives(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, &n)| {
                let low = if i == 0 { 0 } else { BUCKET_BOUNDS_US[i - 1] };
                let value = match BUCKET_BOUNDS_US.get(i) {
                    Some(&high) => (low + high) / 2,
                    None => self.max_us.max(low),
                };
                (value, n)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_land_in_their_buckets() {
        let timer = Timer::default();
        for us in [10, 50, 51, 700, 20_000_000] {
            timer.record(Duration::from_micros(us));
        }
        let reading = timer.read();
        assert_eq!(reading.count, 5);
        assert_eq!(reading.sum_us, 20_000_811);
        assert_eq!(reading.max_us, 20_000_000);
        assert_eq!(reading.buckets[0], 2, "10 and 50 µs are within 50");
        assert_eq!(reading.buckets[1], 1);
        assert_eq!(reading.buckets[4], 1, "700 µs is within 1 ms");
        assert_eq!(reading.buckets[BUCKETS - 1], 1);
        let spans: Vec<_> = reading.representatives().collect();
        assert_eq!(spans, [(25, 2), (75, 1), (750, 1), (20_000_000, 1)]);

        timer.record(Duration::from_micros(60));
        let delta = timer.read().since(&reading);
        assert_eq!((delta.count, delta.sum_us), (1, 60));
        assert_eq!(delta.representatives().collect::<Vec<_>>(), [(75, 1)]);
    }
}
