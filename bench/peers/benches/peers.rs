//! ratelimit-core against governor's keyed limiter and limitador's in-memory limiter, on
//! the same workloads, in one binary, so the report is a ratio measured in one run.

#[path = "../../../ratelimit-core/benches/support/scenarios.rs"]
mod scenarios;

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use limitador::limit::{Context, Expression, Limit, Predicate};
use ratelimit_core::Request;
use scenarios::{
    DISTINCT, NOW, distinct, distinct_on, engine, one_entry, one_entry_on, two_entries,
    two_entries_distinct, wildcard,
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

/// One workload on each engine that can express it. Every engine cycles over its own
/// prepared inputs (one input: a hot key).
fn compare(
    c: &mut Criterion,
    name: &str,
    requests: Vec<Request>,
    governor_keys: Option<Vec<String>>,
    limitador_engine: Option<(limitador::RateLimiter, Vec<Context<'static>>)>,
) {
    let mut group = c.benchmark_group(name);
    let (core, store) = engine();
    let mut next = requests.iter().cycle();
    group.bench_function("ratelimit-core", |b| {
        b.iter(|| {
            core.should_rate_limit(black_box(next.next().unwrap()), &store, NOW)
                .unwrap()
        })
    });
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
        vec![one_entry()],
        Some(vec!["alice".into()]),
        Some((
            limitador(&["user"]),
            vec![context(&[("user", "alice".into())])],
        )),
    );
    compare(
        c,
        "two_entries_hot_key",
        vec![two_entries()],
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
        vec![wildcard()],
        None,
        Some((
            limitador_when(&["path.startsWith('/api/v1/users/')"], &["path"]),
            vec![context(&[("path", "/api/v1/users/12345".into())])],
        )),
    );
    let keys: Vec<String> = (0..DISTINCT).map(|i| format!("client-{i}")).collect();
    let contexts = keys
        .iter()
        .map(|k| context(&[("client", k.clone())]))
        .collect();
    compare(
        c,
        "distinct_10000_keys",
        distinct(),
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
        two_entries_distinct(),
        Some(route_keys),
        Some((limitador(&["route", "user"]), route_contexts)),
    );
    // Governor is a keyed GCRA, so these are like for like; limitador has no bucket.
    compare(
        c,
        "token_bucket_hot_key",
        vec![one_entry_on("bucket")],
        Some(vec!["alice".into()]),
        None,
    );
    compare(
        c,
        "token_bucket_10000_keys",
        distinct_on("bucket"),
        Some(keys),
        None,
    );
}

criterion_group!(benches, workloads);
criterion_main!(benches);
