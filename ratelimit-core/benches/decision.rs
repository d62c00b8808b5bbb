//! Cost of one decision against the embedded store (`cargo bench -p ratelimit-core`).
//! The comparison with governor and limitador is `cargo bench -p ratelimit-peer-bench`.

#[path = "support/scenarios.rs"]
mod scenarios;

use ratelimit_core::UnixMillis;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use scenarios::{
    NOW, engine, keys, one_entry, one_entry_on, prebuilt_on, set_value, two_entries,
    two_entries_prebuilt, wildcard,
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
                    .should_rate_limit(black_box(&request), &store, UnixMillis::from_secs(NOW))
                    .unwrap()
            })
        });
    }
    // 10 000 counters: one request whose value is set from the key list each time.
    let keys = keys();
    for (name, mut request) in [
        ("distinct_10000", one_entry_on("client")),
        ("two_entries_distinct_10000", two_entries()),
        ("token_bucket_distinct_10000", one_entry_on("bucket")),
    ] {
        let (limiter, store) = engine();
        let mut next = keys.iter().cycle();
        group.bench_function(name, |b| {
            b.iter(|| {
                set_value(&mut request, next.next().unwrap());
                limiter
                    .should_rate_limit(black_box(&request), &store, UnixMillis::from_secs(NOW))
                    .unwrap()
            })
        });
    }
    // The same counters through 10 000 requests built ahead: each decision also reads a
    // request that is cold in the cache.
    for (name, requests) in [
        ("distinct_10000_prebuilt", prebuilt_on("client")),
        (
            "two_entries_distinct_10000_prebuilt",
            two_entries_prebuilt(),
        ),
    ] {
        let (limiter, store) = engine();
        let mut next = requests.iter().cycle();
        group.bench_function(name, |b| {
            b.iter(|| {
                limiter
                    .should_rate_limit(
                        black_box(next.next().unwrap()),
                        &store,
                        UnixMillis::from_secs(NOW),
                    )
                    .unwrap()
            })
        });
    }
    group.finish();

    let (limiter, _) = engine();
    let request = two_entries();
    c.bench_function("plan_two_entries", |b| {
        b.iter(|| {
            limiter
                .plan(black_box(&request), UnixMillis::from_secs(NOW))
                .unwrap()
        })
    });
}

criterion_group!(benches, decisions);
criterion_main!(benches);
