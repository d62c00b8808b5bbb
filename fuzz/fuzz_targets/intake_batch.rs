//! The intake's batch validator (`POST /operations` bodies) on arbitrary bytes.
//!
//! Invariants: nothing panics; an accepted batch counts its kinds right, holds 1 to
//! MAX_OPERATIONS operations and, read again by a plain JSON parser, is an array of that
//! many objects with exactly `operation` (buy/sell), a non-negative `unit-cost` and a
//! `quantity` from 1 to 2^64-1; its rate-limit descriptors add up to the batch; a lower
//! maximum refuses it as too many exactly when it is above it; a refusal lists at least
//! one problem and serializes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use operations_intake::batch::{self, Batch, Kind, Rejection};
use operations_intake::limits;
use serde_json::Value;

const MAX: usize = 1_000;

fuzz_target!(|data: &[u8]| {
    let batch = match batch::parse(data, MAX) {
        Ok(batch) => batch,
        Err(Rejection::Invalid(problems)) => {
            assert!(!problems.is_empty());
            serde_json::to_string(&problems).expect("problems serialize");
            // The maximum is checked before the operations: a lower one may only turn
            // operation problems into "too many".
            match batch::parse(data, 1) {
                Err(Rejection::Invalid(again)) => assert_eq!(again, problems),
                Err(Rejection::TooMany { count, max: 1 }) => assert!(count > 1),
                other => panic!("{other:?} with a maximum of 1, invalid with {MAX}"),
            }
            return;
        }
        Err(Rejection::TooMany { count, max }) => {
            assert_eq!(max, MAX);
            assert!(count > MAX);
            return;
        }
    };
    check(&batch, data);
    let with_one = batch::parse(data, 1);
    if batch.count == 1 {
        assert_eq!(with_one, Ok(batch));
    } else {
        assert_eq!(
            with_one,
            Err(Rejection::TooMany {
                count: batch.count as usize,
                max: 1
            })
        );
    }
});

fn check(batch: &Batch, data: &[u8]) {
    assert!((1..=MAX as u64).contains(&batch.count), "{batch:?}");
    assert_eq!(batch.count, batch.buys + batch.sells, "{batch:?}");
    let kinds: Vec<(Kind, u64)> = batch.kinds().collect();
    assert!(kinds.iter().all(|&(_, n)| n > 0));
    assert_eq!(kinds.iter().map(|&(_, n)| n).sum::<u64>(), batch.count);

    let descriptors = limits::descriptors("client", batch);
    assert_eq!(descriptors.len(), 1 + kinds.len());
    assert_eq!(descriptors[0].hits_addend, Some(batch.count));
    let per_kind: u64 = descriptors[1..]
        .iter()
        .map(|d| d.hits_addend.unwrap())
        .sum();
    assert_eq!(per_kind, batch.count);

    // Numbers beyond f64's range are valid JSON that serde_json's `Value` refuses.
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let items = value.as_array().expect("an accepted batch is an array");
    assert_eq!(items.len() as u64, batch.count);
    let mut buys = 0;
    for item in items {
        let fields = item.as_object().expect("operations are objects");
        assert_eq!(fields.len(), 3, "{item}");
        match fields["operation"].as_str() {
            Some("buy") => buys += 1,
            Some("sell") => {}
            other => panic!("operation {other:?} accepted"),
        }
        let quantity = fields["quantity"].as_u64().expect("a whole quantity");
        assert!(quantity >= 1, "{item}");
        let cost = &fields["unit-cost"];
        assert!(cost.is_number(), "{item}");
        assert!(
            !(cost.as_f64().unwrap() < 0.0),
            "negative cost accepted: {item}"
        );
    }
    assert_eq!(buys, batch.buys);
}
