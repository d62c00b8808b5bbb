//! Statistics: counters, timers and gauges kept in one registry, named as
//! envoyproxy/ratelimit names them ([`names`]), read as one structured [`Snapshot`].
//!
//! Statistics whose names come from requests (unknown domains, `detailed_metric`,
//! `value_to_metric`, limit overrides) are bounded: past [`StatsRegistry::max_dynamic_keys`]
//! distinct names, new ones fold into one `_overflow` name per rule and count
//! [`names::STATS_OVERFLOW`].

pub mod names;
mod nearest;
mod snapshot;
mod timer;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

pub use names::RuleStat;
pub use nearest::{NEAREST_KEPT, Near, Nearest};
pub use snapshot::{Deltas, Name, Sample, Snapshot, Value};
pub use timer::{BUCKET_BOUNDS_US, Timer, TimerReading};

/// The statistics as Prometheus names them: statsd_exporter's mapping format, giving the
/// names, types and labels envoyproxy/ratelimit exports. Services render with it unless
/// an operator gives a mapping of their own.
pub const PROMETHEUS_MAPPING: &str = include_str!("prometheus-mapping.yaml");

/// Distinct statistic names from request data a registry keeps by default (`MAX_STAT_KEYS`).
pub const DEFAULT_MAX_STAT_KEYS: usize = 10_000;

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// A counter at zero.
    pub const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    /// Adds `n`, saturating: a counter never wraps back to a small value (an addend may
    /// be as large as 2^64 - 1), so a collector never mistakes it for a restart.
    pub fn add(&self, n: u64) {
        if n != 0 {
            let before = self.0.fetch_add(n, Ordering::Relaxed);
            if before.checked_add(n).is_none() {
                self.0.store(u64::MAX, Ordering::Relaxed);
            }
        }
    }

    /// The current total.
    pub fn value(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The counters kept for one rule key (`<domain>.<key>_<value>...`).
///
/// `total_hits` is not a counter of its own: it is `within_limit` plus the hits added
/// with [`RuleStats::add_not_within`], so that a decision within the limit, the common
/// one, adds to one counter instead of two.
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Hits in `total_hits` that are not in `within_limit`.
    not_within: Counter,
    /// Hits beyond the limit.
    pub over_limit: Counter,
    /// Hits above the near-limit ratio but within the limit.
    pub near_limit: Counter,
    /// Hits answered within the limit (each is in `total_hits` too).
    pub within_limit: Counter,
    /// Over-limit hits that shadow mode answered `OK`.
    pub shadow_mode: Counter,
    /// Over-limit hits answered from the local over-limit cache.
    pub over_limit_with_local_cache: Counter,
    /// Hits given back by refunds (not in `total_hits`).
    pub total_negative_hits: Counter,
}

impl RuleStats {
    /// Counters at zero.
    pub const fn new() -> RuleStats {
        RuleStats {
            not_within: Counter::new(),
            over_limit: Counter::new(),
            near_limit: Counter::new(),
            within_limit: Counter::new(),
            shadow_mode: Counter::new(),
            over_limit_with_local_cache: Counter::new(),
            total_negative_hits: Counter::new(),
        }
    }

    /// Adds `n` hits to `total_hits` that are not answered within the limit.
    pub fn add_not_within(&self, n: u64) {
        self.not_within.add(n);
    }

    /// Every hit evaluated against the rule.
    pub fn total_hits(&self) -> u64 {
        self.within_limit
            .value()
            .saturating_add(self.not_within.value())
    }

    /// The value of `stat` now.
    pub fn value(&self, stat: RuleStat) -> u64 {
        match stat {
            RuleStat::TotalHits => self.total_hits(),
            RuleStat::OverLimit => self.over_limit.value(),
            RuleStat::NearLimit => self.near_limit.value(),
            RuleStat::WithinLimit => self.within_limit.value(),
            RuleStat::ShadowMode => self.shadow_mode.value(),
            RuleStat::OverLimitWithLocalCache => self.over_limit_with_local_cache.value(),
            RuleStat::TotalNegativeHits => self.total_negative_hits.value(),
        }
    }
}

/// A level read when a snapshot is taken (the memory backend's size, the local cache's).
pub type Gauge = Arc<dyn Fn() -> u64 + Send + Sync>;

type Map<T> = RwLock<HashMap<Arc<str>, Arc<T>>>;

/// Every statistic of a process, by name. Counters outlive configuration reloads: a rule
/// that keeps its key after a reload keeps counting where it was.
pub struct StatsRegistry {
    rules: Map<RuleStats>,
    counters: Map<Counter>,
    timers: Map<Timer>,
    gauges: RwLock<Vec<(Arc<str>, Gauge)>>,
    /// The configured limits' gauges, replaced as a whole at each load.
    limits: RwLock<Vec<(Arc<str>, u64)>>,
    dynamic: AtomicUsize,
    max_dynamic_keys: usize,
    overflow: Arc<Counter>,
    nearest: Nearest,
}

impl std::fmt::Debug for StatsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsRegistry")
            .field("dynamic", &self.dynamic)
            .field("max_dynamic_keys", &self.max_dynamic_keys)
            .finish_non_exhaustive()
    }
}

impl Default for StatsRegistry {
    fn default() -> StatsRegistry {
        StatsRegistry::new(DEFAULT_MAX_STAT_KEYS)
    }
}

impl StatsRegistry {
    /// A registry that keeps at most `max_dynamic_keys` names that came from requests.
    pub fn new(max_dynamic_keys: usize) -> StatsRegistry {
        let counters: Map<Counter> = RwLock::default();
        let overflow = get_or_insert(&counters, names::STATS_OVERFLOW);
        StatsRegistry {
            rules: RwLock::default(),
            counters,
            timers: RwLock::default(),
            gauges: RwLock::default(),
            limits: RwLock::default(),
            dynamic: AtomicUsize::new(0),
            max_dynamic_keys,
            overflow,
            nearest: Nearest::default(),
        }
    }

    /// The counters nearest their limits.
    pub fn nearest(&self) -> &Nearest {
        &self.nearest
    }

    /// How many names from requests this registry keeps before folding.
    pub fn max_dynamic_keys(&self) -> usize {
        self.max_dynamic_keys
    }

    /// The counters of the rule key `key` from configuration (without the
    /// `ratelimit.service.rate_limit.` prefix), sanitized as envoyproxy/ratelimit
    /// sanitizes statistic names.
    pub fn rule(&self, key: &str) -> Arc<RuleStats> {
        get_or_insert(&self.rules, &names::sanitize(key))
    }

    /// The counters of a rule key built from request data: past the bound, those of
    /// `fold`'s `_overflow` key instead.
    pub fn request_rule(&self, key: &str, fold: &str) -> Arc<RuleStats> {
        self.bounded(&self.rules, key, &names::overflow_key(fold))
    }

    /// A counter with a full statistic name from [`names`] (sanitized like
    /// [`StatsRegistry::rule`]).
    pub fn counter(&self, name: &str) -> Arc<Counter> {
        get_or_insert(&self.counters, &names::sanitize(name))
    }

    /// A counter whose name was built from request data: past the bound, `fold` instead.
    pub fn request_counter(&self, name: &str, fold: &str) -> Arc<Counter> {
        self.bounded(&self.counters, name, fold)
    }

    /// `name`'s entry of `map` when kept or when it fits the bound; else `fold`'s.
    fn bounded<T: Default>(&self, map: &Map<T>, name: &str, fold: &str) -> Arc<T> {
        let name = names::sanitize(name);
        if let Some(found) = read(map).get(name.as_ref()) {
            return Arc::clone(found);
        }
        match self.admit() {
            true => get_or_insert(map, &name),
            false => get_or_insert(map, &names::sanitize(fold)),
        }
    }

    /// A timer with a full statistic name.
    pub fn timer(&self, name: &str) -> Arc<Timer> {
        get_or_insert(&self.timers, name)
    }

    /// Registers a gauge, read at each snapshot; a later gauge of the same name replaces it.
    pub fn gauge(&self, name: &str, read_level: Gauge) {
        let mut gauges = self
            .gauges
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        gauges.retain(|(existing, _)| existing.as_ref() != name);
        gauges.push((name.into(), read_level));
    }

    /// Replaces the configured limits' gauges with one `limit` and one `window_seconds`
    /// gauge per rule key of `limits` (`(key, requests_per_unit, window seconds)`): a
    /// rule that went away loses its gauges. The rules bound their number.
    pub fn set_rule_limits(&self, limits: impl IntoIterator<Item = (String, u32, u64)>) {
        let mut gauges: Vec<(Arc<str>, u64)> = Vec::new();
        for (key, requests_per_unit, window) in limits {
            gauges.push((names::rule_limit(&key).into(), u64::from(requests_per_unit)));
            gauges.push((names::rule_window_seconds(&key).into(), window));
        }
        *self
            .limits
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = gauges;
    }

    /// Whether one more name from request data fits; counts a fold when it does not.
    fn admit(&self) -> bool {
        let admitted = self
            .dynamic
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_dynamic_keys).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.overflow.add(1);
        }
        admitted
    }

    /// Every statistic now, sorted by full name. Names are shared, not copied.
    pub fn snapshot(&self) -> Snapshot {
        let mut samples: Vec<Sample> = Vec::new();
        for (key, stats) in read(&self.rules).iter() {
            samples.extend(RuleStat::ALL.iter().map(|&stat| Sample {
                name: Name::Rule {
                    key: Arc::clone(key),
                    stat,
                },
                value: Value::Counter(stats.value(stat)),
            }));
        }
        for (name, counter) in read(&self.counters).iter() {
            samples.push(Sample {
                name: Name::Plain(Arc::clone(name)),
                value: Value::Counter(counter.value()),
            });
        }
        for (name, timer) in read(&self.timers).iter() {
            samples.push(Sample {
                name: Name::Plain(Arc::clone(name)),
                value: Value::Timer(timer.read()),
            });
        }
        for (name, gauge) in read(&self.gauges).iter() {
            samples.push(Sample {
                name: Name::Plain(Arc::clone(name)),
                value: Value::Gauge(gauge()),
            });
        }
        for (name, level) in read(&self.limits).iter() {
            samples.push(Sample {
                name: Name::Plain(Arc::clone(name)),
                value: Value::Gauge(*level),
            });
        }
        samples.sort_unstable_by(|a, b| {
            let (a, b) = (a.name.parts(), b.name.parts());
            a.iter()
                .flat_map(|p| p.bytes())
                .cmp(b.iter().flat_map(|p| p.bytes()))
        });
        Snapshot { samples }
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn get_or_insert<T: Default>(map: &Map<T>, key: &str) -> Arc<T> {
    if let Some(found) = read(map).get(key) {
        return Arc::clone(found);
    }
    let mut map = map.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    Arc::clone(map.entry(key.into()).or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let stats = RuleStats::new();
        stats.over_limit.add(u64::MAX - 10);
        stats.over_limit.add(u64::MAX - 10);
        assert_eq!(stats.over_limit.value(), u64::MAX);
        stats.within_limit.add(u64::MAX);
        stats.add_not_within(5);
        assert_eq!(stats.total_hits(), u64::MAX);
    }

    #[test]
    fn registry_shares_counters_by_name_and_snapshots_them() {
        let registry = StatsRegistry::default();
        registry.rule("d.k").add_not_within(2);
        registry.rule("d.k").add_not_within(3);
        registry.counter(names::CONFIG_LOAD_SUCCESS).add(1);
        registry.gauge("g", Arc::new(|| 7));
        let snapshot = registry.snapshot();
        assert_eq!(
            snapshot.counter("ratelimit.service.rate_limit.d.k.total_hits"),
            Some(5)
        );
        assert_eq!(snapshot.counter(names::CONFIG_LOAD_SUCCESS), Some(1));
        assert!(snapshot.samples.contains(&Sample {
            name: Name::Plain("g".into()),
            value: Value::Gauge(7)
        }));
        let names: Vec<String> = snapshot
            .samples
            .iter()
            .map(|s| s.name.to_string())
            .collect();
        assert!(names.windows(2).all(|w| w[0] <= w[1]), "{names:?}");
    }

    #[test]
    fn names_from_requests_fold_past_the_bound() {
        let registry = StatsRegistry::new(2);
        registry.rule("d.configured").add_not_within(1);
        for value in ["a", "b", "c", "d"] {
            let key = format!("d.user_{value}");
            registry.request_rule(&key, "d.user").add_not_within(1);
        }
        registry
            .request_rule("d.user_a", "d.user")
            .add_not_within(1);
        registry
            .request_counter(
                &names::domain_not_found("x"),
                &names::domain_not_found_overflow(),
            )
            .add(1);
        let snapshot = registry.snapshot();
        let hits =
            |key: &str| snapshot.counter(&format!("ratelimit.service.rate_limit.{key}.total_hits"));
        assert_eq!(
            hits("d.user_a"),
            Some(2),
            "a name already kept is found again"
        );
        assert_eq!(hits("d.user_b"), Some(1));
        assert_eq!(hits("d.user_c"), None);
        assert_eq!(hits("d.user_overflow"), Some(2));
        assert_eq!(
            hits("d.configured"),
            Some(1),
            "configuration is never folded"
        );
        assert_eq!(
            snapshot.counter("ratelimit.service.rate_limit._overflow.domain_not_found"),
            Some(1)
        );
        assert_eq!(snapshot.counter(names::STATS_OVERFLOW), Some(3));
    }
}
