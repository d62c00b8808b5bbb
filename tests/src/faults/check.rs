//! The checker: reads a load's history and the fault's times and says whether the
//! limiter kept its promises, and what it measured.

use std::collections::BTreeMap;
use std::fmt;

use super::load::{Answer, Call};

/// One second, in microseconds: the rules' window.
const WINDOW: u64 = 1_000_000;

/// What the failure mode promises while the store is away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promise {
    /// `error`: every call during the fault is refused (an error); nothing is admitted.
    Error,
    /// `allow`: every call during the fault is admitted.
    Allow,
    /// `local`: calls are decided on in-process counters holding `share` per window.
    Local {
        /// The local share of the limit (limit / BACKEND_FALLBACK_REPLICAS).
        share: u64,
    },
}

/// A fault and what the checker must allow for it.
#[derive(Clone, Debug)]
pub struct Fault {
    /// The fault's name, for the report.
    pub name: String,
    /// When it was made (µs since the epoch).
    pub started: u64,
    /// When it was healed (the store answering again).
    pub healed: u64,
    /// The failure mode's promise.
    pub promise: Promise,
    /// Whether the store loses its counters (a restart without persistence): a window
    /// that spans the loss may admit its limit again.
    pub loses_counters: bool,
    /// How long after the heal the service may take to use the store again (the
    /// breaker's open duration and the reconnect).
    pub settle: u64,
}

/// The limit, the callers' deadline and the margin a call may take beyond it.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Requests per window and key.
    pub limit: u64,
    /// The `grpc-timeout` of every call (µs).
    pub deadline: u64,
    /// Allowed beyond the deadline (µs): the machine is shared.
    pub margin: u64,
}

/// What the checker measured.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    /// Calls in the history.
    pub calls: usize,
    /// Calls per second over the history.
    pub rate: u64,
    /// Admitted beyond the limit, summed over keys and windows, outside the fault.
    pub over_outside: u64,
    /// Admitted beyond the limit, summed over keys and windows that meet the fault.
    pub over_during: u64,
    /// The most admitted in one window of one key that meets the fault.
    pub worst_window: u64,
    /// The longest call (µs).
    pub worst_latency: u64,
    /// Calls answered with an error.
    pub errors: usize,
    /// From the heal to the first window from which every answer is exact (µs).
    pub heal: u64,
}

impl fmt::Display for Measured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} calls ({}/s), {} errors; admitted over the limit: {} outside the fault, {} in windows meeting it (worst window {}); worst latency {} ms; exact again {} ms after the heal",
            self.calls,
            self.rate,
            self.errors,
            self.over_outside,
            self.over_during,
            self.worst_window,
            self.worst_latency / 1_000,
            self.heal / 1_000
        )
    }
}

/// Checks `history` against `bounds` and `fault`: every broken promise, or what was
/// measured.
pub fn check(history: &[Call], bounds: Bounds, fault: &Fault) -> Result<Measured, Vec<String>> {
    let mut broken = Vec::new();
    let mut measured = Measured {
        calls: history.len(),
        errors: history
            .iter()
            .filter(|c| matches!(c.answer, Answer::Error(_)))
            .count(),
        ..Measured::default()
    };
    if let (Some(first), Some(last)) = (history.first(), history.last()) {
        measured.rate = history.len() as u64 * WINDOW / (last.end - first.start).max(1);
    }
    latencies(history, bounds, &mut measured, &mut broken);
    windows(history, bounds, fault, &mut measured, &mut broken);
    promise(history, fault, &mut broken);
    heal(history, bounds, fault, &mut measured, &mut broken);
    if broken.is_empty() {
        Ok(measured)
    } else {
        broken.push(format!("measured: {measured}"));
        Err(broken)
    }
}

/// No call longer than its deadline and the margin.
fn latencies(history: &[Call], bounds: Bounds, measured: &mut Measured, broken: &mut Vec<String>) {
    for call in history {
        let took = call.end - call.start;
        measured.worst_latency = measured.worst_latency.max(took);
        if took > bounds.deadline + bounds.margin && broken.len() < 20 {
            broken.push(format!(
                "a call took {} ms (deadline {} ms): {call:?}",
                took / 1_000,
                bounds.deadline / 1_000
            ));
        }
    }
}

/// Admitted calls that surely fell in each window (sent and answered inside it), by key
/// and window start.
fn admitted_inside(history: &[Call]) -> BTreeMap<(u32, u64), u64> {
    let mut counts = BTreeMap::new();
    for call in history.iter().filter(|c| c.answer == Answer::Ok) {
        let window = call.start / WINDOW;
        if call.end / WINDOW == window {
            *counts.entry((call.key, window)).or_default() += 1;
        }
    }
    counts
}

/// Per key and window, admitted ≤ limit, or ≤ the fault's bound in windows that meet it.
fn windows(
    history: &[Call],
    bounds: Bounds,
    fault: &Fault,
    measured: &mut Measured,
    broken: &mut Vec<String>,
) {
    let (first, last) = (
        fault.started / WINDOW,
        (fault.healed + fault.settle) / WINDOW,
    );
    let lost = if fault.loses_counters {
        bounds.limit
    } else {
        0
    };
    for ((key, window), admitted) in admitted_inside(history) {
        let during = (first..=last).contains(&window);
        let bound = match (during, fault.promise) {
            (false, _) => bounds.limit,
            (true, Promise::Allow) => u64::MAX,
            (true, Promise::Error) => bounds.limit + lost,
            (true, Promise::Local { share }) => bounds.limit + share + lost,
        };
        let over = admitted.saturating_sub(bounds.limit);
        if during {
            measured.over_during += over;
            measured.worst_window = measured.worst_window.max(admitted);
        } else {
            measured.over_outside += over;
        }
        if admitted > bound && broken.len() < 20 {
            broken.push(format!(
                "key {key} admitted {admitted} in the window at {window} s (bound {bound}; fault from {} to {} s)",
                fault.started / WINDOW,
                fault.healed / WINDOW
            ));
        }
    }
}

/// No error before the fault; while it holds (from a moment after it is made to the
/// heal), the failure mode's own answer: `error` refuses, `allow` admits, `local` answers from its share.
fn promise(history: &[Call], fault: &Fault, broken: &mut Vec<String>) {
    // Calls sent in the first 200 ms may have been answered by the store already.
    let inside = |c: &&Call| c.start >= fault.started + 200_000 && c.end <= fault.healed;
    let mut local: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for call in history.iter().filter(|c| c.end < fault.started) {
        if matches!(call.answer, Answer::Error(_)) && broken.len() < 20 {
            broken.push(format!("an error before the fault: {call:?}"));
        }
    }
    for call in history.iter().filter(inside) {
        let kept = match (fault.promise, call.answer) {
            (Promise::Error, Answer::Error(_)) | (Promise::Allow, Answer::Ok) => true,
            (Promise::Local { .. }, Answer::Ok) => {
                // Counted in a window when sent and answered inside it (a call sent at
                // a window's end may be decided in the next).
                if call.end / WINDOW == call.start / WINDOW {
                    *local.entry((call.key, call.start / WINDOW)).or_default() += 1;
                }
                true
            }
            (Promise::Local { .. }, Answer::Over) => true,
            _ => false,
        };
        if !kept && broken.len() < 20 {
            broken.push(format!(
                "during the fault ({:?}) a call got {:?}: {call:?}",
                fault.promise, call.answer
            ));
        }
    }
    if let Promise::Local { share } = fault.promise {
        for ((key, window), admitted) in local {
            if admitted > share && broken.len() < 20 {
                broken.push(format!(
                    "key {key} admitted {admitted} locally in the window at {window} s (share {share})"
                ));
            }
        }
    }
}

/// After the heal (and the settling time), from some window on every window is exact:
/// no errors, no key over its limit, and each hot key admitted its whole limit. That
/// window must start within one window of the settling time.
fn heal(
    history: &[Call],
    bounds: Bounds,
    fault: &Fault,
    measured: &mut Measured,
    broken: &mut Vec<String>,
) {
    let Some(last) = history.last() else {
        return;
    };
    // The last whole window of the history.
    let end = last.start / WINDOW;
    let inexact = inexact_windows(history, bounds.limit);
    let first = fault.healed.div_ceil(WINDOW);
    let exact_from = |window: u64| inexact.range(window..end).next().is_none();
    let Some(window) = (first..end).find(|&w| exact_from(w)) else {
        broken.push(format!(
            "never exact again after the heal at {} s (history ends at {end} s)",
            fault.healed / WINDOW
        ));
        return;
    };
    measured.heal = (window * WINDOW).saturating_sub(fault.healed);
    let allowed = fault.settle + 2 * WINDOW;
    if measured.heal > allowed {
        broken.push(format!(
            "exact again only {} ms after the heal (allowed {} ms)",
            measured.heal / 1_000,
            allowed / 1_000
        ));
    }
}

/// Windows with an error, a key admitted over the limit, or a key refused before it
/// admitted its whole limit (counting the admitted calls that touch the window, which
/// include those spanning its edges).
fn inexact_windows(history: &[Call], limit: u64) -> std::collections::BTreeSet<u64> {
    let mut touching: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for call in history.iter().filter(|c| c.answer == Answer::Ok) {
        for window in call.start / WINDOW..=call.end / WINDOW {
            *touching.entry((call.key, window)).or_default() += 1;
        }
    }
    let mut inexact = std::collections::BTreeSet::new();
    for call in history {
        let window = call.start / WINDOW;
        let wrong = match call.answer {
            Answer::Error(_) => true,
            Answer::Over => touching.get(&(call.key, window)).copied().unwrap_or(0) < limit,
            Answer::Ok => false,
        };
        if wrong {
            inexact.insert(window);
        }
    }
    for (&(_, window), &admitted) in &admitted_inside(history) {
        if admitted > limit {
            inexact.insert(window);
        }
    }
    inexact
}
