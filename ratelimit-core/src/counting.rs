//! How a limit counts: which counters it needs at a moment, and how their totals become
//! the hits that count against it. The fixed window is the one algorithm today; another
//! (a sliding window reading two windows, say) is a new variant here, and matching, keys,
//! plans, stores and the decision take it as it is.

use smallvec::SmallVec;

use crate::unit::Window;

/// A counter a limit needs: the window it counts, from `start` (unix seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub window: Window,
    pub start: u64,
}

impl Span {
    /// When the counter's window, and so the counter, ends.
    pub fn end(self) -> u64 {
        self.start + self.window.seconds()
    }
}

/// A limit's counting algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counting {
    /// One counter per fixed window, as envoyproxy/ratelimit counts.
    FixedWindow(Window),
}

impl Counting {
    /// The counters needed at `now`, in the order their totals are passed to
    /// [`Counting::used`].
    pub fn counters(self, now: u64) -> SmallVec<[Span; 2]> {
        match self {
            Counting::FixedWindow(window) => smallvec::smallvec![Span {
                window,
                start: window.start(now),
            }],
        }
    }

    /// The hits that count against the limit, from the totals of [`Counting::counters`].
    pub fn used(self, totals: &[u64]) -> u64 {
        match self {
            Counting::FixedWindow(_) => totals.first().copied().unwrap_or(0),
        }
    }

    /// Seconds until the count goes down.
    pub fn until_reset(self, now: u64) -> u64 {
        match self {
            Counting::FixedWindow(window) => window.until_reset(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit::Unit;

    #[test]
    fn a_fixed_window_needs_the_counter_of_the_current_window() {
        let counting = Counting::FixedWindow(Window::of(Unit::Minute));
        let spans = counting.counters(1_000_030);
        assert_eq!(spans.len(), 1);
        assert_eq!((spans[0].start, spans[0].end()), (1_000_020, 1_000_080));
        assert_eq!(counting.used(&[7]), 7);
        assert_eq!(counting.until_reset(1_000_030), 50);
    }
}
