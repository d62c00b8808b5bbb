//! The token bucket, as GCRA (the generic cell rate algorithm): a bucket is one number,
//! the theoretical arrival time (TAT, unix milliseconds) at which it would be full again.
//!
//! Every store runs the same step: the in-process stores call [`Bucket::step`] inside
//! their compare-and-swap loop, and the Redis script computes the same three lines. What
//! a stored value means is decided here alone.

use crate::rules::unit::Window;

/// A token bucket: `burst` tokens, refilled one per `interval_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bucket {
    /// Milliseconds to refill one token: the window over `requests_per_unit`.
    pub interval_ms: u64,
    /// How many tokens it holds when full.
    pub burst: u32,
}

impl Bucket {
    /// A bucket refilled at `requests_per_unit` per `window` and holding `burst` tokens.
    /// A rate of 0 never refills.
    pub fn new(window: Window, requests_per_unit: u32, burst: u32) -> Bucket {
        let window_ms = window.seconds().saturating_mul(1_000);
        Bucket {
            interval_ms: match requests_per_unit {
                0 => u64::MAX / 4,
                n => (window_ms / u64::from(n)).max(1),
            },
            burst,
        }
    }

    /// How far ahead of now the TAT may be for a request to be admitted.
    pub fn capacity_ms(self) -> u64 {
        self.interval_ms.saturating_mul(u64::from(self.burst))
    }

    /// The TAT a request of `cost` tokens at `now_ms` asks for, given the stored one (0
    /// when there is none). Stores report this value for every request.
    pub fn next(self, stored: u64, now_ms: u64, cost: u64) -> u64 {
        stored
            .max(now_ms)
            .saturating_add(cost.saturating_mul(self.interval_ms))
    }

    /// Whether a request that asks for TAT `next` at `now_ms` is admitted.
    pub fn admits(self, next: u64, now_ms: u64) -> bool {
        next.saturating_sub(now_ms) <= self.capacity_ms()
    }

    /// One request against the stored TAT: what to store (unchanged when refused) and
    /// what to report ([`Bucket::next`]).
    pub fn step(self, stored: u64, now_ms: u64, cost: u64) -> (u64, u64) {
        let next = self.next(stored, now_ms, cost);
        let keep = if self.admits(next, now_ms) {
            next
        } else {
            stored
        };
        (keep, next)
    }

    /// The TAT after `cost` tokens are given back to a bucket whose stored TAT is
    /// `stored`: it moves back by their time, but not before now, where the bucket is
    /// full (so no refund raises it past `burst`). Stores report and keep this value.
    pub fn refund(self, stored: u64, now_ms: u64, cost: u64) -> u64 {
        stored
            .saturating_sub(cost.saturating_mul(self.interval_ms))
            .max(now_ms.min(stored))
    }

    /// Tokens in use once the request that reported `next` is counted: more than `burst`
    /// exactly when it was refused.
    pub fn used(self, next: u64, now_ms: u64) -> u64 {
        next.saturating_sub(now_ms).div_ceil(self.interval_ms)
    }

    /// Milliseconds until a request of one token fits, after the request of `cost` that
    /// reported `next`.
    pub fn until_one_fits_ms(self, next: u64, cost: u64, now_ms: u64) -> u64 {
        let kept = if self.admits(next, now_ms) {
            next
        } else {
            next.saturating_sub(cost.saturating_mul(self.interval_ms))
        };
        kept.saturating_add(self.interval_ms)
            .saturating_sub(self.capacity_ms())
            .saturating_sub(now_ms)
    }

    /// Milliseconds after which a stored TAT of `tat` is the same as no bucket at all.
    pub fn expiry_ms(tat: u64, now_ms: u64) -> u64 {
        tat.saturating_sub(now_ms).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::unit::Unit;

    #[test]
    fn a_full_bucket_admits_its_burst_then_one_per_interval() {
        let bucket = Bucket::new(Window::of(Unit::Second), 10, 3);
        assert_eq!(bucket.interval_ms, 100);
        let now = 1_000_000;
        let mut stored = 0;
        let mut admitted = 0;
        for _ in 0..5 {
            let (keep, next) = bucket.step(stored, now, 1);
            admitted += u32::from(bucket.admits(next, now));
            stored = keep;
        }
        assert_eq!(admitted, 3);
        assert_eq!(bucket.until_one_fits_ms(stored, 0, now), 100);
        let (keep, next) = bucket.step(stored, now + 100, 1);
        assert!(bucket.admits(next, now + 100));
        assert_eq!(bucket.used(next, now + 100), 3);
        assert_eq!(keep, next);
    }

    #[test]
    fn a_refund_gives_tokens_back_up_to_the_burst() {
        let bucket = Bucket::new(Window::of(Unit::Second), 10, 3);
        let now = 1_000_000;
        let (stored, _) = bucket.step(0, now, 3);
        assert_eq!(bucket.used(stored, now), 3);
        let back = bucket.refund(stored, now, 2);
        assert_eq!(bucket.used(back, now), 1);
        assert_eq!(bucket.refund(back, now, 5), now, "full, never more");
        assert_eq!(bucket.used(bucket.refund(back, now, 5), now), 0);
        assert_eq!(bucket.refund(0, now, 1), 0, "no bucket stays none");
    }

    #[test]
    fn a_refused_request_changes_nothing() {
        let bucket = Bucket::new(Window::of(Unit::Minute), 1, 1);
        let (stored, _) = bucket.step(0, 5_000, 1);
        let (keep, next) = bucket.step(stored, 5_000, 1);
        assert_eq!(keep, stored);
        assert!(!bucket.admits(next, 5_000));
        assert_eq!(bucket.until_one_fits_ms(next, 1, 5_000), 60_000);
    }

    #[test]
    fn a_rate_of_zero_never_refills_and_nothing_overflows() {
        let bucket = Bucket::new(Window::of(Unit::Second), 0, 2);
        let (stored, _) = bucket.step(0, 10, 2);
        let (_, next) = bucket.step(stored, 10_000_000, 1);
        assert!(!bucket.admits(next, 10_000_000));
        assert!(!bucket.admits(bucket.next(0, 0, u64::MAX), 0));
    }
}
