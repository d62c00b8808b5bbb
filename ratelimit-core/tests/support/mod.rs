//! What the engine's test files share: limiters on rules (a fixture file in
//! `tests/fixtures/rules` or rules built with [`rules`]), descriptors, and requests at a
//! fixed time. Each test file uses part of it.
#![allow(dead_code)]

use ratelimit_core::UnixMillis;
use std::path::Path;

use ratelimit_core::{Code, Config, Descriptor, Limiter, MemoryStore, Request, Response, Settings};

/// 20 seconds into a minute: 1_699_999_980 starts it.
pub const NOW: u64 = 1_700_000_000;

/// The text of `tests/fixtures/rules/<name>.yaml`.
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rules")
        .join(format!("{name}.yaml"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Rules for `domain` with one top-level descriptor per `(key, fields)`; `fields` are the
/// descriptor's other fields in YAML flow style, e.g. `rate_limit: {unit: minute,
/// requests_per_unit: 5}`.
pub fn rules(domain: &str, descriptors: &[(&str, &str)]) -> String {
    let mut yaml = format!("domain: {domain}\ndescriptors:\n");
    for (key, fields) in descriptors {
        yaml.push_str(&format!("  - {{key: {key}, {fields}}}\n"));
    }
    yaml
}

/// A limiter on `yaml` (loaded as `test.yaml`) with `settings`.
pub fn limiter_with(yaml: &str, settings: Settings) -> Limiter {
    Limiter::new(&Config::from_yaml("test.yaml", yaml).unwrap(), settings)
}

/// A limiter on `yaml` with the default settings.
pub fn limiter(yaml: &str) -> Limiter {
    limiter_with(yaml, Settings::default())
}

/// A limiter on `yaml` and an empty store.
pub fn engine(yaml: &str) -> (Limiter, MemoryStore) {
    (limiter(yaml), MemoryStore::default())
}

/// A descriptor of `entries`.
pub fn d(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor::new(entries.iter().copied())
}

/// The answer to `descriptors` in `domain` at [`NOW`].
pub fn ask(
    limiter: &Limiter,
    store: &MemoryStore,
    domain: &str,
    descriptors: Vec<Descriptor>,
) -> Response {
    limiter
        .should_rate_limit(
            &Request::new(domain, descriptors),
            store,
            UnixMillis::from_secs(NOW),
        )
        .unwrap()
}

/// `(code, requests_per_unit, remaining)` of the first status; requests_per_unit is `None`
/// when no limit applied.
pub fn first(response: &Response) -> (Code, Option<u32>, u32) {
    let s = &response.statuses[0];
    (
        s.code,
        s.current_limit.as_ref().map(|l| l.requests_per_unit),
        s.limit_remaining,
    )
}

/// The value of the counter statistic `name`, if the limiter has it.
pub fn counter(limiter: &Limiter, name: &str) -> Option<u64> {
    let counters = limiter.stats().snapshot().counters();
    counters
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

/// The keys of the counters a request at `now` would increment.
pub fn planned_keys(limiter: &Limiter, request: &Request, now: u64) -> Vec<String> {
    let plan = limiter.plan(request, UnixMillis::from_secs(now)).unwrap();
    plan.increments().iter().map(|i| i.key.clone()).collect()
}
