//! The decision workloads shared by the core's benchmark and the peer comparison.

use ratelimit_core::{Config, Descriptor, Limiter, MemoryStore, Request, Settings};

/// Rules large enough that no workload ever goes over its limit: every iteration takes
/// the full decision path.
pub const RULES: &str = include_str!("rules.yaml");

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

/// The [`DISTINCT`] values the high-cardinality workloads cycle through: every engine
/// reads its keys from this one list.
pub fn keys() -> Vec<String> {
    (0..DISTINCT).map(|i| format!("client-{i}")).collect()
}

/// Sets the value of the last entry of `request`'s first descriptor: a high-cardinality
/// workload reuses one request, as a host builds each request fresh (and hot in cache)
/// from what it received. The copy is part of what is measured.
pub fn set_value(request: &mut Request, value: &str) {
    let entry = request.descriptors[0]
        .entries
        .last_mut()
        .expect("workload requests have an entry");
    entry.value.clear();
    entry.value.push_str(value);
}

/// [`DISTINCT`] one-entry requests on the rule of `key`, each built ahead and kept: the
/// same counters as [`keys`] with [`set_value`], but every decision also reads a request
/// that is cold in the cache (seven allocations for two entries).
pub fn prebuilt_on(key: &str) -> Vec<Request> {
    keys()
        .into_iter()
        .map(|value| Request::new("bench", vec![Descriptor::new([(key, value)])]))
        .collect()
}

/// [`DISTINCT`] two-entry requests (one route, many users), built ahead as in
/// [`prebuilt_on`].
pub fn two_entries_prebuilt() -> Vec<Request> {
    keys()
        .into_iter()
        .map(|user| {
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
