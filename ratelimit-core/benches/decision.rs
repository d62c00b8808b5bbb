//! Cost of one decision against the embedded store (`cargo bench -p ratelimit-core`).
//! The comparison with governor and limitador is `cargo bench -p ratelimit-peer-bench`.

#[path = "support/scenarios.rs"]
mod scenarios;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use scenarios::{NOW, distinct, engine, one_entry, two_entries, wildcard};

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for (name, request) in [
        ("one_entry", one_entry()),
        ("two_entries", two_entries()),
        ("wildcard", wildcard()),
    ] {
        let (limiter, store) = engine();
        group.bench_function(name, |b| {
            b.iter(|| {
                limiter
                    .should_rate_limit(black_box(&request), &store, NOW)
                    .unwrap()
            })
        });
    }
    let (limiter, store) = engine();
    let requests = distinct();
    let mut next = requests.iter().cycle();
    group.bench_function("distinct_10000", |b| {
        b.iter(|| {
            limiter
                .should_rate_limit(black_box(next.next().unwrap()), &store, NOW)
                .unwrap()
        })
    });
    group.finish();

    let (limiter, _) = engine();
    let request = two_entries();
    c.bench_function("plan_two_entries", |b| {
        b.iter(|| limiter.plan(black_box(&request), NOW).unwrap())
    });
}

criterion_group!(benches, decisions);
criterion_main!(benches);
