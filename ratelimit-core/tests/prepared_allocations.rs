//! A prepared check allocates nothing per call once its counter exists (this test binary
//! counts every allocation of the thread that decides).

use ratelimit_core::UnixMillis;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use ratelimit_core::config::{Domain, RateLimit, Rule};
use ratelimit_core::{Limiter, MemoryStore, Settings, Unit};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed to the system allocator unchanged; only a thread-local
// counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn deciding_allocates_nothing_for_every_algorithm() {
    let rules = Domain::new("api")
        .rule(Rule::key("fixed").limit(RateLimit::per(Unit::Minute, 1_000)))
        .rule(Rule::key("sliding").limit(RateLimit::per(Unit::Minute, 1_000).sliding_window()))
        .rule(Rule::key("bucket").limit(RateLimit::per(Unit::Minute, 1_000).token_bucket()))
        .rule(Rule::key("both").limits([
            RateLimit::per(Unit::Second, 1_000).name("second"),
            RateLimit::per(Unit::Hour, 1_000).name("hour"),
        ]));
    let limiter = Arc::new(Limiter::new(&rules.build().unwrap(), Settings::default()));
    let store = MemoryStore::default();
    let now_ms = 1_700_000_000_000;
    for key in ["fixed", "sliding", "bucket", "both"] {
        let check = limiter.prepare("api", &[key]).unwrap();
        // The first call creates the counters (and statistics names are made at
        // prepare); the calls after it only count.
        check
            .decide(&["alice"], &store, UnixMillis(now_ms))
            .unwrap();
        let before = allocations();
        for _ in 0..100 {
            assert!(
                check
                    .decide(&["alice"], &store, UnixMillis(now_ms))
                    .unwrap()
                    .allowed
            );
        }
        assert_eq!(allocations() - before, 0, "{key}: allocations in 100 calls");
    }
}
