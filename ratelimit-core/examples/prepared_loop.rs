//! A prepared keyed check in a loop: rules built in code, one check prepared for the
//! `user` key, then each call counts a user's hit with no descriptor matching and no
//! allocation, and answers allowed or not, hits left and seconds until reset.
//!
//! `cargo run -p ratelimit-core --example prepared_loop`

use ratelimit_core::UnixMillis;
use std::error::Error;
use std::sync::Arc;

use ratelimit_core::config::{Domain, RateLimit, Rule};
use ratelimit_core::{Limiter, MemoryStore, Settings, Unit};

fn main() -> Result<(), Box<dyn Error>> {
    // 2 requests a second per user, in bursts of up to 4.
    let limit = RateLimit::per(Unit::Second, 2).token_bucket().burst(4);
    let rules = Domain::new("api").rule(Rule::key("user").limit(limit));
    let limiter = Arc::new(Limiter::new(&rules.build()?, Settings::default()));
    let check = limiter.prepare("api", &["user"])?;
    let store = MemoryStore::default();

    let start_ms = 1_700_000_000_000;
    let mut allowed = [0u32; 2];
    for step in 0..10u64 {
        // A call every 100 ms for each user: 10 calls a second, 2 refilled.
        let now_ms = start_ms + step * 100;
        for (i, user) in ["alice", "bob"].into_iter().enumerate() {
            let decision = check.decide(&[user], &store, UnixMillis(now_ms))?;
            allowed[i] += u32::from(decision.allowed);
            println!(
                "t={:>4} ms {user:<5} allowed={:<5} remaining={:?} reset={:?} s",
                step * 100,
                decision.allowed,
                decision.remaining(),
                decision.reset(),
            );
        }
    }
    // Each user has a bucket of its own: the burst of 4, then 1 refilled in the second.
    assert_eq!(allowed, [5, 5], "each user: the burst, then the refill");
    for (name, value) in limiter.stats().snapshot().counters() {
        if value > 0 {
            println!("{name} {value}");
        }
    }
    Ok(())
}
