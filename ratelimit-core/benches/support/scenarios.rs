//! The decision workloads shared by the core's benchmark and the peer comparison.

use ratelimit_core::{Config, Descriptor, Limiter, MemoryStore, Request, Settings};

/// Rules large enough that no workload ever goes over its limit: every iteration takes
/// the full decision path.
pub const RULES: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4000000000}
  - key: route
    value: /api
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 4000000000}
  - key: path
    value: /api/v1/users/*
    rate_limit: {unit: minute, requests_per_unit: 4000000000}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 4000000000}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 4000000000, algorithm: token_bucket}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 4000000000, algorithm: sliding_window}
";

/// A fixed clock: 20 seconds into a minute.
pub const NOW: u64 = 1_700_000_000;

/// How many distinct values the high-cardinality workload cycles through.
pub const DISTINCT: usize = 10_000;

/// A limiter on [`RULES`] and an empty store.
pub fn engine() -> (Limiter, MemoryStore) {
    let config = Config::from_yaml("bench.yaml", RULES).expect("bench rules are valid");
    (
        Limiter::new(&config, Settings::default()),
        MemoryStore::default(),
    )
}

/// One entry, one hot key.
pub fn one_entry() -> Request {
    Request::new("bench", vec![Descriptor::new([("user", "alice")])])
}

/// Two nested entries, one hot key.
pub fn two_entries() -> Request {
    Request::new(
        "bench",
        vec![Descriptor::new([("route", "/api"), ("user", "alice")])],
    )
}

/// One entry matched by a wildcard rule.
pub fn wildcard() -> Request {
    Request::new(
        "bench",
        vec![Descriptor::new([("path", "/api/v1/users/12345")])],
    )
}

/// [`DISTINCT`] one-entry requests, each with its own counter.
pub fn distinct() -> Vec<Request> {
    distinct_on("client")
}

/// [`DISTINCT`] one-entry requests on the rule of `key`, each with its own counter.
pub fn distinct_on(key: &str) -> Vec<Request> {
    (0..DISTINCT)
        .map(|i| {
            Request::new(
                "bench",
                vec![Descriptor::new([(key, format!("client-{i}"))])],
            )
        })
        .collect()
}

/// [`DISTINCT`] two-entry requests (one route, many users), each with its own counter.
pub fn two_entries_distinct() -> Vec<Request> {
    (0..DISTINCT)
        .map(|i| {
            let user = format!("client-{i}");
            Request::new(
                "bench",
                vec![Descriptor::new([
                    ("route", "/api".to_owned()),
                    ("user", user),
                ])],
            )
        })
        .collect()
}

/// One entry, one hot key, on the rule of `key` (`bucket`, `sliding`).
pub fn one_entry_on(key: &str) -> Request {
    Request::new("bench", vec![Descriptor::new([(key, "alice")])])
}
