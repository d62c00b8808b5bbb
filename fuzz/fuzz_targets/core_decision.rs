//! The decision engine on structured input: a sequence of requests, a clock moving
//! forward, the fixed rules of rules/*.yaml (wildcards, nesting, shadow mode,
//! detailed_metric, replaces, quota mode...) and the global settings.
//!
//! Each request is decided twice, by two limiters with the same settings: in process
//! (`should_rate_limit` on a `MemoryStore`) and the remote way (`plan`, then
//! `increments()` run against a model counter store here, then `decide`).
//!
//! Invariants: nothing panics; statuses are sane (`check_response`: remaining never
//! above the limit...); planned increments carry the domain and the current window; both
//! paths fail alike and, without the local over-limit cache (which only the remote path
//! has), answer the same.
#![no_main]

use ratelimit_core::UnixMillis;
use std::collections::HashMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ratelimit_core::{
    Descriptor, Entry, LimitOverride, Limiter, MemoryStore, Request, RequestError, Response,
    Settings, Unit,
};
use ratelimit_fuzz::{DECISION_CONFIG, EPOCH, check_response};

const DOMAINS: &[&str] = &["edge", "api", "missing"];
const KEYS: &[&str] = &[
    "remote_address",
    "user",
    "method",
    "path",
    "plan",
    "tenant",
    "region",
    "zone",
    "generic_key",
    "client_id",
    "operation",
];
const VALUES: &[&str] = &[
    "192.0.2.66",
    "127.0.0.1",
    "10.0.0.1",
    "alice",
    "POST",
    "GET",
    "/a/b",
    "/api/v1/reports/x",
    "/downloads/f",
    "/x/shadow",
    "premium",
    "free",
    "eu",
    "z1",
    "zz",
    "all",
    "buy",
    "sell",
    "",
];

#[derive(Debug, Arbitrary)]
struct Input {
    cache_key_prefix: bool,
    stop_increment_when_over_limit: bool,
    shadow_mode: bool,
    quota_mode: bool,
    local_cache: bool,
    start: u16,
    steps: Vec<Step>,
}

#[derive(Debug, Arbitrary)]
struct Step {
    advance: Advance,
    domain: Text,
    hits_addend: u32,
    descriptors: Vec<DescriptorIn>,
}

#[derive(Debug, Arbitrary)]
enum Advance {
    None,
    Seconds(u8),
    Minutes(u8),
    Hours(u8),
}

/// Mostly a name the rules know, else anything.
#[derive(Debug, Arbitrary)]
enum Text {
    Known(u8),
    Any(String),
}

#[derive(Debug, Arbitrary)]
struct DescriptorIn {
    entries: Vec<(Text, Text)>,
    hits_addend: Option<u64>,
    /// A refund (Envoy's `is_negative_hits`).
    negative_hits: bool,
    /// Requests per unit and an index into `Unit::ALL`.
    limit: Option<(u32, u8)>,
}

impl Text {
    fn get(&self, known: &[&str]) -> String {
        match self {
            Text::Known(i) => known[usize::from(*i) % known.len()].to_owned(),
            Text::Any(s) => s.clone(),
        }
    }
}

impl Advance {
    fn seconds(&self) -> u64 {
        match *self {
            Advance::None => 0,
            Advance::Seconds(n) => n.into(),
            Advance::Minutes(n) => u64::from(n) * 60,
            Advance::Hours(n) => u64::from(n) * 3_600,
        }
    }
}

fn request(step: &Step) -> Request {
    Request {
        domain: step.domain.get(DOMAINS),
        hits_addend: step.hits_addend,
        descriptors: step
            .descriptors
            .iter()
            .take(8)
            .map(|d| Descriptor {
                entries: d
                    .entries
                    .iter()
                    .take(5)
                    .map(|(k, v)| Entry {
                        key: k.get(KEYS),
                        value: v.get(VALUES),
                    })
                    .collect(),
                hits_addend: d.hits_addend,
                negative_hits: d.negative_hits,
                limit: d
                    .limit
                    .as_ref()
                    .map(|(requests_per_unit, unit)| LimitOverride {
                        requests_per_unit: *requests_per_unit,
                        unit: Unit::ALL[usize::from(*unit) % Unit::ALL.len()],
                    }),
            })
            .collect(),
    }
}

/// The remote store of the plan path: counters by key, with their window end.
#[derive(Default)]
struct Model {
    counters: HashMap<String, (u64, u64)>,
    /// A key came back for a window of another length after the first one ended (keys
    /// carry the window start, not its length): `MemoryStore` then either still adds to
    /// the old count or starts over, depending on whether it has swept that counter
    /// yet, so the two paths may rightly differ from here on.
    diverged: bool,
}

impl Model {
    fn get(&self, key: &str, now: u64) -> u64 {
        match self.counters.get(key) {
            Some(&(count, end)) if end > now => count,
            _ => 0,
        }
    }

    /// A refund: down by `hits`, never below 0; a counter nobody has stays none.
    fn refund(&mut self, key: &str, hits: u64, now: u64) -> u64 {
        match self.counters.get_mut(key) {
            Some((count, end)) if *end > now => {
                *count = count.saturating_sub(hits);
                *count
            }
            _ => 0,
        }
    }

    fn increment(&mut self, key: &str, hits: u64, window_end: u64, now: u64) -> u64 {
        match self.counters.get_mut(key) {
            Some((count, end)) => {
                if *end <= now {
                    self.diverged = true;
                }
                *count = count.saturating_add(hits);
                *count
            }
            None => {
                self.counters.insert(key.to_owned(), (hits, window_end));
                hits
            }
        }
    }
}

fn remote(
    limiter: &Limiter,
    model: &mut Model,
    request: &Request,
    now: u64,
    prefix: &str,
) -> Result<Response, RequestError> {
    let mut plan = limiter.plan(request, UnixMillis::from_secs(now))?;
    for increment in plan.increments() {
        let start = increment.window_end - increment.window.seconds();
        assert_eq!(
            increment.window.seconds(),
            increment.window.unit().seconds()
        );
        assert!(
            start <= now && now < increment.window_end,
            "{increment:?} at {now}"
        );
        assert_eq!(start % increment.window.seconds(), 0, "{increment:?}");
        assert!(
            increment
                .key
                .starts_with(&format!("{prefix}{}_", request.domain)),
            "{increment:?}"
        );
        assert!(increment.key.ends_with(&start.to_string()), "{increment:?}");
    }
    if plan.needs_current_counts() {
        let current: Vec<u64> = plan
            .increments()
            .iter()
            .map(|i| model.get(&i.key, now))
            .collect();
        plan.apply_current(&current);
    }
    let counts: Vec<u64> = plan
        .increments()
        .iter()
        .map(|i| match i.op.is_refund() {
            true => model.refund(&i.key, i.hits, now),
            false => model.increment(&i.key, i.hits, i.window_end, now),
        })
        .collect();
    Ok(plan.decide(&counts))
}

fuzz_target!(|input: Input| {
    let prefix = if input.cache_key_prefix { "rl:" } else { "" };
    let settings = Settings {
        cache_key_prefix: prefix.to_owned(),
        stop_cache_key_increment_when_overlimit: input.stop_increment_when_over_limit,
        shadow_mode: input.shadow_mode,
        quota_mode: input.quota_mode,
        local_cache_size_in_bytes: if input.local_cache { 4096 } else { 0 },
        ..Settings::default()
    };
    let in_process = Limiter::new(&DECISION_CONFIG, settings.clone());
    let planned = Limiter::new(&DECISION_CONFIG, settings);
    let store = MemoryStore::default();
    let mut model = Model::default();
    let mut now = EPOCH + u64::from(input.start);
    for step in input.steps.iter().take(48) {
        now += step.advance.seconds();
        let request = request(step);
        let local = in_process.should_rate_limit(&request, &store, UnixMillis::from_secs(now));
        let remote = remote(&planned, &mut model, &request, now, prefix);
        match (&local, &remote) {
            (Ok(local), Ok(remote)) => {
                check_response(&request, local);
                check_response(&request, remote);
                if !input.local_cache && !model.diverged {
                    assert_eq!(
                        local, remote,
                        "in process and planned differ for {request:?} at {now}"
                    );
                }
            }
            // Refusals (no domain, no descriptor, past the bounds) are fine, if alike.
            (Err(a), Err(b)) => {
                assert_eq!(a, b);
                assert_ne!(*a, RequestError::NoConfiguration);
            }
            _ => panic!("one path failed: {local:?} / {remote:?}"),
        }
        if request.domain.is_empty() {
            assert_eq!(local, Err(RequestError::EmptyDomain));
        }
    }
});
