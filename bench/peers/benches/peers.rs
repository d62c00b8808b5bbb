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
use scenarios::{DISTINCT, NOW, distinct, engine, one_entry, two_entries, wildcard};

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

fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("one_entry_hot_key");
    let (core, store) = engine();
    let request = one_entry();
    group.bench_function("ratelimit-core", |b| {
        b.iter(|| {
            core.should_rate_limit(black_box(&request), &store, NOW)
                .unwrap()
        })
    });
    let gov = governor();
    let key = "alice".to_owned();
    group.bench_function("governor", |b| {
        b.iter(|| gov.check_key(black_box(&key)).is_ok())
    });
    let lim = limitador(&["user"]);
    let ctx = context(&[("user", "alice".into())]);
    let namespace = "bench".into();
    group.bench_function("limitador", |b| {
        b.iter(|| {
            lim.check_rate_limited_and_update(&namespace, black_box(&ctx), 1)
                .unwrap()
        })
    });
    group.finish();
}

fn nested(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_entries_hot_key");
    let (core, store) = engine();
    let request = two_entries();
    group.bench_function("ratelimit-core", |b| {
        b.iter(|| {
            core.should_rate_limit(black_box(&request), &store, NOW)
                .unwrap()
        })
    });
    let gov = governor();
    let key = "/api|alice".to_owned();
    group.bench_function("governor", |b| {
        b.iter(|| gov.check_key(black_box(&key)).is_ok())
    });
    let lim = limitador(&["route", "user"]);
    let ctx = context(&[("route", "/api".into()), ("user", "alice".into())]);
    let namespace = "bench".into();
    group.bench_function("limitador", |b| {
        b.iter(|| {
            lim.check_rate_limited_and_update(&namespace, black_box(&ctx), 1)
                .unwrap()
        })
    });
    group.finish();
}

/// A value pattern: governor has no rules, so only limitador (a CEL condition) compares.
fn pattern(c: &mut Criterion) {
    let mut group = c.benchmark_group("wildcard");
    let (core, store) = engine();
    let request = wildcard();
    group.bench_function("ratelimit-core", |b| {
        b.iter(|| {
            core.should_rate_limit(black_box(&request), &store, NOW)
                .unwrap()
        })
    });
    let lim = limitador_when(&["path.startsWith('/api/v1/users/')"], &["path"]);
    let ctx = context(&[("path", "/api/v1/users/12345".into())]);
    let namespace = "bench".into();
    group.bench_function("limitador", |b| {
        b.iter(|| {
            lim.check_rate_limited_and_update(&namespace, black_box(&ctx), 1)
                .unwrap()
        })
    });
    group.finish();
}

fn many_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("distinct_10000_keys");
    let (core, store) = engine();
    let requests = distinct();
    let mut next = requests.iter().cycle();
    group.bench_function("ratelimit-core", |b| {
        b.iter(|| {
            core.should_rate_limit(black_box(next.next().unwrap()), &store, NOW)
                .unwrap()
        })
    });
    let gov = governor();
    let keys: Vec<String> = (0..DISTINCT).map(|i| format!("client-{i}")).collect();
    let mut next = keys.iter().cycle();
    group.bench_function("governor", |b| {
        b.iter(|| gov.check_key(black_box(next.next().unwrap())).is_ok())
    });
    let lim = limitador(&["client"]);
    let contexts: Vec<Context> = keys
        .iter()
        .map(|k| context(&[("client", k.clone())]))
        .collect();
    let mut next = contexts.iter().cycle();
    let namespace = "bench".into();
    group.bench_function("limitador", |b| {
        b.iter(|| {
            lim.check_rate_limited_and_update(&namespace, black_box(next.next().unwrap()), 1)
                .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, hot_key, nested, pattern, many_keys);
criterion_main!(benches);
