//! How a limit counts: which counters it needs at a moment, what each store does to them,
//! and how their totals become the hits that count against it. Matching, keys, plans,
//! stores and the decision take a limit's [`Counting`] as it is. Its parts: counter keys
//! ([`counter_key`]) and the maps keyed by them ([`keymap`]), token buckets ([`gcra`])
//! and the cache of counters known to be over their limit ([`local_cache`]); a
//! concurrency limit holds leases instead of hits ([`lease`]).

pub(crate) mod counter_key;
pub(crate) mod gcra;
pub(crate) mod keymap;
pub(crate) mod lease;
pub(crate) mod local_cache;

use crate::counting::gcra::Bucket;
use crate::counting::lease::Lease;
use crate::rules::unit::Window;

/// What a store does with one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterOp {
    /// Add the hits and return the total (a fixed window, or a sliding window's current
    /// one).
    Add,
    /// Return the total without changing it (a sliding window's previous window).
    Read,
    /// Run one [`Bucket::step`] with the hits as its cost at the request's time, and
    /// return the TAT the request asked for.
    Gcra(Bucket),
    /// Take the hits off the counter, never below 0, and return what is left; a counter
    /// that does not exist stays so (a refund, Envoy's `is_negative_hits`).
    Refund,
    /// Give the hits back to the bucket ([`Bucket::refund`]) and return its new TAT.
    GcraRefund(Bucket),
    /// Take a place for the lease ([`LeaseSet::acquire`](lease::LeaseSet::acquire); none
    /// for 0 hits) and return the places in use with the request.
    Acquire(Lease),
    /// Give the lease's place back and return the places still in use.
    Release(Lease),
}

impl CounterOp {
    /// What the op becomes when the request refunds its hits: added hits are taken off,
    /// a bucket's tokens are given back, a read stays a read.
    pub(crate) fn refunding(self) -> CounterOp {
        match self {
            CounterOp::Add => CounterOp::Refund,
            CounterOp::Gcra(bucket) => CounterOp::GcraRefund(bucket),
            CounterOp::Acquire(lease) => CounterOp::Release(lease),
            other => other,
        }
    }

    /// Whether the op gives hits back.
    pub fn is_refund(self) -> bool {
        matches!(
            self,
            CounterOp::Refund | CounterOp::GcraRefund(_) | CounterOp::Release(_)
        )
    }

    /// Whether the counter's key names no window: a bucket's or a lease set's.
    pub fn is_windowless(self) -> bool {
        matches!(
            self,
            CounterOp::Gcra(_)
                | CounterOp::GcraRefund(_)
                | CounterOp::Acquire(_)
                | CounterOp::Release(_)
        )
    }
}

/// A counter a limit needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub window: Window,
    /// Start of the counter's window (unix seconds); now for a bucket, which has none.
    pub start: u64,
    pub op: CounterOp,
    /// Unix second after which the counter is no longer needed.
    pub expires: u64,
}

/// A limit's algorithm, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counting {
    /// One counter per window, as envoyproxy/ratelimit counts.
    FixedWindow(Window),
    /// The current and the previous window; the previous one weighs by the fraction of
    /// it that a window-long interval ending now still covers.
    SlidingWindow(Window),
    /// A GCRA token bucket refilled over `window`.
    TokenBucket(Bucket, Window),
    /// At most `places` requests in flight, each place held for at most `window` (its
    /// lease) unless given back sooner.
    Concurrency {
        /// The lease.
        window: Window,
        /// Requests in flight at once.
        places: u32,
    },
}

/// What the totals mean for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Assessed {
    /// Hits counting against the bound, this request's included.
    pub after: u64,
    /// Seconds until the count goes down (windows) or one more request fits (buckets).
    pub reset: u64,
}

impl Counting {
    /// The counters needed at `now_ms` (unix milliseconds), in the order their totals are
    /// passed to [`Counting::assess`].
    pub fn counters(self, now_ms: u64) -> impl Iterator<Item = Span> {
        (0..self.counter_count()).map(move |at| self.span(at, now_ms))
    }

    /// Counter `at` of [`Counting::counters`].
    #[inline(always)]
    pub fn span(self, at: usize, now_ms: u64) -> Span {
        let now = now_ms / 1_000;
        match self {
            Counting::FixedWindow(window) => {
                let start = window.start(now);
                Span {
                    window,
                    start,
                    op: CounterOp::Add,
                    expires: start + window.seconds(),
                }
            }
            Counting::SlidingWindow(window) => {
                let start = window.start(now);
                let length = window.seconds();
                match at {
                    0 => Span {
                        window,
                        start,
                        op: CounterOp::Add,
                        // Read again as the previous window during the next one.
                        expires: start + 2 * length,
                    },
                    _ => Span {
                        window,
                        start: start.saturating_sub(length),
                        op: CounterOp::Read,
                        expires: start + length,
                    },
                }
            }
            Counting::TokenBucket(bucket, window) => Span {
                window,
                start: now,
                op: CounterOp::Gcra(bucket),
                expires: now + bucket.capacity_ms().div_ceil(1_000) + 1,
            },
            Counting::Concurrency { window, places } => Span {
                window,
                start: now,
                op: CounterOp::Acquire(Lease {
                    // The request's, set where the descriptor is known.
                    id: 0,
                    places,
                    lease_ms: window.seconds().saturating_mul(1_000),
                }),
                expires: now + window.seconds() + 1,
            },
        }
    }

    /// How many counters [`Counting::counters`] lists.
    pub fn counter_count(self) -> usize {
        match self {
            Counting::SlidingWindow(_) => 2,
            Counting::FixedWindow(_) | Counting::TokenBucket(..) | Counting::Concurrency { .. } => {
                1
            }
        }
    }

    /// The largest number of hits admitted: `requests_per_unit`, or a bucket's burst.
    pub fn bound(self, requests_per_unit: u32) -> u64 {
        match self {
            Counting::TokenBucket(bucket, _) => u64::from(bucket.burst),
            Counting::Concurrency { places, .. } => u64::from(places),
            _ => u64::from(requests_per_unit),
        }
    }

    /// The hits that count against the limit after a request of `addend` hits, from the
    /// totals of [`Counting::counters`], and when that goes down.
    #[inline(always)]
    pub fn assess(self, totals: &[u64], addend: u64, bound: u64, now_ms: u64) -> Assessed {
        let total = |i: usize| totals.get(i).copied().unwrap_or(0);
        match self {
            Counting::FixedWindow(window) => Assessed {
                after: total(0),
                reset: window.until_reset(now_ms / 1_000),
            },
            Counting::SlidingWindow(window) => {
                let (current, previous) = (total(0), total(1));
                let length = window.seconds().saturating_mul(1_000);
                let left = length - now_ms % length;
                let after = current.saturating_add(weigh(previous, left, length));
                let reset = if after > bound {
                    sliding_wait_ms(current, previous, bound, left, length).div_ceil(1_000)
                } else {
                    left.div_ceil(1_000)
                };
                Assessed { after, reset }
            }
            Counting::TokenBucket(bucket, _) => {
                let next = total(0);
                Assessed {
                    after: bucket.used(next, now_ms),
                    reset: bucket
                        .until_one_fits_ms(next, addend, now_ms)
                        .div_ceil(1_000),
                }
            }
            // A place frees whenever a request ends, which no store can foresee: one
            // second, the shortest wait a header can say.
            Counting::Concurrency { .. } => Assessed {
                after: total(0),
                reset: 1,
            },
        }
    }

    /// Whether a request of `addend` hits would go over `bound`, from the current totals
    /// (read, not added to).
    pub fn exceeds(self, current: &[u64], addend: u64, bound: u64, now_ms: u64) -> bool {
        match self {
            Counting::TokenBucket(bucket, _) => {
                let stored = current.first().copied().unwrap_or(0);
                !bucket.admits(bucket.next(stored, now_ms, addend), now_ms)
            }
            // A request takes one place, whatever its hits.
            Counting::Concurrency { .. } => {
                let in_use = current.first().copied().unwrap_or(0);
                in_use.saturating_add(addend.min(1)) > bound
            }
            _ => {
                let used = self.assess(current, 0, bound, now_ms).after;
                used.saturating_add(addend) > bound
            }
        }
    }
}

/// `count × left / length`, rounded up. The estimate `current + previous × left / length`
/// is compared with an integer bound, so rounding the weighted part up makes `after >
/// bound` the exact comparison `current × length + previous × left > bound × length`: a
/// fraction of a hit left over from the previous window is never forgiven.
fn weigh(count: u64, left: u64, length: u64) -> u64 {
    u64::try_from((u128::from(count) * u128::from(left)).div_ceil(u128::from(length)))
        .unwrap_or(u64::MAX)
}

/// Milliseconds until one more hit fits a sliding window with these counts, `left`
/// milliseconds before the current window ends.
fn sliding_wait_ms(current: u64, previous: u64, bound: u64, left: u64, length: u64) -> u64 {
    // Room for one hit means the estimate is at most bound - 1.
    let Some(room) = bound.checked_sub(1) else {
        return left + length;
    };
    if current <= room && previous > 0 {
        // Within this window, once previous × left' / length <= room - current.
        let allowed = room - current;
        let left_then = u128::from(allowed) * u128::from(length) / u128::from(previous);
        return left.saturating_sub(u64::try_from(left_then).unwrap_or(u64::MAX));
    }
    if current <= room {
        return 0;
    }
    // In the next window, the current count becomes the previous one.
    let left_then = u128::from(room) * u128::from(length) / u128::from(current);
    left + length.saturating_sub(u64::try_from(left_then).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::unit::Unit;

    #[test]
    fn a_fixed_window_needs_the_counter_of_the_current_window() {
        let counting = Counting::FixedWindow(Window::of(Unit::Minute));
        let spans: Vec<Span> = counting.counters(1_000_030_000).collect();
        assert_eq!(spans.len(), counting.counter_count());
        assert_eq!((spans[0].start, spans[0].expires), (1_000_020, 1_000_080));
        let assessed = counting.assess(&[7], 1, 10, 1_000_030_000);
        assert_eq!((assessed.after, assessed.reset), (7, 50));
    }

    #[test]
    fn a_sliding_window_weighs_the_previous_window_by_what_is_left_of_it() {
        let counting = Counting::SlidingWindow(Window::of(Unit::Minute));
        // 15 s into the window: 45 of 60 s of the previous window still count.
        let now_ms = 1_000_035_000;
        let spans: Vec<Span> = counting.counters(now_ms).collect();
        assert_eq!(spans.len(), counting.counter_count());
        assert_eq!(spans[0].start, 1_000_020);
        assert_eq!((spans[1].start, spans[1].op), (999_960, CounterOp::Read));
        let assessed = counting.assess(&[2, 8], 1, 10, now_ms);
        assert_eq!(assessed.after, 2 + 6);
        assert_eq!(assessed.reset, 45);
        // Over: 10 + 8 × 45/60 = 16; one more fits when 8 × left/60 <= -1: next window,
        // when 10 × left/60 <= 9, so 6 s into it: 45 + 6 = 51 s.
        let over = counting.assess(&[10, 8], 1, 10, now_ms);
        assert_eq!((over.after, over.reset), (16, 51));
        // Room in the current window once the previous one has decayed enough.
        let decaying = counting.assess(&[4, 12], 1, 10, now_ms);
        assert_eq!(decaying.after, 4 + 9);
        assert!(!counting.exceeds(&[4, 12], 1, 10, now_ms + 30_000));
        assert_eq!(decaying.reset, 20, "12 × left/60 <= 5 once left <= 25 s");
    }

    #[test]
    fn a_sliding_window_compares_exactly_at_a_boundary() {
        // 4 per 2 s: four hits at 1.7 s, then one at 2.2 s. The previous window still
        // weighs 4 × 1.8 / 2 = 3.6 hits, so the fifth makes 4.6 > 4.
        let counting = Counting::SlidingWindow(Window::new(Unit::Second, 2));
        let now_ms = 1_000_002_200;
        let assessed = counting.assess(&[1, 4], 1, 4, now_ms);
        assert_eq!(assessed.after, 5, "3.6 rounds up, never down");
        assert!(counting.exceeds(&[0, 4], 1, 4, now_ms));
        // Exactly on the bound is within it: 3 × 1 / 2 = 1.5 -> 2, plus 2 current = 4.
        assert_eq!(counting.assess(&[2, 3], 1, 4, 1_000_003_000).after, 4);
        assert!(!counting.exceeds(&[1, 3], 1, 4, 1_000_003_000));
    }

    #[test]
    fn a_bucket_reports_tokens_in_use_and_the_wait_for_one_more() {
        let bucket = Bucket::new(Window::of(Unit::Second), 2, 2);
        let counting = Counting::TokenBucket(bucket, Window::of(Unit::Second));
        assert_eq!(counting.bound(2), 2);
        assert_eq!(counting.counters(5_000).count(), counting.counter_count());
        let now_ms = 5_000;
        let assessed = counting.assess(&[now_ms + 1_000], 1, 2, now_ms);
        assert_eq!((assessed.after, assessed.reset), (2, 1));
        assert!(counting.exceeds(&[now_ms + 1_000], 1, 2, now_ms));
        assert!(!counting.exceeds(&[now_ms + 500], 1, 2, now_ms));
    }
}
