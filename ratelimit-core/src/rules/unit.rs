//! Time units and windows.

use std::fmt;

/// The unit of a rate limit, as written in the YAML (`unit: minute`) and on the wire.
///
/// Windows are epoch-aligned fixed blocks of [`Unit::seconds`], not calendar periods:
/// a week starts on Thursday 00:00 UTC (the epoch was a Thursday), a month is 30 days
/// and a year 365 days, exactly as envoyproxy/ratelimit counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3 600 seconds.
    Hour,
    /// 86 400 seconds (UTC midnight to midnight).
    Day,
    /// 604 800 seconds, starting Thursday 00:00 UTC.
    Week,
    /// 2 592 000 seconds (30 days) since the epoch.
    Month,
    /// 31 536 000 seconds (365 days) since the epoch.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Length of one window of this unit, in seconds.
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The upper-case name used by Envoy's `RateLimitResponse.RateLimit.Unit` (`MINUTE`).
    pub const fn as_upper_str(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// Parses a unit name case-insensitively (`minute`, `MINUTE`, `Minute`).
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.as_upper_str().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_upper_str())
    }
}

/// The length of a window: a [`Unit`] times a multiplier (`unit_multiplier`, 1 unless
/// the rule says otherwise), aligned to multiples of its length since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    unit: Unit,
    multiplier: u32,
}

impl Window {
    /// A window of one `unit`, as envoyproxy/ratelimit counts.
    pub const fn of(unit: Unit) -> Window {
        Window {
            unit,
            multiplier: 1,
        }
    }

    /// A window of `multiplier` units (at least 1).
    pub const fn new(unit: Unit, multiplier: u32) -> Window {
        Window {
            unit,
            multiplier: if multiplier == 0 { 1 } else { multiplier },
        }
    }

    /// The unit reported to clients.
    pub const fn unit(self) -> Unit {
        self.unit
    }

    /// How many units the window lasts.
    pub const fn multiplier(self) -> u32 {
        self.multiplier
    }

    /// Window length in seconds (the "divider" of envoyproxy/ratelimit).
    pub const fn seconds(self) -> u64 {
        self.unit.seconds() * self.multiplier as u64
    }

    /// Start of the window containing `now` (unix seconds): `now - now % length`.
    pub const fn start(self, now: u64) -> u64 {
        now - now % self.seconds()
    }

    /// Seconds until the window containing `now` ends: between 1 and the window length.
    pub const fn until_reset(self, now: u64) -> u64 {
        self.seconds() - now % self.seconds()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_is_case_insensitive_and_rejects_unknown() {
        assert_eq!(Unit::parse("minute"), Some(Unit::Minute));
        assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
        assert_eq!(Unit::parse("Week"), Some(Unit::Week));
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::parse(""), None);
    }

    #[test]
    fn windows_are_epoch_aligned() {
        let w = Window::of(Unit::Minute);
        assert_eq!(w.start(125), 120);
        assert_eq!(w.until_reset(125), 55);
        assert_eq!(w.until_reset(120), 60);
        // 1970-01-01 was a Thursday: week windows start on Thursdays.
        let week = Window::of(Unit::Week);
        assert_eq!(week.start(604_800 * 3 + 5), 604_800 * 3);
        assert_eq!(Window::of(Unit::Month).seconds(), 30 * 86_400);
        assert_eq!(Window::of(Unit::Year).seconds(), 365 * 86_400);
    }

    #[test]
    fn multiplied_windows_are_aligned_to_their_length() {
        let ten_minutes = Window::new(Unit::Minute, 10);
        assert_eq!(ten_minutes.seconds(), 600);
        assert_eq!(ten_minutes.start(1_799), 1_200);
        assert_eq!(ten_minutes.until_reset(1_799), 1);
        assert_eq!(Window::new(Unit::Second, 0), Window::of(Unit::Second));
    }
}
