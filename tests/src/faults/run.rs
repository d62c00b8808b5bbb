//! One fault under load: the load started on its target, the fault made after the
//! schedule's first phase and healed after the second, the history checked, and the
//! report's row written. What a test adds is how to make and heal its fault, and what
//! it checks after (the breaker's statistics, health, memory).

use std::future::Future;
use std::time::Duration;

use super::check::{Bounds, Fault, Measured, Promise, check};
use super::load::{Call, Load, Profile, Target, now_us};
use super::{Schedule, report, rss_kib};
use crate::eventually;
use crate::sidecar::Server;

/// Resident memory may end this much above where it was before the fault.
pub const RSS_GROWTH_KIB: u64 = 32 * 1024;

/// What a fault's run saw.
pub struct Timed {
    /// Every call, by start time.
    pub history: Vec<Call>,
    /// When the fault was made (µs since the epoch).
    pub started: u64,
    /// The first moment at which it may have been healed.
    pub healed: u64,
    /// When the heal was seen done (the restarted process listening, the promotion
    /// seen).
    pub back: u64,
    /// The resident memory of the watched process just before the fault (KiB).
    pub rss_before: Option<u64>,
}

impl Timed {
    /// The fault's `(started, healed)`.
    pub fn times(&self) -> (u64, u64) {
        (self.started, self.healed)
    }

    /// The settling allowed after the heal: from its first possible moment to when it
    /// was seen done, then the breaker's open duration `open` and half a second to
    /// reconnect.
    pub fn settle(&self, open: Duration) -> u64 {
        self.back - self.healed + micros(open + Duration::from_millis(500))
    }
}

/// Runs `profile` on `target` for the schedule's first phase, then `make`s the fault,
/// waits the schedule's second phase (zero when `heal` itself waits for the heal) and
/// `heal`s it, and runs the last phase. `heal` returns the first moment at which the
/// fault may have been over (µs since the epoch): when a restart began, or the last
/// time a poll saw the fault still there ([`last_seen`]). `watch`: the pid whose memory
/// is read before the fault.
pub async fn around<M, MF, H, HF>(
    target: Target,
    profile: Profile,
    schedule: Schedule,
    watch: Option<u32>,
    make: M,
    heal: H,
) -> Timed
where
    M: FnOnce() -> MF,
    MF: Future<Output = ()>,
    H: FnOnce() -> HF,
    HF: Future<Output = u64>,
{
    let load = Load::start(target, profile).await;
    tokio::time::sleep(schedule.before).await;
    let rss_before = watch.map(rss_kib);
    let started = now_us();
    make().await;
    tokio::time::sleep(schedule.fault).await;
    let healed = heal().await;
    let back = now_us();
    tokio::time::sleep(schedule.after).await;
    Timed {
        history: load.stop().await,
        started,
        healed,
        back,
        rss_before,
    }
}

/// Polls `over` every 50 ms until it holds (panics with `what` after `timeout`); the
/// last time it did not: the fault was over after it.
pub async fn last_seen<F, Fut>(timeout: Duration, what: &str, mut over: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    // The fault may have ended at any moment after the start of the last poll that still
    // saw it (or, when the first poll sees it over, after the polling began).
    let mut seen = now_us();
    loop {
        let polled = now_us();
        if over().await {
            return seen;
        }
        seen = polled;
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Microseconds in `duration`.
pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap()
}

/// Checks `timed` against `fault` with the limit `limit`, the callers' `deadline` and a
/// `margin` beyond it; panics with every broken promise and `server`'s log.
pub fn checked(
    timed: &Timed,
    fault: &Fault,
    (limit, deadline, margin): (u32, Duration, Duration),
    server: &Server,
) -> Measured {
    let bounds = Bounds {
        limit: u64::from(limit),
        deadline: micros(deadline),
        margin: micros(margin),
    };
    check(&timed.history, bounds, fault)
        .unwrap_or_else(|broken| panic!("{}:\n{}\n{}", fault.name, broken.join("\n"), server.log()))
}

/// Which breakers a fault opens, for [`healed_and_reported`].
#[derive(Clone, Copy, Debug)]
pub enum Breakers<'a> {
    /// None (the store is not behind a breaker, or the sidecar itself restarted).
    None,
    /// The store `.0`'s: opened during the fault, closed after it.
    Of(&'a str),
    /// The store `.0`'s, for a node that leaves the node map with its breaker open (a
    /// cluster master failed over, a memcached node replaced in its SRV record): that
    /// breaker opened during the fault and is forgotten with the node, not necessarily
    /// closed; health is 200 again all the same.
    NodeLeft(&'a str),
}

/// After the run: `/healthcheck` answers 200 again within 5 s, resident memory ended
/// within [`RSS_GROWTH_KIB`] of where it was before the fault (when it was read), and
/// the breakers opened and closed (but see [`Breakers::NodeLeft`]). Writes the report's
/// row.
pub async fn healed_and_reported(
    server: &Server,
    timed: &Timed,
    fault: &Fault,
    measured: &Measured,
    breakers: Breakers<'_>,
) {
    let name = &fault.name;
    let healthy = eventually(Duration::from_secs(5), || async {
        reqwest::get(server.http_url("/healthcheck"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(
        healthy,
        "{name}: unhealthy after the heal\n{}",
        server.log()
    );
    let mut row = format!("| {name} | {:?} | {measured}", fault.promise);
    if let Some(before) = timed.rss_before {
        let after = rss_kib(server.pid());
        assert!(
            after <= before + RSS_GROWTH_KIB,
            "{name}: resident memory {before} KiB before the fault, {after} KiB at the end"
        );
        row.push_str(&format!("; RSS {before} → {after} KiB"));
    }
    if let Breakers::Of(store) | Breakers::NodeLeft(store) = breakers {
        let stats = server.stats().await;
        let stat = |what: &str| {
            let name = format!("ratelimit.{store}.breaker_{what}");
            stats.get(&name).copied().unwrap_or(0)
        };
        let (opened, closed) = (stat("opened"), stat("closed"));
        let left = matches!(breakers, Breakers::NodeLeft(_));
        assert!(
            opened >= 1 && (closed >= 1 || left),
            "{name}: breaker opened {opened}, closed {closed}"
        );
        row.push_str(&format!("; breaker opened {opened}, closed {closed}"));
    }
    report(&format!("{row} |"));
}

/// A fault on the store, for [`Fault::new`]: `lost` when it loses its counters.
pub fn store_fault(
    name: &str,
    promise: Promise,
    timed: &Timed,
    open: Duration,
    lost: bool,
) -> Fault {
    Fault {
        loses_counters: lost,
        ..Fault::new(name, promise, timed.times(), timed.settle(open))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use super::*;

    /// The moment returned is the start of the last poll that still saw the fault, not
    /// the later one that saw it over: calls between the two may already see it healed.
    #[tokio::test]
    async fn the_heal_may_have_come_right_after_the_last_poll_that_saw_the_fault() {
        let polls = AtomicU32::new(0);
        let last_unhealed = AtomicU64::new(0);
        let healed = last_seen(Duration::from_secs(5), "healed", || async {
            let started = now_us();
            let over = polls.fetch_add(1, Ordering::SeqCst) == 2;
            if !over {
                last_unhealed.store(started, Ordering::SeqCst);
            }
            over
        })
        .await;
        assert!(healed <= last_unhealed.load(Ordering::SeqCst));
        assert!(
            healed + 40_000 >= last_unhealed.load(Ordering::SeqCst),
            "not earlier"
        );
    }
}
