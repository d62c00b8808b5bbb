//! The write-behind bound, checked on a model: replicas with their own [`Table`]s, one
//! store, flushes every `F` milliseconds that take `D` to come back (the next one waits
//! for it), and requests at random times. However they fall, a key admits at least what
//! the exact mode admits (`min(limit, requests)`), at most `limit` plus the requests the
//! fleet admitted in the worst interval of `2F + D` (`2F + 3D` when a flush takes `F` or
//! longer), and the store ends with every hit, once.

use std::collections::HashMap;

use proptest::prelude::*;
use ratelimit_core::{Code, Config, CounterOp, Descriptor, Limiter, Request, Settings, UnixMillis};

use super::table::{Batch, Table};

/// The start of an hour: the model's window never ends.
const BASE_MS: u64 = 1_699_999_200_000;

fn limiter(limit: u32) -> Limiter {
    let yaml = format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
    );
    Limiter::new(
        &Config::from_yaml("m.yaml", &yaml).unwrap(),
        Settings::default(),
    )
}

/// The store: upstream's counters, as INCRBY, the refund script and GET change them.
fn run_on(store: &mut HashMap<String, u64>, batch: &Batch) -> Vec<u64> {
    let run = |i: &ratelimit_core::Increment, store: &mut HashMap<String, u64>| {
        let count = store.entry(i.key.clone()).or_default();
        match i.op {
            CounterOp::Add => *count += i.hits,
            CounterOp::Refund => *count = count.saturating_sub(i.hits),
            _ => {}
        }
        *count
    };
    batch.increments.iter().map(|i| run(i, store)).collect()
}

/// Whether `limiter` admits a request of replica `table` at `ms`.
fn decide(limiter: &Limiter, table: &Table, ms: u64) -> bool {
    let request = Request::new("d", vec![Descriptor::new([("k", "hot")])]);
    let plan = limiter.plan(&request, UnixMillis(BASE_MS + ms)).unwrap();
    let totals: Vec<u64> = plan.increments().iter().map(|i| table.apply(i).0).collect();
    plan.decide(&totals).overall_code == Code::Ok
}

/// The most of `times` (sorted) within any interval of `length`.
fn most_within(times: &[u64], length: u64) -> usize {
    let mut start = 0;
    let mut most = 0;
    for end in 0..times.len() {
        while times[end] - times[start] > length {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn admissions_stay_within_the_written_bound(
        replicas in 1usize..4,
        flush_ms in 10u64..200,
        latency_ms in 0u64..50,
        limit in 1u32..40,
        mut arrivals in prop::collection::vec((0usize..4, 0u64..1_500), 0..200),
    ) {
        let limiter = limiter(limit);
        let tables: Vec<Table> = (0..replicas).map(|_| Table::new(1_000)).collect();
        let mut store = HashMap::new();
        // Flushes in flight: (settle at, replica, batch, totals).
        let mut flying: Vec<(u64, usize, Batch, Vec<u64>)> = Vec::new();
        arrivals.sort_by_key(|&(_, at)| at);
        let mut next = arrivals.iter().peekable();
        let mut admitted = Vec::new();
        let end = 1_500 + 2 * flush_ms + latency_ms;
        for ms in 0..=end {
            flying.retain(|(at, replica, batch, totals)| {
                let due = *at == ms;
                if due {
                    tables[*replica].settle(batch, totals);
                }
                !due
            });
            for (replica, table) in tables.iter().enumerate() {
                // Each replica flushes on its own phase, one flush at a time.
                let busy = flying.iter().any(|(_, r, ..)| *r == replica);
                let phase = ms + replica as u64 * flush_ms / replicas as u64;
                if !busy && phase.is_multiple_of(flush_ms) {
                    let (batch, drained) = table.drain((BASE_MS + ms) / 1_000);
                    prop_assert_eq!(drained.dropped, 0);
                    let totals = run_on(&mut store, &batch);
                    if latency_ms == 0 {
                        table.settle(&batch, &totals);
                    } else {
                        flying.push((ms + latency_ms, replica, batch, totals));
                    }
                }
            }
            while let Some(&(replica, _)) = next.next_if(|&&(_, at)| at == ms) {
                if decide(&limiter, &tables[replica % replicas], ms) {
                    admitted.push(ms);
                }
            }
        }
        // The last flushes: whatever is pending goes.
        for (_, replica, batch, totals) in flying.drain(..) {
            tables[replica].settle(&batch, &totals);
        }
        for table in &tables {
            let (batch, _) = table.drain((BASE_MS + end) / 1_000);
            let totals = run_on(&mut store, &batch);
            table.settle(&batch, &totals);
        }
        let (limit, requests) = (limit as usize, arrivals.len());
        prop_assert!(admitted.len() >= limit.min(requests), "{admitted:?}");
        let window = match latency_ms < flush_ms {
            true => 2 * flush_ms + latency_ms,
            false => 2 * flush_ms + 3 * latency_ms,
        };
        let bound = limit + most_within(&admitted, window);
        prop_assert!(admitted.len() <= bound, "{} > {bound}", admitted.len());
        let counted: u64 = store.values().sum();
        prop_assert_eq!(counted, requests as u64, "every hit reached the store once");
    }
}
