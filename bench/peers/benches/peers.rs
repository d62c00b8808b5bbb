//! ratelimit-core against governor's keyed limiter and limitador's in-memory limiter, on
//! the same workloads, in one binary, so the report is a ratio measured in one run. The
//! last line of the output is `prepared_over_governor <ratio>`: the worst, over the
//! prepared-check workloads, of the prepared check's mean time over governor's.

#[path = "../../../ratelimit-core/benches/support/scenarios.rs"]
#[allow(dead_code)] // shared with the core's own benchmark, which uses all of it
mod scenarios;

use ratelimit_core::UnixMillis;
use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use criterion::Criterion;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use limitador::limit::{Context, Expression, Limit, Predicate};
use ratelimit_core::Request;
use ratelimit_peer_bench::WORKLOADS;
use scenarios::{
    DISTINCT, NOW, engine, keys, one_entry, one_entry_on, set_value, two_entries,
    two_entries_prebuilt, wildcard,
};

fn governor() -> DefaultKeyedRateLimiter<String> {
    RateLimiter::keyed(Quota::per_minute(NonZeroU32::new(4_000_000_000).unwrap()))
}

fn limitador(variables: &[&str]) -> limitador::RateLimiter {
    limitador_when(&[], variables)
}

fn limitador_when(conditions: &[&str], variables: &[&str]) -> limitador::RateLimiter {
    let limiter = limitador::RateLimiter::new(DISTINCT as u64 * 2);
    let conditions = conditions.iter().map(|c| Predicate::parse(*c).unwrap());
    let variables = variables.iter().map(|v| Expression::parse(*v).unwrap());
    limiter.add_limit(Limit::new(
        "bench",
        4_000_000_000,
        60,
        conditions,
        variables,
    ));
    limiter
}

fn context(pairs: &[(&str, String)]) -> Context<'static> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    Context::from(map)
}

/// What the core decides in a workload: one request on a hot key, or one request whose
/// last value is set from a list of keys before each decision.
enum Core {
    Hot(Request),
    Keyed(Request, Vec<String>),
    /// Requests built ahead and cycled through, cold in the cache.
    Prebuilt(Vec<Request>),
}

/// One workload on each engine that can express it. Every engine cycles over its own
/// prepared inputs (one input: a hot key); over many keys, the core and governor read
/// one string per decision from a list of 10 000.
fn compare(
    c: &mut Criterion,
    name: &str,
    core_input: Core,
    governor_keys: Option<Vec<String>>,
    limitador_engine: Option<(limitador::RateLimiter, Vec<Context<'static>>)>,
) {
    let mut group = c.benchmark_group(name);
    let (core, store) = engine();
    match core_input {
        Core::Hot(request) => group.bench_function("ratelimit-core", |b| {
            b.iter(|| {
                core.should_rate_limit(black_box(&request), &store, UnixMillis::from_secs(NOW))
                    .unwrap()
            })
        }),
        Core::Keyed(mut request, keys) => {
            let mut next = keys.iter().cycle();
            group.bench_function("ratelimit-core", |b| {
                b.iter(|| {
                    set_value(&mut request, next.next().unwrap());
                    core.should_rate_limit(black_box(&request), &store, UnixMillis::from_secs(NOW))
                        .unwrap()
                })
            })
        }
        Core::Prebuilt(requests) => {
            let mut next = requests.iter().cycle();
            group.bench_function("ratelimit-core", |b| {
                b.iter(|| {
                    core.should_rate_limit(
                        black_box(next.next().unwrap()),
                        &store,
                        UnixMillis::from_secs(NOW),
                    )
                    .unwrap()
                })
            })
        }
    };
    if let Some(keys) = governor_keys {
        let gov = governor();
        let mut next = keys.iter().cycle();
        group.bench_function("governor", |b| {
            b.iter(|| gov.check_key(black_box(next.next().unwrap())).is_ok())
        });
    }
    if let Some((limitador_engine, contexts)) = limitador_engine {
        let namespace = "bench".into();
        let mut next = contexts.iter().cycle();
        group.bench_function("limitador", |b| {
            b.iter(|| {
                limitador_engine
                    .check_rate_limited_and_update(&namespace, black_box(next.next().unwrap()), 1)
                    .unwrap()
            })
        });
    }
    group.finish();
}

fn workloads(c: &mut Criterion) {
    compare(
        c,
        "one_entry_hot_key",
        Core::Hot(one_entry()),
        Some(vec!["alice".into()]),
        Some((
            limitador(&["user"]),
            vec![context(&[("user", "alice".into())])],
        )),
    );
    compare(
        c,
        "two_entries_hot_key",
        Core::Hot(two_entries()),
        Some(vec!["/api|alice".into()]),
        Some((
            limitador(&["route", "user"]),
            vec![context(&[
                ("route", "/api".into()),
                ("user", "alice".into()),
            ])],
        )),
    );
    // Governor has no rules, so only limitador (a CEL condition) takes the pattern.
    compare(
        c,
        "wildcard",
        Core::Hot(wildcard()),
        None,
        Some((
            limitador_when(&["path.startsWith('/api/v1/users/')"], &["path"]),
            vec![context(&[("path", "/api/v1/users/12345".into())])],
        )),
    );
    let keys = keys();
    let contexts = keys
        .iter()
        .map(|k| context(&[("client", k.clone())]))
        .collect();
    compare(
        c,
        "distinct_10000_keys",
        Core::Keyed(one_entry_on("client"), keys.clone()),
        Some(keys.clone()),
        Some((limitador(&["client"]), contexts)),
    );
    let route_keys: Vec<String> = keys.iter().map(|k| format!("/api|{k}")).collect();
    let route_contexts = keys
        .iter()
        .map(|k| context(&[("route", "/api".into()), ("user", k.clone())]))
        .collect();
    compare(
        c,
        "two_entries_10000_keys",
        Core::Keyed(two_entries(), keys.clone()),
        Some(route_keys),
        Some((limitador(&["route", "user"]), route_contexts)),
    );
    // The core alone: the same counters through 10 000 requests built ahead.
    compare(
        c,
        "two_entries_10000_keys_prebuilt",
        Core::Prebuilt(two_entries_prebuilt()),
        None,
        None,
    );
    // Governor is a keyed GCRA, so these are like for like; limitador has no bucket.
    compare(
        c,
        "token_bucket_hot_key",
        Core::Hot(one_entry_on("bucket")),
        Some(vec!["alice".into()]),
        None,
    );
    compare(
        c,
        "token_bucket_10000_keys",
        Core::Keyed(one_entry_on("bucket"), keys.clone()),
        Some(keys),
        None,
    );
}

/// The prepared keyed check against governor's `check_key`, workload by workload.
fn prepared_workloads(c: &mut Criterion) {
    for workload in WORKLOADS {
        let mut group = c.benchmark_group(format!("prepared_{}", workload.name));
        let mut prepared = workload.prepared();
        group.bench_function("prepared", |b| b.iter(|| black_box(prepared())));
        let mut governor = workload.governor();
        group.bench_function("governor", |b| b.iter(|| black_box(governor())));
        group.finish();
    }
}

/// Where criterion writes its estimates: `<target>/criterion`.
fn output_directory() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("criterion")
}

/// The mean of one benchmark's run, in nanoseconds, from criterion's estimates, when it
/// ran after `since` (a benchmark a filter left out keeps an earlier run's).
fn mean_ns(directory: &Path, group: &str, function: &str, since: SystemTime) -> Option<f64> {
    let path = directory
        .join(group)
        .join(function)
        .join("new/estimates.json");
    if std::fs::metadata(&path).and_then(|m| m.modified()).ok()? < since {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let mean = &text[text.find("\"mean\"")?..];
    let estimate = &mean[mean.find("\"point_estimate\":")? + "\"point_estimate\":".len()..];
    let end = estimate.find([',', '}'])?;
    estimate[..end].trim().parse().ok()
}

fn main() {
    let started = SystemTime::now();
    let mut criterion = Criterion::default()
        .output_directory(&output_directory())
        .configure_from_args();
    workloads(&mut criterion);
    prepared_workloads(&mut criterion);
    criterion.final_summary();
    let directory = output_directory();
    let mut worst: Option<f64> = None;
    for workload in WORKLOADS {
        let group = format!("prepared_{}", workload.name);
        let prepared = mean_ns(&directory, &group, "prepared", started);
        let governor = mean_ns(&directory, &group, "governor", started);
        if let (Some(prepared), Some(governor)) = (prepared, governor) {
            let ratio = prepared / governor;
            println!(
                "{group}: prepared {prepared:.1} ns, governor {governor:.1} ns, ratio {ratio:.2}"
            );
            worst = Some(worst.map_or(ratio, |w| w.max(ratio)));
        }
    }
    match worst {
        Some(ratio) => println!("prepared_over_governor {ratio:.2}"),
        None => println!("prepared_over_governor none"),
    }
}
