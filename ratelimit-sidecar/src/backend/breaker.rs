//! Circuit breakers, one per node of a remote store (a Redis server, a cluster master, a
//! memcached node): after `BACKEND_BREAKER_FAILURES` failed or timed-out calls in a row
//! a node's breaker opens, and for `BACKEND_BREAKER_OPEN_DURATION` no call reaches that
//! node; then one call goes through as a probe (half-open), and its success closes the
//! breaker, its failure opens it again. Every transition is logged once, naming the
//! node, and counted in the store's statistics.
//!
//! A call dropped before it ends is a failure only once its deadline has passed: dropped
//! earlier, its caller went away (a client that reset the stream, a load generator that
//! stopped), which says nothing about the node.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::stats::{Counter, StatsRegistry};

use super::BackendError;

/// Breakers kept at most: nodes come from the settings and the cluster's topology, never
/// from requests, so this is only reached by a store whose nodes keep changing; then the
/// closed breakers nobody holds are forgotten.
const MAX_NODES: usize = 4096;

/// Statistics of the breakers of store `name`: `ratelimit.<name>.breaker_opened`, ...
fn stat(name: &str, event: &str) -> String {
    ratelimit_core::stats::names::breaker(name, event)
}

/// The breakers of one store's nodes, made as nodes are first named.
#[derive(Debug)]
pub struct Breakers {
    store: &'static str,
    failures_to_open: u32,
    open_for: Duration,
    nodes: Mutex<HashMap<String, Arc<Breaker>>>,
    counts: Counts,
}

/// The store's transition counters, shared by its nodes' breakers.
#[derive(Debug, Clone)]
struct Counts {
    opened: Arc<Counter>,
    closed: Arc<Counter>,
    refused: Arc<Counter>,
}

impl Breakers {
    /// No breakers yet for store `store`; each opens after `failures_to_open` failures in
    /// a row and stays open for `open_for`. Transitions are counted in `stats`.
    pub fn new(
        store: &'static str,
        failures_to_open: u32,
        open_for: Duration,
        stats: &StatsRegistry,
    ) -> Breakers {
        Breakers {
            store,
            failures_to_open: failures_to_open.max(1),
            open_for,
            nodes: Mutex::new(HashMap::new()),
            counts: Counts {
                opened: stats.counter(&stat(store, "opened")),
                closed: stats.counter(&stat(store, "closed")),
                refused: stats.counter(&stat(store, "refused")),
            },
        }
    }

    /// The breaker of the node named `node` (`host:port`, or a socket's path). It counts
    /// for [`Breakers::open_nodes`] while its holder (a node map) keeps it.
    pub fn node(&self, node: &str) -> Arc<Breaker> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(breaker) = nodes.get(node) {
            return Arc::clone(breaker);
        }
        if nodes.len() >= MAX_NODES {
            nodes.retain(|_, b| Arc::strong_count(b) > 1 || b.is_open());
        }
        let breaker = Arc::new(Breaker {
            store: self.store,
            node: node.to_owned(),
            failures_to_open: self.failures_to_open,
            open_for: self.open_for,
            failures: AtomicU32::new(0),
            closed: AtomicBool::new(true),
            state: Mutex::new(State::Closed),
            counts: self.counts.clone(),
        });
        nodes.insert(node.to_owned(), Arc::clone(&breaker));
        breaker
    }

    /// Forgets the breakers of the nodes `listed` does not name: the store's only node
    /// map changed, and views of the old one may still hold them.
    pub fn keep_only(&self, listed: impl Fn(&str) -> bool) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.retain(|name, _| listed(name));
    }

    /// The nodes whose breakers keep calls away (open or half-open), among the nodes a
    /// node map still holds. A node that left every map (a cluster master failed over,
    /// a memcached node gone from its SRV record) gets no calls, so nothing would ever
    /// close its breaker: it is forgotten here, and named again it starts closed.
    pub fn open_nodes(&self) -> Vec<String> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.retain(|_, b| Arc::strong_count(b) > 1);
        let mut open: Vec<String> = nodes
            .iter()
            .filter(|(_, b)| b.is_open())
            .map(|(name, _)| name.clone())
            .collect();
        open.sort();
        open
    }
}

/// One node's breaker.
#[derive(Debug)]
pub struct Breaker {
    store: &'static str,
    node: String,
    failures_to_open: u32,
    open_for: Duration,
    /// Failed calls in a row while closed.
    failures: AtomicU32,
    /// Whether calls go through without asking (the fast path).
    closed: AtomicBool,
    state: Mutex<State>,
    counts: Counts,
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

/// Leave to call the node, which [`Breaker::record`] takes back with the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The breaker is closed.
    Closed,
    /// The one call let through after the open period.
    Probe,
}

impl Breaker {
    /// Runs `call` on this breaker's node ([`Breaker::attempt`], then the call, then
    /// [`Attempt::settle`]): at once `Unavailable` while the breaker is open, otherwise
    /// the call's result.
    pub async fn call<T>(
        &self,
        deadline: Option<Instant>,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let attempt = self.attempt(deadline)?;
        let result = call.await;
        attempt.settle(&result);
        result
    }

    /// Leave to call this breaker's node: `Unavailable` at once while the breaker is
    /// open. The call's outcome is recorded when the attempt is settled; an attempt
    /// dropped unsettled (its call dropped before it ended) is a failure once `deadline`
    /// has passed (always, without one): dropped earlier, its caller went away.
    ///
    /// A guard rather than a future wrapped around the call's, so that the caller's
    /// future holds the call's once, not twice (an argument and the awaited value).
    pub fn attempt(&self, deadline: Option<Instant>) -> Result<Attempt<'_>, BackendError> {
        let Some(pass) = self.admit() else {
            return Err(BackendError::Unavailable(format!(
                "{} {}: circuit breaker open after repeated failures",
                self.store, self.node
            )));
        };
        Ok(Attempt {
            breaker: self,
            pass,
            settled: false,
            deadline,
        })
    }

    /// Whether a call may go to the node now; `None` while the breaker is open (the
    /// call is counted as refused).
    fn admit(&self) -> Option<Pass> {
        if self.closed.load(Ordering::Acquire) {
            return Some(Pass::Closed);
        }
        let mut state = self.lock();
        match *state {
            State::Closed => Some(Pass::Closed),
            State::Open { until } if Instant::now() >= until => {
                *state = State::HalfOpen;
                tracing::warn!(
                    store = self.store,
                    node = self.node,
                    "circuit breaker half-open: probing the node"
                );
                Some(Pass::Probe)
            }
            State::Open { .. } | State::HalfOpen => {
                self.counts.refused.add(1);
                None
            }
        }
    }

    /// The outcome of a call `admit` let through.
    fn record(&self, pass: Pass, succeeded: bool) {
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
                self.counts.closed.add(1);
                tracing::warn!(
                    store = self.store,
                    node = self.node,
                    "circuit breaker closed: the node answers again"
                );
            }
            (Pass::Probe, false) => {
                let mut state = self.lock();
                self.open(&mut state, "the probe failed");
            }
        }
    }

    /// A call let through was dropped by its caller before its deadline: no outcome. An
    /// abandoned probe lets the next call probe instead.
    fn abandoned(&self, pass: Pass) {
        if pass == Pass::Probe {
            let mut state = self.lock();
            if *state == State::HalfOpen {
                *state = State::Open {
                    until: Instant::now(),
                };
            }
        }
    }

    /// Whether calls are being kept from the node (open or half-open).
    pub fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }

    fn open(&self, state: &mut State, why: &str) {
        *state = State::Open {
            until: Instant::now() + self.open_for,
        };
        self.closed.store(false, Ordering::Release);
        self.counts.opened.add(1);
        tracing::warn!(
            store = self.store,
            node = self.node,
            reason = why,
            open_for = ?self.open_for,
            "circuit breaker open: no calls to the node until it has passed"
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A call let through and not yet ended: dropped unsettled at or after its deadline (or
/// without one), it is a failure; dropped before, it is abandoned.
#[must_use = "an attempt records its call's outcome when settled"]
pub struct Attempt<'a> {
    breaker: &'a Breaker,
    pass: Pass,
    settled: bool,
    deadline: Option<Instant>,
}

impl Attempt<'_> {
    /// Records the outcome of the call: a failure when the store failed or did not
    /// answer, not when it refused a key (the request's fault, not the node's).
    /// A call that went late before the attempt's deadline (the store's own) was cut
    /// short by its caller's deadline: like a call dropped early, it has no outcome.
    pub fn settle<T>(mut self, result: &Result<T, BackendError>) {
        self.settled = true;
        let failed = match result {
            Err(BackendError::Late) if self.deadline.is_some_and(|d| Instant::now() < d) => {
                return self.breaker.abandoned(self.pass);
            }
            Err(BackendError::Unavailable(_) | BackendError::Settings(_) | BackendError::Late) => {
                true
            }
            Ok(_) | Err(BackendError::Key(_) | BackendError::CallerDeadline(_)) => false,
        };
        self.breaker.record(self.pass, !failed);
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if self
            .deadline
            .is_none_or(|deadline| Instant::now() >= deadline)
        {
            self.breaker.record(self.pass, false);
        } else {
            self.breaker.abandoned(self.pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breakers(stats: &StatsRegistry) -> Breakers {
        Breakers::new("redis", 3, Duration::from_millis(50), stats)
    }

    /// A call whose caller went away is not the node's failure; one dropped at its
    /// deadline is.
    #[tokio::test]
    async fn only_calls_dropped_at_their_deadline_are_failures() {
        let stats = StatsRegistry::new(10);
        let breaker = breakers(&stats).node("10.0.0.3:6379");
        let stuck = std::future::pending::<Result<(), BackendError>>;
        let dropped_after = |wait_ms, deadline_ms| {
            let deadline = Instant::now() + Duration::from_millis(deadline_ms);
            let call = breaker.call(Some(deadline), stuck());
            tokio::time::timeout(Duration::from_millis(wait_ms), call)
        };
        for _ in 0..5 {
            assert!(dropped_after(1, 60_000).await.is_err());
        }
        assert!(
            !breaker.is_open(),
            "callers that went away opened the breaker"
        );
        for _ in 0..3 {
            assert!(dropped_after(5, 1).await.is_err());
        }
        assert!(breaker.is_open(), "calls past their deadline are failures");
        // An abandoned probe leaves the next call to probe; its success closes the breaker.
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(dropped_after(1, 60_000).await.is_err());
        breaker
            .call(None, async { Ok::<_, BackendError>(()) })
            .await
            .unwrap();
        assert!(!breaker.is_open());
    }

    #[test]
    fn opens_after_failures_in_a_row_then_probes_once_and_closes() {
        let stats = StatsRegistry::new(10);
        let breaker = breakers(&stats).node("10.0.0.1:6379");
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

    #[tokio::test]
    async fn each_node_has_its_own_breaker_and_an_abandoned_call_is_a_failure() {
        let stats = StatsRegistry::new(10);
        let breakers = breakers(&stats);
        let (down, up) = (
            breakers.node("10.0.0.1:6379"),
            breakers.node("10.0.0.2:6379"),
        );
        assert!(Arc::ptr_eq(&down, &breakers.node("10.0.0.1:6379")));
        let failing = || async { Err::<(), _>(BackendError::Unavailable("refused".into())) };
        down.call(None, failing()).await.unwrap_err();
        down.call(None, failing()).await.unwrap_err();
        // The third never ends: its deadline drops it.
        let hanging = down.call(None, std::future::pending::<Result<(), BackendError>>());
        assert!(
            tokio::time::timeout(Duration::from_millis(5), hanging)
                .await
                .is_err()
        );
        assert!(down.is_open());
        let refused = down.call(None, async { Ok(()) }).await.unwrap_err();
        assert_eq!(
            refused.to_string(),
            "redis 10.0.0.1:6379: circuit breaker open after repeated failures"
        );
        up.call(None, async { Ok(()) }).await.unwrap();
        assert!(!up.is_open());
        for _ in 0..3 {
            let refused_key = async { Err::<(), _>(BackendError::Key("too long".into())) };
            up.call(None, refused_key).await.unwrap_err();
        }
        assert!(!up.is_open(), "a refused key is not the node's failure");
        assert_eq!(breakers.open_nodes(), ["10.0.0.1:6379"]);
    }

    /// A node that left its map (no one holds its breaker) no longer counts as open, and
    /// named again it starts closed; a store's map that changed forgets the others.
    #[test]
    fn nodes_that_left_the_map_do_not_count() {
        let stats = StatsRegistry::new(10);
        let breakers = breakers(&stats);
        let fail = |breaker: &Breaker| {
            for _ in 0..3 {
                breaker.record(breaker.admit().unwrap(), false);
            }
        };
        let (gone, held) = (
            breakers.node("10.0.0.1:11211"),
            breakers.node("10.0.0.2:11211"),
        );
        fail(&gone);
        fail(&held);
        assert_eq!(breakers.open_nodes(), ["10.0.0.1:11211", "10.0.0.2:11211"]);
        drop(gone);
        assert_eq!(breakers.open_nodes(), ["10.0.0.2:11211"]);
        assert!(!breakers.node("10.0.0.1:11211").is_open());
        breakers.keep_only(|name| name == "10.0.0.3:11211");
        assert!(
            breakers.open_nodes().is_empty(),
            "a view that still holds it"
        );
        assert!(!Arc::ptr_eq(&held, &breakers.node("10.0.0.2:11211")));
    }
}
