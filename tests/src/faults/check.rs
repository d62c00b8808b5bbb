//! The checker: reads a load's history and the fault's times and says whether the
//! limiter kept its promises, and what it measured.

use std::collections::{BTreeMap, BTreeSet};
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
    /// The fault must not show: every call is decided exactly, as if nothing happened
    /// (a certificate rotated, a rule source away, a slot migrating).
    Exact,
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
    /// Whether the fault takes away only some of the store (a memcached node, a cluster
    /// master): then, per key and window, the calls either all get the failure mode's
    /// answer (the key's counter is on the lost part) or are all decided exactly.
    pub partial: bool,
    /// The limit after the heal, when the fault changes the rules: windows from the
    /// heal's settling on are held to it, windows meeting the change to the larger.
    pub limit_after: Option<u64>,
}

impl Fault {
    /// A fault called `name`, made at `started` and healed at `healed`, holding
    /// `promise` and settling within `settle` µs; whole, keeping counters and rules.
    pub fn new(name: &str, promise: Promise, (started, healed): (u64, u64), settle: u64) -> Fault {
        Fault {
            name: name.to_owned(),
            started,
            healed,
            promise,
            loses_counters: false,
            settle,
            partial: false,
            limit_after: None,
        }
    }

    /// The limit of the window starting at `window` s.
    fn limit_at(&self, limit: u64, window: u64) -> u64 {
        let Some(after) = self.limit_after else {
            return limit;
        };
        if window * WINDOW >= self.healed + self.settle {
            after
        } else if (window + 1) * WINDOW > self.healed {
            limit.max(after)
        } else {
            limit
        }
    }
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
    /// A partial fault: the keys' windows during it that failed wholly, and those
    /// decided exactly.
    pub split: Option<(u64, u64)>,
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
        )?;
        if let Some((failed, kept)) = self.split {
            write!(
                f,
                "; key windows during the fault: {failed} failed, {kept} exact"
            )?;
        }
        Ok(())
    }
}

/// Checks `history` against `bounds` and `fault`: every broken promise, or what was
/// measured.
pub fn check(history: &[Call], bounds: Bounds, fault: &Fault) -> Result<Measured, Vec<String>> {
    let mut broken = Vec::new();
    let mut measured = Measured {
        calls: history.len(),
        errors: history.iter().filter(|c| c.answer.failed()).count(),
        ..Measured::default()
    };
    if let (Some(first), Some(last)) = (history.first(), history.last()) {
        measured.rate = history.len() as u64 * WINDOW / (last.end - first.start).max(1);
    }
    latencies(history, bounds, &mut measured, &mut broken);
    windows(history, bounds, fault, &mut measured, &mut broken);
    promise(history, fault, &mut broken);
    if fault.partial {
        measured.split = Some(partial(history, fault, &mut broken));
    }
    if fault.promise == Promise::Exact {
        exact_during(history, bounds, fault, &mut broken);
    }
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
        let limit = fault.limit_at(bounds.limit, window);
        let bound = match (during, fault.promise) {
            (false, _) => limit,
            (true, Promise::Allow) => u64::MAX,
            (true, Promise::Error | Promise::Exact) => limit + lost,
            (true, Promise::Local { share }) => limit + share + lost,
        };
        let over = admitted.saturating_sub(limit);
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
        if call.answer.failed() && broken.len() < 20 {
            broken.push(format!("an error before the fault: {call:?}"));
        }
    }
    for call in history.iter().filter(inside) {
        let kept = match (fault.promise, call.answer) {
            // A partial fault's promise is per key and window: [`partial`].
            _ if fault.partial => true,
            (Promise::Error, answer) => answer.failed(),
            (Promise::Allow, Answer::Ok) => true,
            (Promise::Exact, answer) => !answer.failed(),
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
    let inexact = inexact_windows(history, |window| fault.limit_at(bounds.limit, window));
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
fn inexact_windows(history: &[Call], limit: impl Fn(u64) -> u64) -> BTreeSet<u64> {
    let mut touching: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for call in history.iter().filter(|c| c.answer == Answer::Ok) {
        for window in call.start / WINDOW..=call.end / WINDOW {
            *touching.entry((call.key, window)).or_default() += 1;
        }
    }
    let mut inexact = BTreeSet::new();
    for call in history {
        let window = call.start / WINDOW;
        let wrong = match call.answer {
            Answer::Error(_) | Answer::Http(_) => true,
            Answer::Over => touching.get(&(call.key, window)).copied().unwrap_or(0) < limit(window),
            Answer::Ok => false,
        };
        if wrong {
            inexact.insert(window);
        }
    }
    for (&(_, window), &admitted) in &admitted_inside(history) {
        if admitted > limit(window) {
            inexact.insert(window);
        }
    }
    inexact
}

/// A partial fault: per key and window during it (calls sent and answered inside one
/// window), the calls all failed (the key's counter was on the lost part; the failure
/// mode `error` is the one used with partial faults) or none did. Both must happen: a
/// fault that took every key, or none, is not the fault the test meant. Returns the
/// counts of both.
fn partial(history: &[Call], fault: &Fault, broken: &mut Vec<String>) -> (u64, u64) {
    let inside = |c: &&Call| c.start >= fault.started + 200_000 && c.end <= fault.healed;
    // (failed, decided) per key and window.
    let mut groups: BTreeMap<(u32, u64), (u64, u64)> = BTreeMap::new();
    for call in history.iter().filter(inside) {
        let window = call.start / WINDOW;
        if call.end / WINDOW != window {
            continue;
        }
        let group = groups.entry((call.key, window)).or_default();
        if call.answer.failed() {
            group.0 += 1;
        } else {
            group.1 += 1;
        }
    }
    let (mut failed, mut kept) = (0, 0);
    for (&(key, window), &(errors, decided)) in &groups {
        match (errors, decided) {
            (_, 0) => failed += 1,
            (0, _) => kept += 1,
            _ if broken.len() < 20 => broken.push(format!(
                "key {key} in the window at {window} s: {errors} calls failed and {decided} were decided (a partial fault takes a key's window wholly or not at all)"
            )),
            _ => {}
        }
    }
    if (failed == 0 || kept == 0) && broken.len() < 20 {
        broken.push(format!(
            "a partial fault: {failed} key windows failed and {kept} were decided; both must happen"
        ));
    }
    (failed, kept)
}

/// A fault that must not show: no call failed, and every whole window of the history is
/// exact (no key over its limit, no key refused before its limit), but for those that
/// meet a change of the rules (from the heal to its settling).
fn exact_during(history: &[Call], bounds: Bounds, fault: &Fault, broken: &mut Vec<String>) {
    for call in history.iter().filter(|c| c.answer.failed()).take(10) {
        broken.push(format!("a call failed: {call:?}"));
    }
    let (Some(first), Some(last)) = (history.first(), history.last()) else {
        return;
    };
    let changing = |window: u64| {
        fault.limit_after.is_some()
            && window * WINDOW < fault.healed + fault.settle
            && (window + 1) * WINDOW > fault.healed
    };
    let inexact = inexact_windows(history, |window| fault.limit_at(bounds.limit, window));
    let whole = first.start.div_ceil(WINDOW)..last.start / WINDOW;
    for &window in inexact.range(whole).filter(|&&w| !changing(w)) {
        if broken.len() < 20 {
            broken.push(format!(
                "the window at {window} s was not exact (fault from {} to {} s)",
                fault.started / WINDOW,
                fault.healed / WINDOW
            ));
        }
    }
}
