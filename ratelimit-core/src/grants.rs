//! How the Rate Limit Quota Service hands one bucket's window quota to the Envoys that
//! share it. The service reserves every grant in the rule's window counter before the
//! Envoy may spend it, so the Envoys of every replica together never hold more than the
//! limit; this module decides how much each Envoy asks for and gives back, and what its
//! token bucket is told. The I/O (the counter, the stream) is the caller's.
//!
//! The policy, for a limit `L` shared by `n` Envoys (an even share is `L / n`, rounded
//! down):
//! - **Start** (an Envoy's first report of a bucket, and every window boundary): it is
//!   granted its even share, or what the counter has left when that is less, less what it
//!   admitted before it had an assignment.
//! - **A report with denials** (its bucket ran dry, and buckets never refill by
//!   themselves): it asks for what its demand needs for the rest of the window (at least
//!   its even share) and gets what the counter has left, as a new bucket holding exactly
//!   the increase.
//! - **A report without denials**: a grant above what its demand needs is given back, down
//!   to its even share; when the window is *skewed* (some Envoy reported denials in it)
//!   down to what its demand needs, so that the Envoy that ran dry finds it at its next
//!   report. What it keeps becomes a new bucket of what is left of it. An Envoy that
//!   reported denials earlier in the window and holds less than its demand needs asks for
//!   the rest, as at a report with denials: its bucket may have run dry just as it
//!   reported, and it would otherwise deny for a reporting interval while the counter has
//!   room that others gave back.
//! - **Another Envoy joins** and its start found the counter short of its even share:
//!   every Envoy of the bucket gives back at once what it surely has not spent above its
//!   even share (of the Envoys there are now): it keeps its even share, or what it
//!   reported used plus what it is projected to have admitted since that report (its
//!   last report's rate over the time since), whichever is more. Its bucket is resized,
//!   never refilled, to what it keeps less that used and projected ([`Tokens::Scaled`]:
//!   Envoy keeps at most what it had left), so what it admitted since its last report is
//!   not admitted again. Then the joiner **tops up** to its even share from the counter,
//!   as a new bucket that also counts from its own projected use. A projection below the
//!   truth is the over-admission this may cost; one above it leaves the bucket short of
//!   the grant until the Envoy's next report, which makes it whole (a new bucket of its
//!   grant less its reported use) and whose denials do not count as running dry while
//!   the grant is not used up ([`denials`]).
//! - **A lowered limit** (a reload): the grant shrinks to the new even share (never below
//!   what was used) and the bucket is told the smaller size, which Envoy scales down.
//!
//! What an Envoy's demand needs is its used requests plus its request rate (allowed and
//! denied) over the rest of the window ([`need`]), with a quarter more and one request of
//! headroom.

/// How a bucket's limit is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Requests per window.
    pub limit: u64,
    /// Envoys that may share the bucket (at least 1).
    pub envoys: u64,
}

impl Split {
    /// Each Envoy's even share of the limit, rounded down.
    pub fn even(self) -> u64 {
        self.limit / self.envoys.max(1)
    }
}

/// One Envoy's part of one bucket's window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holding {
    /// Quota reserved for it in the window's counter.
    pub granted: u64,
    /// Requests it reported allowed in the window (a report that straddles the window's
    /// start counts whole: never less than the truth).
    pub used: u64,
    /// It reported denials in the window.
    pub ran_dry: bool,
    /// Its bucket was last sized from a projection of what it spent since its last
    /// report ([`Moment::Joined`], [`Moment::TopUp`]): its next report makes it whole.
    pub projected: bool,
}

/// Why the service looks at an Envoy's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// Its first report of the bucket, or a window boundary: the Envoy gets a new bucket.
    Start,
    /// A usage report that says `denied` requests were refused since the last one, with
    /// `need` requests of demand projected over the rest of the window ([`need`]).
    Report {
        /// Requests refused since the last report.
        denied: u64,
        /// Demand over the rest of the window.
        need: u64,
    },
    /// Another Envoy joined the bucket short of its even share; this one is projected to
    /// have admitted `spent` requests since its last report.
    Joined {
        /// Requests projected admitted since its last report.
        spent: u64,
    },
    /// A joiner that started short: others gave quota back; it is projected to have
    /// admitted `spent` requests since its last report.
    TopUp {
        /// Requests projected admitted since its last report.
        spent: u64,
    },
}

/// What to do with the window's counter for one Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Nothing: the Envoy keeps its bucket.
    Keep,
    /// Reserve this much more; the Envoy gets what fits under the limit.
    Reserve(u64),
    /// Give back `now`, and `skewed` more when some Envoy reported denials in the window.
    Release {
        /// Given back whatever the others do.
        now: u64,
        /// Given back too when the window is skewed.
        skewed: u64,
    },
}

/// What the Envoy's bucket is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// The bucket it has, unchanged (Envoy goes on counting it down).
    Same,
    /// A new bucket holding exactly this many (0: deny every request).
    Fresh(u64),
    /// The bucket resized to this many; Envoy keeps the part it had left, so it holds at
    /// most this (0: deny every request).
    Scaled(u64),
}

/// Demand over the rest of the window: `requests` (allowed and denied) in the last
/// `elapsed_ms`, at the same rate for `left_ms`.
pub fn need(requests: u64, elapsed_ms: u64, left_ms: u64) -> u64 {
    let rate = u128::from(requests) * u128::from(left_ms) / u128::from(elapsed_ms.max(1));
    u64::try_from(rate).unwrap_or(u64::MAX)
}

/// What demand `need` keeps on top of `used`: a quarter more and one request.
fn with_headroom(used: u64, need: u64) -> u64 {
    used.saturating_add(need)
        .saturating_add(need / 4)
        .saturating_add(1)
}

/// The denials of a report that show the Envoy ran out of its grant: none when its
/// bucket was sized from a projection and the grant is not used up (the projection, not
/// the grant, ran out; the report makes the bucket whole). Call it once the report's
/// allowed requests are in `holding.used`.
pub fn denials(holding: Holding, denied: u64) -> u64 {
    if holding.projected && holding.granted > holding.used {
        0
    } else {
        denied
    }
}

/// What the counter must do for an Envoy holding `holding` at `moment`; its report's
/// allowed requests are already in `holding.used`.
pub fn ask(split: Split, holding: Holding, moment: Moment) -> Ask {
    let even = split.even();
    match moment {
        Moment::Start | Moment::TopUp { .. } => reserve(even.saturating_sub(holding.granted)),
        Moment::Joined { spent } => {
            let keep = even.max(holding.used.saturating_add(spent));
            match holding.granted.saturating_sub(keep) {
                0 => Ask::Keep,
                now => Ask::Release { now, skewed: 0 },
            }
        }
        Moment::Report { denied, need } => {
            let demand = with_headroom(holding.used, need).min(split.limit.max(holding.used));
            if denied > 0 {
                return reserve(demand.max(even).saturating_sub(holding.granted));
            }
            if holding.ran_dry && holding.granted < demand {
                return reserve(demand - holding.granted);
            }
            let now = holding.granted.saturating_sub(demand.max(even));
            let skewed = holding.granted.saturating_sub(now).saturating_sub(demand);
            if now == 0 && skewed == 0 {
                Ask::Keep
            } else {
                Ask::Release { now, skewed }
            }
        }
    }
}

fn reserve(more: u64) -> Ask {
    if more == 0 {
        Ask::Keep
    } else {
        Ask::Reserve(more)
    }
}

/// Applies what the counter did for `ask` to `holding` (`got` of a reservation, `given`
/// back of a release) and says what the Envoy's bucket becomes.
pub fn settle(holding: &mut Holding, moment: Moment, ask: Ask, done: u64) -> Tokens {
    if matches!(moment, Moment::Report { denied, .. } if denied > 0) {
        holding.ran_dry = true;
    }
    // A bucket sized from a projection is made whole at the next report.
    let whole = holding.projected && matches!(moment, Moment::Report { .. });
    let tokens = match (ask, moment) {
        (Ask::Reserve(_), Moment::Start) | (Ask::Keep, Moment::Start) => {
            holding.granted = holding.granted.saturating_add(done);
            Tokens::Fresh(holding.granted.saturating_sub(holding.used))
        }
        // A joiner that started short: a new bucket of what it holds now, less what it
        // used and is projected to have admitted since.
        (Ask::Reserve(_), Moment::TopUp { spent }) if done > 0 => {
            holding.granted = holding.granted.saturating_add(done);
            holding.projected |= spent > 0;
            Tokens::Fresh(remaining(*holding, spent))
        }
        // It ran dry (buckets do not refill by themselves): the increase is exactly what
        // it may spend now. Without denials its bucket may not be dry: the increase and
        // what it had left.
        (Ask::Reserve(_), Moment::Report { denied, .. }) if done > 0 => {
            let left = match denied {
                0 => holding.granted.saturating_sub(holding.used),
                _ => 0,
            };
            holding.granted = holding.granted.saturating_add(done);
            Tokens::Fresh(done.saturating_add(left))
        }
        // Given back to a joiner: the bucket shrinks to what is left of the grant after
        // what was used and is projected to have been admitted since (never refilled: what
        // it admitted since its last report is not admitted again).
        (Ask::Release { .. }, Moment::Joined { spent }) if done > 0 => {
            holding.granted = holding.granted.saturating_sub(done);
            holding.projected |= spent > 0;
            Tokens::Scaled(remaining(*holding, spent))
        }
        (Ask::Release { .. }, _) if done > 0 => {
            holding.granted = holding.granted.saturating_sub(done);
            Tokens::Fresh(holding.granted.saturating_sub(holding.used))
        }
        _ => Tokens::Same,
    };
    if whole {
        holding.projected = false;
        return Tokens::Fresh(holding.granted.saturating_sub(holding.used));
    }
    tokens
}

/// What is left of `holding`'s grant after what it used and `spent` more.
fn remaining(holding: Holding, spent: u64) -> u64 {
    holding
        .granted
        .saturating_sub(holding.used)
        .saturating_sub(spent)
}

/// A reload lowered the limit to `split.limit`: the grant it keeps (its even share of the
/// new limit, never less than it used) and the bucket's new size.
pub fn lowered(split: Split, holding: &mut Holding) -> Tokens {
    holding.granted = holding.granted.min(split.even().max(holding.used));
    Tokens::Scaled(holding.granted.saturating_sub(holding.used))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: Split = Split {
        limit: 10,
        envoys: 2,
    };

    fn held(granted: u64, used: u64) -> Holding {
        Holding {
            granted,
            used,
            ..Holding::default()
        }
    }

    fn joined(spent: u64) -> Moment {
        Moment::Joined { spent }
    }

    fn report(denied: u64, need: u64) -> Moment {
        Moment::Report { denied, need }
    }

    #[test]
    fn a_new_bucket_gets_an_even_share_less_what_was_admitted_without_one() {
        let mut holding = held(0, 1);
        let ask = ask(TWO, holding, Moment::Start);
        assert_eq!(ask, Ask::Reserve(5));
        assert_eq!(
            settle(&mut holding, Moment::Start, ask, 5),
            Tokens::Fresh(4)
        );
        let mut full = Holding::default();
        assert_eq!(
            settle(&mut full, Moment::Start, Ask::Reserve(5), 0),
            Tokens::Fresh(0),
            "nothing left: deny"
        );
    }

    #[test]
    fn denials_ask_for_the_demand_and_get_the_increase_as_a_new_bucket() {
        let mut holding = held(5, 5);
        let moment = report(20, 40);
        assert_eq!(
            ask(TWO, holding, moment),
            Ask::Reserve(5),
            "capped at the limit"
        );
        assert_eq!(
            settle(&mut holding, moment, Ask::Reserve(5), 3),
            Tokens::Fresh(3)
        );
        assert_eq!(holding.granted, 8);
        assert_eq!(
            settle(&mut holding, moment, Ask::Reserve(2), 0),
            Tokens::Same
        );
    }

    #[test]
    fn a_quiet_envoy_keeps_its_even_share_unless_the_window_is_skewed() {
        let quiet = held(5, 1);
        // Needs 1 + 2 + 0 + 1 = 4: keeps 5 (even), gives back 1 when skewed.
        assert_eq!(
            ask(TWO, quiet, report(0, 2)),
            Ask::Release { now: 0, skewed: 1 }
        );
        let grown = held(9, 1);
        assert_eq!(
            ask(TWO, grown, report(0, 0)),
            Ask::Release { now: 4, skewed: 3 }
        );
        let mut holding = grown;
        let release = Ask::Release { now: 4, skewed: 3 };
        assert_eq!(
            settle(&mut holding, report(0, 0), release, 7),
            Tokens::Fresh(1)
        );
        assert_eq!(ask(TWO, quiet, report(0, 3)), Ask::Keep);
    }

    #[test]
    fn an_envoy_that_ran_dry_asks_for_its_demand_at_a_report_without_denials() {
        let mut holding = held(6, 5);
        assert_eq!(
            settle(&mut holding, report(3, 4), Ask::Reserve(5), 1),
            Tokens::Fresh(1)
        );
        assert!(holding.ran_dry);
        // It spent all but one just as it reported: no denials, short of 6 + 1 + 0 + 1.
        holding.used = 6;
        let moment = report(0, 1);
        assert_eq!(ask(TWO, holding, moment), Ask::Reserve(1));
        assert_eq!(
            settle(&mut holding, moment, Ask::Reserve(1), 1),
            Tokens::Fresh(2),
            "the increase and what it had left"
        );
        // One that never reported denials keeps its even share until it does.
        assert_eq!(ask(TWO, held(5, 5), moment), Ask::Keep);
    }

    #[test]
    fn a_joiner_short_of_its_even_share_gets_what_the_others_hold_above_theirs() {
        let mut first = held(10, 1);
        let ask_first = ask(TWO, first, joined(0));
        assert_eq!(ask_first, Ask::Release { now: 5, skewed: 0 });
        assert_eq!(
            settle(&mut first, joined(0), ask_first, 5),
            Tokens::Scaled(4),
            "resized, not refilled"
        );
        assert!(!first.projected, "nothing projected: nothing to make whole");
        let mut joiner = held(0, 1);
        assert_eq!(
            settle(&mut joiner, Moment::Start, Ask::Reserve(5), 0),
            Tokens::Fresh(0)
        );
        let top_up = Moment::TopUp { spent: 0 };
        assert_eq!(ask(TWO, joiner, top_up), Ask::Reserve(5));
        assert_eq!(
            settle(&mut joiner, top_up, Ask::Reserve(5), 5),
            Tokens::Fresh(4)
        );
        let spent = held(10, 8);
        assert_eq!(
            ask(TWO, spent, joined(0)),
            Ask::Release { now: 2, skewed: 0 }
        );
        assert_eq!(ask(TWO, joiner, joined(0)), Ask::Keep);
    }

    #[test]
    fn a_holder_gives_back_only_what_it_surely_has_not_spent_since_its_last_report() {
        // Reported 1 used, projected 3 more since: it keeps its even share of 5, and its
        // bucket is what is left of that after 1 + 3.
        let mut light = held(10, 1);
        assert_eq!(
            ask(TWO, light, joined(3)),
            Ask::Release { now: 5, skewed: 0 }
        );
        assert_eq!(
            settle(&mut light, joined(3), Ask::Release { now: 5, skewed: 0 }, 5),
            Tokens::Scaled(1)
        );
        assert!(light.projected);
        // Projected past its even share: it keeps what it is projected to have used.
        let mut heavy = held(10, 2);
        let ask_heavy = ask(TWO, heavy, joined(6));
        assert_eq!(ask_heavy, Ask::Release { now: 2, skewed: 0 });
        assert_eq!(
            settle(&mut heavy, joined(6), ask_heavy, 2),
            Tokens::Scaled(0)
        );
        assert_eq!(heavy.granted, 8);
        assert_eq!(ask(TWO, held(10, 2), joined(8)), Ask::Keep);
        // A joiner's top-up counts from its own projected use too.
        let mut joiner = held(0, 1);
        let top_up = Moment::TopUp { spent: 2 };
        assert_eq!(
            settle(&mut joiner, top_up, Ask::Reserve(5), 5),
            Tokens::Fresh(2)
        );
        assert!(joiner.projected);
    }

    #[test]
    fn the_report_after_a_projection_makes_the_bucket_whole() {
        // Projected 3 since its report, it was resized to 1; it had spent 2: its report
        // says so, its denials were the projection's, and its bucket is its grant less 3.
        let mut light = held(10, 1);
        settle(&mut light, joined(3), Ask::Release { now: 5, skewed: 0 }, 5);
        light.used += 2;
        assert_eq!(denials(light, 1), 0, "the grant is not used up");
        let moment = report(0, 0);
        let ask_light = ask(TWO, light, moment);
        assert_eq!(settle(&mut light, moment, ask_light, 0), Tokens::Fresh(2));
        assert!(!light.projected && !light.ran_dry);
        // Once the grant is used up, denials are denials.
        let mut spent = held(5, 5);
        spent.projected = true;
        assert_eq!(denials(spent, 3), 3);
        assert_eq!(denials(held(5, 1), 3), 3, "not projected");
    }

    #[test]
    fn a_lowered_limit_shrinks_to_the_new_even_share() {
        let mut holding = held(5, 2);
        let lower = Split {
            limit: 6,
            envoys: 2,
        };
        assert_eq!(lowered(lower, &mut holding), Tokens::Scaled(1));
        let mut spent = held(5, 5);
        assert_eq!(lowered(lower, &mut spent), Tokens::Scaled(0));
        assert_eq!(spent.granted, 5, "what was used stays counted");
    }

    #[test]
    fn need_projects_the_rate() {
        assert_eq!(need(10, 5_000, 30_000), 60);
        assert_eq!(need(10, 0, 1_000), 10_000);
        assert_eq!(need(u64::MAX, 1, u64::MAX), u64::MAX);
    }
}
