//! A circuit breaker for a remote store: after `BACKEND_BREAKER_FAILURES` failed or
//! timed-out calls in a row it opens, and for `BACKEND_BREAKER_OPEN_DURATION` no call
//! reaches the store; then one call goes through as a probe (half-open), and its success
//! closes the breaker, its failure opens it again. Every transition is logged once and
//! counted.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::stats::{Counter, StatsRegistry};

/// Statistics of the breaker of store `name`: `ratelimit.<name>.breaker_opened`, ...
fn stat(name: &str, event: &str) -> String {
    format!("ratelimit.{name}.breaker_{event}")
}

/// One store's breaker.
#[derive(Debug)]
pub struct Breaker {
    name: &'static str,
    failures_to_open: u32,
    open_for: Duration,
    /// Failed calls in a row while closed.
    failures: AtomicU32,
    /// Whether calls go through without asking (the fast path).
    closed: AtomicBool,
    state: Mutex<State>,
    opened: Arc<Counter>,
    closed_count: Arc<Counter>,
    refused: Arc<Counter>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open {
        until: Instant,
    },
    /// One probe is out; the others are refused until it answers.
    HalfOpen,
}

/// Leave to call the store, which [`Breaker::record`] takes back with the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The breaker is closed.
    Closed,
    /// The one call let through after the open period.
    Probe,
}

impl Breaker {
    /// A closed breaker for store `name`, counted in `stats`.
    pub fn new(
        name: &'static str,
        failures_to_open: u32,
        open_for: Duration,
        stats: &StatsRegistry,
    ) -> Breaker {
        Breaker {
            name,
            failures_to_open: failures_to_open.max(1),
            open_for,
            failures: AtomicU32::new(0),
            closed: AtomicBool::new(true),
            state: Mutex::new(State::Closed),
            opened: stats.counter(&stat(name, "opened")),
            closed_count: stats.counter(&stat(name, "closed")),
            refused: stats.counter(&stat(name, "refused")),
        }
    }

    /// Whether a call may go to the store now; `None` while the breaker is open (the
    /// call is counted as refused).
    pub fn admit(&self) -> Option<Pass> {
        if self.closed.load(Ordering::Acquire) {
            return Some(Pass::Closed);
        }
        let mut state = self.lock();
        match *state {
            State::Closed => Some(Pass::Closed),
            State::Open { until } if Instant::now() >= until => {
                *state = State::HalfOpen;
                tracing::warn!(
                    store = self.name,
                    "circuit breaker half-open: probing the store"
                );
                Some(Pass::Probe)
            }
            State::Open { .. } | State::HalfOpen => {
                self.refused.add(1);
                None
            }
        }
    }

    /// The outcome of a call `admit` let through.
    pub fn record(&self, pass: Pass, succeeded: bool) {
        match (pass, succeeded) {
            (Pass::Closed, true) => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
            }
            (Pass::Closed, false) => {
                let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if failures >= self.failures_to_open {
                    let mut state = self.lock();
                    if *state == State::Closed {
                        self.open(&mut state, &format!("{failures} failed calls in a row"));
                    }
                }
            }
            (Pass::Probe, true) => {
                let mut state = self.lock();
                *state = State::Closed;
                self.failures.store(0, Ordering::Relaxed);
                self.closed.store(true, Ordering::Release);
                self.closed_count.add(1);
                tracing::warn!(
                    store = self.name,
                    "circuit breaker closed: the store answers again"
                );
            }
            (Pass::Probe, false) => {
                let mut state = self.lock();
                self.open(&mut state, "the probe failed");
            }
        }
    }

    /// Whether calls are being kept from the store (open or half-open).
    pub fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }

    fn open(&self, state: &mut State, why: &str) {
        *state = State::Open {
            until: Instant::now() + self.open_for,
        };
        self.closed.store(false, Ordering::Release);
        self.opened.add(1);
        tracing::warn!(
            store = self.name,
            reason = why,
            open_for = ?self.open_for,
            "circuit breaker open: no calls to the store until it has passed"
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_in_a_row_then_probes_once_and_closes() {
        let stats = StatsRegistry::new(10);
        let breaker = Breaker::new("redis", 3, Duration::from_millis(50), &stats);
        for _ in 0..2 {
            let pass = breaker.admit().unwrap();
            breaker.record(pass, false);
        }
        breaker.record(breaker.admit().unwrap(), true);
        assert!(!breaker.is_open(), "a success in between resets the run");
        for _ in 0..3 {
            let pass = breaker.admit().unwrap();
            breaker.record(pass, false);
        }
        assert!(breaker.is_open());
        assert_eq!(breaker.admit(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(breaker.admit(), Some(Pass::Probe));
        assert_eq!(breaker.admit(), None, "one probe at a time");
        breaker.record(Pass::Probe, false);
        assert_eq!(breaker.admit(), None, "a failed probe opens it again");
        std::thread::sleep(Duration::from_millis(60));
        breaker.record(breaker.admit().unwrap(), true);
        assert!(!breaker.is_open());
        assert_eq!(breaker.admit(), Some(Pass::Closed));
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.counter("ratelimit.redis.breaker_opened"), Some(2));
        assert_eq!(snapshot.counter("ratelimit.redis.breaker_closed"), Some(1));
        assert_eq!(snapshot.counter("ratelimit.redis.breaker_refused"), Some(3));
    }
}
