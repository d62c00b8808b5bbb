//! One structured reading of every statistic, which every output renders: the debug
//! `/stats` text, statsd, Prometheus and the proxy-wasm filter's metrics.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::names::{RULE_PREFIX, RuleStat};
use super::timer::TimerReading;

/// The name of a statistic, in parts: nothing is copied to take a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Name {
    /// `ratelimit.service.rate_limit.<key>.<stat>`.
    Rule {
        /// The rule key, `<domain>.<key>_<value>...`.
        key: Arc<str>,
        /// Which of the rule's statistics.
        stat: RuleStat,
    },
    /// Any other statistic, by its full name.
    Plain(Arc<str>),
}

impl Name {
    /// The full name in pieces, concatenated without separators.
    pub fn parts(&self) -> [&str; 4] {
        match self {
            Name::Rule { key, stat } => [RULE_PREFIX, key, ".", stat.as_str()],
            Name::Plain(name) => [name, "", "", ""],
        }
    }

    /// Appends the full name to `out`.
    pub fn write_to(&self, out: &mut String) {
        self.parts().iter().for_each(|part| out.push_str(part));
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.parts().iter().try_for_each(|part| f.write_str(part))
    }
}

/// What a statistic measures, and its value when the snapshot was taken.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A total that only grows; outputs that want rates send differences.
    Counter(u64),
    /// A level that goes up and down.
    Gauge(u64),
    /// A distribution of durations.
    Timer(TimerReading),
}

/// One statistic.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its name.
    pub name: Name,
    /// Its value.
    pub value: Value,
}

/// Every statistic of a process, sorted by full name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The statistics.
    pub samples: Vec<Sample>,
}

impl Snapshot {
    /// Every counter as `(full name, value)`: convenient in tests and small tools.
    pub fn counters(&self) -> Vec<(String, u64)> {
        self.samples
            .iter()
            .filter_map(|sample| match sample.value {
                Value::Counter(value) => Some((sample.name.to_string(), value)),
                _ => None,
            })
            .collect()
    }

    /// The value of the counter called `name`, if there is one.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.samples.iter().find_map(|sample| match sample.value {
            Value::Counter(value) if sample.name.to_string() == name => Some(value),
            _ => None,
        })
    }

    /// Appends the debug text of every statistic: `name: value` lines; a timer is three
    /// lines, `.count`, `.total_us` and `.max_us`.
    pub fn write_text(samples: &[Sample], out: &mut String) {
        let mut number = itoa::Buffer::new();
        for sample in samples {
            let mut line = |suffix: &str, value: u64| {
                sample.name.write_to(out);
                out.push_str(suffix);
                out.push_str(": ");
                out.push_str(number.format(value));
                out.push('\n');
            };
            match &sample.value {
                Value::Counter(value) | Value::Gauge(value) => line("", *value),
                Value::Timer(timer) => {
                    line(".count", timer.count);
                    line(".total_us", timer.sum_us);
                    line(".max_us", timer.max_us);
                }
            }
        }
    }
}

/// What changed since the last reading, for outputs that send differences (statsd, the
/// proxy-wasm filter's metrics). It remembers one value per statistic name, and names are
/// bounded by the registry (`MAX_STAT_KEYS`).
#[derive(Debug, Default)]
pub struct Deltas {
    counters: HashMap<Name, u64>,
    timers: HashMap<Name, TimerReading>,
}

impl Deltas {
    /// How much the counter `name` grew since the last call for it.
    pub fn counter(&mut self, name: &Name, value: u64) -> u64 {
        match self.counters.get_mut(name) {
            Some(last) => {
                let delta = value.saturating_sub(*last);
                *last = value;
                delta
            }
            None => {
                self.counters.insert(name.clone(), value);
                value
            }
        }
    }

    /// The durations the timer `name` recorded since the last call for it.
    pub fn timer(&mut self, name: &Name, reading: &TimerReading) -> TimerReading {
        match self.timers.get_mut(name) {
            Some(last) => {
                let delta = reading.since(last);
                *last = reading.clone();
                delta
            }
            None => {
                self.timers.insert(name.clone(), reading.clone());
                reading.clone()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_are_differences_since_the_last_reading() {
        let name = Name::Plain("a".into());
        let mut deltas = Deltas::default();
        assert_eq!(deltas.counter(&name, 5), 5);
        assert_eq!(deltas.counter(&name, 5), 0);
        assert_eq!(deltas.counter(&name, 9), 4);
        let rule = Name::Rule {
            key: "d.k".into(),
            stat: RuleStat::OverLimit,
        };
        assert_eq!(deltas.counter(&rule, 2), 2);
        assert_eq!(
            rule.to_string(),
            "ratelimit.service.rate_limit.d.k.over_limit"
        );
    }
}
