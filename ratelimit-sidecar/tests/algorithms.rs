//! Every algorithm decides alike on every store: the same requests at the same (test)
//! times through the memory store, the wasm filter's shared-data slots, a real Redis and
//! a real memcached give the same responses, field for field.

use ratelimit_core::UnixMillis;
use std::time::{SystemTime, UNIX_EPOCH};

use ratelimit_core::stats::StatsRegistry;
use ratelimit_core::{Config, Descriptor, Limiter, MemoryStore, Request, Response, Settings};
use ratelimit_sidecar::backend::{self, Backend, Remote};
use ratelimit_sidecar::runtime::Pool;
use ratelimit_sidecar::settings::Settings as ServerSettings;
use ratelimit_tests::memcached::Memcached;
use ratelimit_tests::sidecar::Redis;
use ratelimit_wasm::slots::{MemoryShared, SlotCounters};

const RULES: &str = include_str!("fixtures/algorithms.yaml");

fn limiter() -> Limiter {
    Limiter::new(
        &Config::from_yaml("a.yaml", RULES).unwrap(),
        Settings::default(),
    )
}

/// A remote store as the server opens it, from its settings.
async fn remote(args: &[String]) -> Remote {
    let mut argv = vec![
        "ratelimit".to_owned(),
        "--expiration-jitter-max-seconds=0".into(),
    ];
    argv.extend_from_slice(args);
    let (settings, _) = ServerSettings::load_from(argv).unwrap();
    let pool = Pool::start(1).unwrap();
    match backend::open(&settings, &pool, &StatsRegistry::new(100))
        .await
        .unwrap()
    {
        Backend::Remote(remote) => remote,
        _ => panic!("a remote backend, counted through, was asked for"),
    }
}

/// The same pseudo-random requests every time: (milliseconds to advance, rule, hits).
fn sequence() -> Vec<(u64, &'static str, u64)> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    (0..240)
        .map(|_| {
            // Whole tens of milliseconds: requests often land exactly on a bucket's
            // refill or a window's edge, where an off-by-one would show.
            let step = next(18) * 10;
            let rule = ["sliding", "bucket", "both"][next(3) as usize];
            let hits = 1 + u64::from(next(4) == 0);
            (step, rule, hits)
        })
        .collect()
}

#[tokio::test]
async fn memory_wasm_slots_redis_and_memcached_agree() {
    let redis = Redis::start(&[]);
    let memcached = Memcached::start();
    let redis = remote(&[
        "--backend-type=redis".into(),
        "--redis-socket-type=tcp".into(),
        format!("--redis-url=127.0.0.1:{}", redis.port),
    ])
    .await;
    let memcached = remote(&[
        "--backend-type=memcache".into(),
        format!("--memcache-host-port={}", memcached.address()),
    ])
    .await;
    let (memory_limiter, slots_limiter, redis_limiter, memcached_limiter) =
        (limiter(), limiter(), limiter(), limiter());
    let memory = MemoryStore::default();
    let shared = MemoryShared::default();
    let slots = SlotCounters::new(&shared, 4_096);
    // The test clock starts at the real time and only runs ahead of it, so that what the
    // remote stores expire by their own clocks has always ended on the test clock too.
    let mut now_ms = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let (mut admitted, mut refused) = (0, 0);
    for (i, (step, rule, hits)) in sequence().into_iter().enumerate() {
        now_ms += step;
        let request = Request::new("a", vec![Descriptor::new([(rule, "x")]).with_hits(hits)]);
        let in_memory = memory_limiter
            .should_rate_limit(&request, &memory, UnixMillis(now_ms))
            .unwrap();
        let in_slots = slots_limiter
            .should_rate_limit(&request, &slots, UnixMillis(now_ms))
            .unwrap();
        let on_redis = through(&redis_limiter, &redis, &request, now_ms).await;
        let on_memcached = through(&memcached_limiter, &memcached, &request, now_ms).await;
        assert_eq!(in_slots, in_memory, "request {i} ({rule}, {hits} hits)");
        assert_eq!(on_redis, in_memory, "request {i} ({rule}, {hits} hits)");
        assert_eq!(on_memcached, in_memory, "request {i} ({rule}, {hits} hits)");
        match in_memory.overall_code {
            ratelimit_core::Code::Ok => admitted += 1,
            ratelimit_core::Code::OverLimit => refused += 1,
        }
    }
    assert!(
        admitted > 40 && refused > 40,
        "{admitted} admitted, {refused} refused"
    );
}

async fn through(limiter: &Limiter, remote: &Remote, request: &Request, now_ms: u64) -> Response {
    let mut plan = limiter.plan(request, UnixMillis(now_ms)).unwrap();
    let counts = remote.run(&mut plan, None).await.unwrap();
    plan.decide(&counts)
}
