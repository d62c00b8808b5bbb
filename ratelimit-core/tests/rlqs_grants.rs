//! The Rate Limit Quota Service's share policy (`ratelimit_core::grants`) against a model
//! of one window: Envoys that enforce their token buckets (no refill; a resized bucket
//! keeps at most what it had left), admit a bucket's first request before they have an
//! assignment, report at once for a new bucket and then every `REPORT` ticks (each at its
//! own phase), and a counter that grants only what fits under the limit. Envoys start at
//! different ticks, so joiners arrive between the others' reports, while those have
//! admitted requests they have not reported.
//!
//! When an Envoy joins, the policy is told what each other Envoy admitted since its last
//! report. The first properties give it the truth (the model knows it), to check the
//! policy itself:
//! - never more than the limit plus one request per Envoy (the first, admitted before its
//!   assignment) is admitted, however many join and whatever they admitted unreported;
//! - while every Envoy's requests stay within its even share, none is denied;
//! - an Envoy that keeps being denied one report after the report that showed its
//!   denials is denied only because the window has nothing left: the counter is full and
//!   every other Envoy holds no more than its own demand (or its even share, when it just
//!   started).
//!
//! The sidecar can only project it, from the Envoy's last report's rate (its first
//! report has none: a request in 0 s, taken as one in 5 s). The last property gives the
//! policy that projection, and checks that what is admitted beyond the limit plus one
//! request per Envoy is at most, per Envoy, the most its projection fell short of what it
//! had admitted at a join: a sum over Envoys, not over joins. Envoys that joined between
//! reports at a steady rate, after the others' first reports, cost nothing more.

use proptest::prelude::*;
use ratelimit_core::grants::{self, Ask, Holding, Moment, Split, Tokens};

/// Ticks in the window (a tick is a second).
const WINDOW: u64 = 60;
/// Ticks between two reports of an Envoy.
const REPORT: u64 = 5;
/// The time a report took, as the sidecar takes it when Envoy says 0 s (a bucket's first
/// report): milliseconds.
const DEFAULT_ELAPSED: u64 = REPORT * 1_000;

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
    /// Its last report's requests (allowed and denied) and the milliseconds they took.
    last_rate: (u64, u64),
    /// The most a projection of what it admitted since its last report fell short of the
    /// truth when its bucket was sized from it (a join or a top-up).
    shortfall: u64,
    /// It started short of its even share and has not reported or topped up to it since:
    /// it takes quota others give back.
    short: bool,
}

struct Window {
    split: Split,
    /// Envoys in the run; `split.envoys` counts those started, as the service counts
    /// open streams.
    all: u64,
    /// The policy is told what an Envoy admitted since its last report as the sidecar
    /// projects it (`false`: the truth).
    projected: bool,
    /// Requests that Envoys giving quota back to a joiner had admitted since their last
    /// report (what a bucket counted from the reported usage would admit again).
    unreported: u64,
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
            projected: false,
            unreported: 0,
            reserved: 0,
            skewed: false,
            envoys,
            admitted: 0,
            denials: 0,
        }
    }

    /// The same window, with what Envoys admitted since their last report projected.
    fn projected(mut self) -> Window {
        self.projected = true;
        self
    }

    /// Over-admission the policy may cost: for each Envoy, the most its projected
    /// spending fell short.
    fn slack(&self) -> u64 {
        self.envoys.iter().map(|envoy| envoy.shortfall).sum()
    }

    /// What Envoy `j` admitted since its last report, as the policy is told it at `now`.
    fn spent(&self, j: usize, now: u64) -> u64 {
        let envoy = &self.envoys[j];
        if !self.projected {
            return envoy.allowed;
        }
        let (requests, elapsed) = envoy.last_rate;
        grants::need(requests, elapsed, (now - envoy.last_report) * 1_000)
    }

    /// The model's own reading of the policy: what an Envoy may hold after an answer.
    fn entitlement(&self, holding: Holding, moment: Moment) -> u64 {
        let even = self.split.even();
        let Moment::Report { denied, need } = moment else {
            let spent = match moment {
                Moment::Joined { spent } | Moment::TopUp { spent } => spent,
                _ => 0,
            };
            return even.max(holding.used + spent);
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
            Tokens::Scaled(tokens) => {
                envoy.tokens = envoy.tokens.map(|left| left.min(tokens));
            }
        }
        if let Moment::Joined { spent } | Moment::TopUp { spent } = moment
            && done > 0
        {
            envoy.shortfall = envoy.shortfall.max(envoy.allowed.saturating_sub(spent));
        }
        envoy.entitled = entitled;
        // Quota given to a joiner leaves it short as surely as a full counter does.
        envoy.starved_at_answer = match moment {
            Moment::Joined { .. } => envoy.starved_at_answer || done > 0,
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
                envoy.last_rate = (1, DEFAULT_ELAPSED);
                self.split.envoys += 1;
                self.answer(i, Moment::Start);
                let short = self.envoys[i].holding.granted < self.split.even();
                self.envoys[i].short = short;
                if short {
                    self.join(i, now);
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

    /// Envoy `i` started short at `now`: the others give back what they surely have not
    /// spent above their even shares, then it tops up, and so do those that started short
    /// before it when anything was given back (as streams are told to take it).
    fn join(&mut self, i: usize, now: u64) {
        let before = self.reserved;
        for j in 0..self.envoys.len() {
            if j != i && self.envoys[j].tokens.is_some() {
                let spent = self.spent(j, now);
                let reserved = self.reserved;
                self.answer(j, Moment::Joined { spent });
                if self.reserved < reserved {
                    self.unreported += self.envoys[j].allowed;
                }
            }
        }
        let given = self.reserved < before;
        let others = (0..self.envoys.len()).filter(|&k| k != i && given);
        for k in std::iter::once(i).chain(others) {
            if self.envoys[k].short {
                let spent = self.spent(k, now);
                self.answer(k, Moment::TopUp { spent });
                let short = self.envoys[k].holding.granted < self.split.even();
                self.envoys[k].short = short;
            }
        }
    }

    /// A denial one report after the one that showed denials: only for want of quota
    /// (checked when the policy is told the truth: a projection above it leaves a bucket
    /// short of its grant until the next report).
    fn check_denial(&self, i: usize) {
        let envoy = &self.envoys[i];
        if self.projected || envoy.reports_since_denied.is_none_or(|n| n < 1) {
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
        envoy.last_rate = (allowed + denied, elapsed);
        envoy.short = false;
        let left = (WINDOW - now - 1) * 1_000;
        let need = grants::need(allowed + denied, elapsed, left).max(grants::need(
            envoy.requested,
            (now + 1 - envoy.first) * 1_000,
            left,
        ));
        let denied = grants::denials(envoy.holding, denied);
        envoy.reports_since_denied = match envoy.reports_since_denied {
            Some(n) => Some(n + 1),
            None if denied > 0 => Some(0),
            None => None,
        };
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
                self.admitted <= self.split.limit + self.all + self.slack(),
                "{} admitted, {} slack",
                self.admitted,
                self.slack()
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
        prop_assert!(window.admitted <= split.limit + phases.len() as u64);
    }

    /// Envoys at steady rates starting at any tick, with the policy told what the sidecar
    /// projects: `run` holds them to the limit, one request each and each Envoy's largest
    /// shortfall of projection.
    #[test]
    fn joiners_between_reports_cost_at_most_each_envoys_shortfall_of_projection(
        (split, phases) in split_and_phases(),
        rates in proptest::collection::vec((1u64..=3, 0..WINDOW), 4),
    ) {
        let mut window = Window::new(split, &phases).projected();
        window.run(|i, now| {
            let (rate, start) = rates[i];
            if now >= start { rate } else { 0 }
        });
        let bound = split.limit + phases.len() as u64 + window.slack();
        prop_assert!(window.admitted <= bound);
    }
}

/// The case, measured: heavy Envoys (far above the limit together) join one after
/// another between the others' reports, each after the others have reported a rate. At
/// every join the others had admitted requests they had not reported; a bucket counted
/// from the reported usage would admit those again, once per joiner. Projected from the
/// last report's rate, they are not: the limit holds to one request per Envoy.
#[test]
fn heavy_envoys_joining_between_reports_are_held_to_the_limit() {
    let split = Split {
        limit: 60,
        envoys: 4,
    };
    let mut window = Window::new(split, &[0; 4]).projected();
    window.run(|i, now| if now >= 7 * i as u64 { 2 } else { 0 });
    assert!(
        window.unreported > 0,
        "Envoys gave quota back with unreported requests"
    );
    assert!(
        window.admitted <= split.limit + 4,
        "{} admitted of {}",
        window.admitted,
        split.limit
    );
    assert!(window.admitted >= split.limit, "the limit is used");
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
        split.limit,
        "the heavy Envoy used all the light one does not hold for its demand"
    );
    let heavy = &window.envoys[0];
    assert!(heavy.holding.granted > split.even(), "{heavy:?}");
}
