//! Cost of one decision against the embedded store (`cargo bench -p ratelimit-core`).
//! The comparison with governor and limitador is `cargo bench -p ratelimit-peer-bench`.

#[path = "support/scenarios.rs"]
mod scenarios;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use scenarios::{
    NOW, distinct, distinct_on, engine, one_entry, one_entry_on, two_entries, two_entries_distinct,
    wildcard,
};

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for (name, request) in [
        ("one_entry", one_entry()),
        ("two_entries", two_entries()),
        ("wildcard", wildcard()),
        ("token_bucket", one_entry_on("bucket")),
        ("sliding_window", one_entry_on("sliding")),
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
    for (name, requests) in [
        ("distinct_10000", distinct()),
        ("two_entries_distinct_10000", two_entries_distinct()),
        ("token_bucket_distinct_10000", distinct_on("bucket")),
    ] {
        let (limiter, store) = engine();
        let mut next = requests.iter().cycle();
        group.bench_function(name, |b| {
            b.iter(|| {
                limiter
                    .should_rate_limit(black_box(next.next().unwrap()), &store, NOW)
                    .unwrap()
            })
        });
    }
    group.finish();

    let (limiter, _) = engine();
    let request = two_entries();
    c.bench_function("plan_two_entries", |b| {
        b.iter(|| limiter.plan(black_box(&request), NOW).unwrap())
    });
}

criterion_group!(benches, decisions);
criterion_main!(benches);
