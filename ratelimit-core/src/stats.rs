//! Statistics counters, named as envoyproxy/ratelimit names them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Prefix of every per-rule statistic: `ratelimit.service.rate_limit.<rule key>.<stat>`.
pub const RULE_STATS_PREFIX: &str = "ratelimit.service.rate_limit.";

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        if n != 0 {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The current total.
    pub fn value(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The counters kept for one rule key (`<domain>.<key>_<value>...`).
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Every hit evaluated against the rule.
    pub total_hits: Counter,
    /// Hits beyond the limit.
    pub over_limit: Counter,
    /// Hits above the near-limit ratio but within the limit.
    pub near_limit: Counter,
    /// Hits answered within the limit.
    pub within_limit: Counter,
    /// Over-limit hits that shadow mode answered `OK`.
    pub shadow_mode: Counter,
    /// Over-limit hits answered from the local over-limit cache.
    pub over_limit_with_local_cache: Counter,
}

impl RuleStats {
    /// The counters with their statistic suffixes, in a stable order.
    pub fn named(&self) -> [(&'static str, &Counter); 6] {
        [
            ("total_hits", &self.total_hits),
            ("over_limit", &self.over_limit),
            ("near_limit", &self.near_limit),
            ("within_limit", &self.within_limit),
            ("shadow_mode", &self.shadow_mode),
            (
                "over_limit_with_local_cache",
                &self.over_limit_with_local_cache,
            ),
        ]
    }
}

/// Every counter of a process, by name. Counters outlive configuration reloads: a rule
/// that keeps its key after a reload keeps counting where it was.
#[derive(Debug, Default)]
pub struct StatsRegistry {
    rules: RwLock<HashMap<Arc<str>, Arc<RuleStats>>>,
    counters: RwLock<HashMap<Arc<str>, Arc<Counter>>>,
}

/// One statistic of [`StatsRegistry::lines`]: a name that is not copied, and its counter,
/// read when the line is written.
#[derive(Clone, Debug)]
pub enum StatLine {
    /// Statistic `stat` (an index into [`RuleStats::named`]) of a rule key.
    Rule(Arc<str>, Arc<RuleStats>, usize),
    /// A counter with its full name.
    Counter(Arc<str>, Arc<Counter>),
}

impl StatLine {
    /// The full name, in pieces: `ratelimit.service.rate_limit.` + key + `.` + statistic.
    fn name(&self) -> [&str; 4] {
        match self {
            StatLine::Rule(key, stats, stat) => {
                [RULE_STATS_PREFIX, key, ".", stats.named()[*stat].0]
            }
            StatLine::Counter(name, _) => [name, "", "", ""],
        }
    }

    /// The counter's value now.
    pub fn value(&self) -> u64 {
        match self {
            StatLine::Rule(_, stats, stat) => stats.named()[*stat].1.value(),
            StatLine::Counter(_, counter) => counter.value(),
        }
    }

    /// Appends `name: value` and a newline to `out`.
    pub fn write(&self, out: &mut String) {
        self.name().iter().for_each(|part| out.push_str(part));
        out.push_str(": ");
        out.push_str(itoa::Buffer::new().format(self.value()));
        out.push('\n');
    }
}

impl StatsRegistry {
    /// The counters of the rule key `key` (without the `ratelimit.service.rate_limit.` prefix).
    /// The name is sanitized as envoyproxy/ratelimit sanitizes statistic names: `:` and `|`
    /// become `_`, and so do the dots of IPv4 addresses, so that a value never adds levels
    /// to the statistic hierarchy by accident.
    pub fn rule(&self, key: &str) -> Arc<RuleStats> {
        get_or_insert(&self.rules, &sanitize(key))
    }

    /// A counter with a full statistic name, such as `ratelimit.service.config_load_success`
    /// (sanitized like [`StatsRegistry::rule`]).
    pub fn counter(&self, name: &str) -> Arc<Counter> {
        get_or_insert(&self.counters, &sanitize(name))
    }

    /// Every statistic, sorted by full name, without copying a name.
    pub fn lines(&self) -> Vec<StatLine> {
        let mut out: Vec<StatLine> = Vec::new();
        for (key, stats) in read(&self.rules).iter() {
            out.extend(
                (0..stats.named().len())
                    .map(|stat| StatLine::Rule(Arc::clone(key), Arc::clone(stats), stat)),
            );
        }
        out.extend(
            read(&self.counters)
                .iter()
                .map(|(name, counter)| StatLine::Counter(Arc::clone(name), Arc::clone(counter))),
        );
        out.sort_unstable_by(|a, b| {
            let (a, b) = (a.name(), b.name());
            a.iter()
                .flat_map(|p| p.bytes())
                .cmp(b.iter().flat_map(|p| p.bytes()))
        });
        out
    }

    /// Every statistic as `(full name, value)`, sorted by name.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        self.lines()
            .iter()
            .map(|line| (line.name().concat(), line.value()))
            .collect()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn get_or_insert<T: Default>(map: &RwLock<HashMap<Arc<str>, Arc<T>>>, key: &str) -> Arc<T> {
    if let Some(found) = read(map).get(key) {
        return Arc::clone(found);
    }
    let mut map = map.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    Arc::clone(map.entry(key.into()).or_default())
}

/// Appends one level of a rule key: `.key` or `.key_value`.
pub(crate) fn push_key_part(out: &mut String, key: &str, value: Option<&str>) {
    if !out.is_empty() {
        out.push('.');
    }
    out.push_str(key);
    if let Some(value) = value {
        out.push('_');
        out.push_str(value);
    }
}

fn sanitize(name: &str) -> Cow<'_, str> {
    if !name.contains([':', '|']) && !has_ipv4(name) {
        return Cow::Borrowed(name);
    }
    let mut out: Vec<u8> = name
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let mut i = 0;
    while i < out.len() {
        match ipv4_at(&out, i) {
            Some(len) => {
                for b in &mut out[i..i + len] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                i += len;
            }
            None => i += 1,
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes.
    Cow::Owned(String::from_utf8(out).expect("still UTF-8"))
}

fn has_ipv4(part: &str) -> bool {
    let bytes = part.as_bytes();
    (0..bytes.len()).any(|i| ipv4_at(bytes, i).is_some())
}

/// Length of a dotted quad `d.d.d.d` (1–3 digits each) starting at `i` and not preceded by a
/// digit, if there is one.
fn ipv4_at(bytes: &[u8], i: usize) -> Option<usize> {
    if i > 0 && bytes[i - 1].is_ascii_digit() {
        return None;
    }
    let mut pos = i;
    for group in 0..4 {
        let digits = bytes[pos..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=3).contains(&digits) {
            return None;
        }
        pos += digits;
        if group < 3 {
            if bytes.get(pos) != Some(&b'.') {
                return None;
            }
            pos += 1;
        }
    }
    if bytes.get(pos).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    Some(pos - i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[(&str, Option<&str>)]) -> String {
        let mut out = String::from("domain");
        for (k, v) in parts {
            push_key_part(&mut out, k, *v);
        }
        sanitize(&out).into_owned()
    }

    #[test]
    fn names_are_sanitized_like_the_reference() {
        assert_eq!(key(&[("k", Some("v"))]), "domain.k_v");
        assert_eq!(
            key(&[("k", None), ("sub", Some("a:b|c"))]),
            "domain.k.sub_a_b_c"
        );
        assert_eq!(
            key(&[("remote_address", Some("10.0.0.1"))]),
            "domain.remote_address_10_0_0_1"
        );
        assert_eq!(key(&[("path", Some("/v1.2/x"))]), "domain.path_/v1.2/x");
    }

    #[test]
    fn registry_shares_counters_by_name_and_snapshots_them() {
        let registry = StatsRegistry::default();
        registry.rule("d.k").total_hits.add(2);
        registry.rule("d.k").total_hits.add(3);
        registry
            .counter("ratelimit.service.config_load_success")
            .add(1);
        let snapshot = registry.snapshot();
        assert!(snapshot.contains(&("ratelimit.service.rate_limit.d.k.total_hits".into(), 5)));
        assert!(snapshot.contains(&("ratelimit.service.config_load_success".into(), 1)));
        assert!(snapshot.windows(2).all(|w| w[0].0 <= w[1].0));
    }
}
