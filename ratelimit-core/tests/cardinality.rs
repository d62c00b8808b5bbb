//! Statistics keyed by request data stay bounded: 200 000 random unknown domains and
//! 200 000 random `detailed_metric` values leave the registry at MAX_STAT_KEYS names and
//! the process's resident memory flat. (Its own test binary: nothing else allocates.)

use ratelimit_core::UnixMillis;
use ratelimit_core::stats::{DEFAULT_MAX_STAT_KEYS, names};
use ratelimit_core::{Config, Descriptor, Limiter, MemoryStore, Request, Settings};

const NOW: u64 = 1_700_000_000;
const RULES: &str = "domain: c\ndescriptors:\n  - key: value\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// `n` requests with a random domain and `n` with a random detailed value.
fn random_traffic(limiter: &Limiter, store: &MemoryStore, seed: u64, n: usize) {
    let mut state = seed;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        format!("{state:016x}")
    };
    for _ in 0..n {
        let unknown = Request::new(next(), vec![Descriptor::new([("value", "x")])]);
        limiter
            .should_rate_limit(&unknown, store, UnixMillis::from_secs(NOW))
            .unwrap();
        let detailed = Request::new("c", vec![Descriptor::new([("value", next())])]);
        limiter
            .should_rate_limit(&detailed, store, UnixMillis::from_secs(NOW))
            .unwrap();
    }
}

#[test]
fn random_domains_and_values_keep_statistics_and_memory_flat() {
    let limiter = Limiter::new(
        &Config::from_yaml("c.yaml", RULES).unwrap(),
        Settings::default(),
    );
    let store = MemoryStore::new(10_000);
    // Fill every bound first: the registry's names, the store's counters.
    random_traffic(&limiter, &store, 1, 20_000);
    let before = resident_bytes();
    random_traffic(&limiter, &store, 2, 180_000);
    let after = resident_bytes();

    let snapshot = limiter.stats().snapshot();
    let overflow = snapshot.counter(names::STATS_OVERFLOW).unwrap();
    assert_eq!(overflow, 400_000 - DEFAULT_MAX_STAT_KEYS as u64);
    // Six statistics per rule key, one per counter name, a few timers and gauges.
    assert!(
        snapshot.samples.len() < DEFAULT_MAX_STAT_KEYS * 6 + 100,
        "{} statistics",
        snapshot.samples.len()
    );
    let folded = snapshot
        .counter("ratelimit.service.rate_limit._overflow.domain_not_found")
        .unwrap()
        + snapshot
            .counter("ratelimit.service.rate_limit.c.value_overflow.total_hits")
            .unwrap();
    assert_eq!(folded, overflow);
    let growth = after.saturating_sub(before);
    assert!(
        growth < 4 << 20,
        "resident memory grew by {growth} bytes over 360 000 requests"
    );
}
