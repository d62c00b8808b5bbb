//! The Rate Limit Quota Service's share policy (`ratelimit_core::grants`) against a model
//! of one window: Envoys that enforce their token buckets (no refill), admit a bucket's
//! first request before they have an assignment, report at once for a new bucket and
//! then every `REPORT` ticks (each at its own phase), and a counter that grants only what
//! fits under the limit.
//!
//! The promises checked:
//! - never more than the limit plus one request per Envoy (the first, admitted before its
//!   assignment) plus what Envoys that gave quota back to a joiner had admitted since
//!   their last report is admitted;
//! - while every Envoy's requests stay within its even share, none is denied;
//! - an Envoy that keeps being denied one report after the report that showed its
//!   denials is denied only because the window has nothing left: the counter is full and
//!   every other Envoy holds no more than its own demand (or its even share, when it just
//!   started).

use proptest::prelude::*;
use ratelimit_core::grants::{self, Ask, Holding, Moment, Split, Tokens};

/// Ticks in the window (a tick is a second).
const WINDOW: u64 = 60;
/// Ticks between two reports of an Envoy.
const REPORT: u64 = 5;

#[derive(Debug, Default)]
struct Envoy {
    /// Tokens left; `None` before the first assignment.
    tokens: Option<u64>,
    allowed: u64,
    denied: u64,
    /// Requests (allowed and denied) in the window, and the tick of its first.
    requested: u64,
    first: u64,
    denied_in_window: u64,
    last_report: u64,
    phase: u64,
    holding: Holding,
    /// What the policy lets it hold, as of its last answer.
    entitled: u64,
    /// Reports since the first that showed denials, if one did.
    reports_since_denied: Option<u32>,
    /// The counter was full after its last answer.
    starved_at_answer: bool,
}

struct Window {
    split: Split,
    /// Envoys in the run; `split.envoys` counts those started, as the service counts
    /// open streams.
    all: u64,
    /// Over-admission allowed by give-backs to joiners.
    slack: u64,
    reserved: u64,
    skewed: bool,
    envoys: Vec<Envoy>,
    admitted: u64,
    denials: u64,
}

impl Window {
    fn new(split: Split, phases: &[u64]) -> Window {
        let envoys = phases
            .iter()
            .map(|&phase| Envoy {
                phase,
                ..Envoy::default()
            })
            .collect();
        Window {
            split: Split { envoys: 0, ..split },
            all: split.envoys,
            slack: 0,
            reserved: 0,
            skewed: false,
            envoys,
            admitted: 0,
            denials: 0,
        }
    }

    /// The model's own reading of the policy: what an Envoy may hold after an answer.
    fn entitlement(&self, holding: Holding, moment: Moment) -> u64 {
        let even = self.split.even();
        let Moment::Report { denied, need } = moment else {
            return even.max(holding.used);
        };
        let demand = (holding.used + need + need / 4 + 1).min(self.split.limit.max(holding.used));
        if denied > 0 || !self.skewed {
            demand.max(even)
        } else {
            demand
        }
    }

    fn answer(&mut self, i: usize, moment: Moment) {
        if matches!(moment, Moment::Report { denied, .. } if denied > 0) {
            self.skewed = true;
        }
        let holding = self.envoys[i].holding;
        let ask = grants::ask(self.split, holding, moment);
        let done = match ask {
            Ask::Keep => 0,
            Ask::Reserve(more) => {
                let got = more.min(self.split.limit - self.reserved);
                self.reserved += got;
                got
            }
            Ask::Release { now, skewed } => {
                let give = now + if self.skewed { skewed } else { 0 };
                self.reserved -= give;
                give
            }
        };
        let entitled = self.entitlement(holding, moment);
        let envoy = &mut self.envoys[i];
        match grants::settle(&mut envoy.holding, moment, ask, done) {
            Tokens::Same => {}
            Tokens::Fresh(tokens) => envoy.tokens = Some(tokens),
            Tokens::Scaled(_) => panic!("no reload in the model"),
        }
        envoy.entitled = entitled;
        // Quota given to a joiner leaves it short as surely as a full counter does.
        envoy.starved_at_answer = match moment {
            Moment::Joined => envoy.starved_at_answer || done > 0,
            _ => self.reserved == self.split.limit,
        };
        assert!(envoy.holding.granted <= entitled.max(envoy.holding.used));
    }

    fn request(&mut self, i: usize, now: u64) {
        let envoy = &mut self.envoys[i];
        match envoy.tokens {
            None => {
                self.admitted += 1;
                envoy.holding.used += 1;
                envoy.requested = 1;
                envoy.first = now;
                envoy.last_report = now;
                self.split.envoys += 1;
                self.answer(i, Moment::Start);
                if self.envoys[i].holding.granted < self.split.even() {
                    self.join(i);
                }
            }
            Some(0) => {
                envoy.denied += 1;
                envoy.denied_in_window += 1;
                envoy.requested += 1;
                self.denials += 1;
                self.check_denial(i);
            }
            Some(tokens) => {
                envoy.tokens = Some(tokens - 1);
                envoy.allowed += 1;
                envoy.requested += 1;
                self.admitted += 1;
            }
        }
    }

    /// Envoy `i` started short: the others give back above their even shares, then it
    /// tops up.
    fn join(&mut self, i: usize) {
        for j in 0..self.envoys.len() {
            if j != i && self.envoys[j].tokens.is_some() {
                self.slack += self.envoys[j].allowed;
                self.answer(j, Moment::Joined);
            }
        }
        self.answer(i, Moment::TopUp);
    }

    /// A denial one report after the one that showed denials: only for want of quota.
    fn check_denial(&self, i: usize) {
        let envoy = &self.envoys[i];
        if envoy.reports_since_denied.is_none_or(|n| n < 1) {
            return;
        }
        assert!(
            envoy.starved_at_answer,
            "Envoy {i} denied while its last answer left quota in the counter"
        );
        for (j, other) in self.envoys.iter().enumerate() {
            if j != i && other.tokens.is_some() {
                assert!(
                    other.holding.granted <= other.entitled.max(self.split.even()),
                    "Envoy {i} denied while Envoy {j} holds {} of which it is entitled to {}",
                    other.holding.granted,
                    other.entitled
                );
            }
        }
    }

    fn report(&mut self, i: usize, now: u64) {
        let envoy = &mut self.envoys[i];
        let (allowed, denied) = (envoy.allowed, envoy.denied);
        let elapsed = (now - envoy.last_report) * 1_000;
        envoy.holding.used += allowed;
        envoy.allowed = 0;
        envoy.denied = 0;
        envoy.last_report = now;
        envoy.reports_since_denied = match envoy.reports_since_denied {
            Some(n) => Some(n + 1),
            None if denied > 0 => Some(0),
            None => None,
        };
        let left = (WINDOW - now - 1) * 1_000;
        let need = grants::need(allowed + denied, elapsed, left).max(grants::need(
            envoy.requested,
            (now + 1 - envoy.first) * 1_000,
            left,
        ));
        self.answer(i, Moment::Report { denied, need });
    }

    /// Runs the window: `demand(i, tick)` requests of Envoy `i` at each tick.
    fn run(&mut self, demand: impl Fn(usize, u64) -> u64) {
        for now in 0..WINDOW {
            for i in 0..self.envoys.len() {
                for _ in 0..demand(i, now) {
                    self.request(i, now);
                }
            }
            for i in 0..self.envoys.len() {
                let envoy = &self.envoys[i];
                if envoy.tokens.is_some()
                    && now > envoy.last_report
                    && (now + envoy.phase).is_multiple_of(REPORT)
                {
                    self.report(i, now);
                }
            }
            assert!(
                self.admitted <= self.split.limit + self.all + self.slack,
                "{} admitted, {} slack",
                self.admitted,
                self.slack
            );
        }
    }
}

fn split_and_phases() -> impl Strategy<Value = (Split, Vec<u64>)> {
    (1u64..=60, proptest::collection::vec(0..REPORT, 1..=4)).prop_map(|(limit, phases)| {
        let split = Split {
            limit,
            envoys: phases.len() as u64,
        };
        (split, phases)
    })
}

proptest! {
    #[test]
    fn spread_traffic_within_even_shares_is_never_denied(
        (split, phases) in split_and_phases(),
        pattern in proptest::collection::vec(proptest::collection::vec(0u64..=2, WINDOW as usize), 4),
    ) {
        // Each Envoy's requests, cut off at its even share.
        let even = split.even();
        let mut cut = pattern;
        for ticks in &mut cut {
            let mut left = even;
            for n in ticks.iter_mut() {
                *n = (*n).min(left);
                left -= *n;
            }
        }
        let mut window = Window::new(split, &phases);
        window.run(|i, now| cut[i][now as usize]);
        prop_assert_eq!(window.denials, 0);
    }

    #[test]
    fn skewed_demand_is_denied_only_for_want_of_quota_one_report_later(
        (split, phases) in split_and_phases(),
        rates in proptest::collection::vec((0u64..=3, 0..WINDOW), 4),
    ) {
        let mut window = Window::new(split, &phases);
        window.run(|i, now| {
            let (rate, start) = rates[i];
            if now >= start { rate } else { 0 }
        });
        prop_assert!(window.admitted <= split.limit + phases.len() as u64 + window.slack);
    }
}

/// The case: a heavy Envoy and a light one. The heavy one runs dry at its even
/// share; the light one gives back what it does not need at its next report, and the
/// heavy one has it at the report after the one that showed its denials.
#[test]
fn a_heavy_envoy_gets_what_a_light_one_does_not_need_within_one_report() {
    let split = Split {
        limit: 20,
        envoys: 2,
    };
    let mut window = Window::new(split, &[0, 2]);
    window.run(|i, now| match i {
        0 => 2,
        _ => u64::from(now.is_multiple_of(10)),
    });
    let light = &window.envoys[1];
    assert_eq!(
        light.denied_in_window, 0,
        "the light one never denied: {light:?}"
    );
    let light_used = light.holding.used + light.allowed;
    assert_eq!(light_used, 6);
    assert_eq!(
        window.admitted + (light.holding.granted - light_used),
        split.limit + window.slack,
        "the heavy Envoy used all the light one does not hold for its demand"
    );
    let heavy = &window.envoys[0];
    assert!(heavy.holding.granted > split.even(), "{heavy:?}");
}
