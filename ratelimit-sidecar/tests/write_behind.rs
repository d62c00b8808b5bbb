//! Write-behind counters (`WRITE_BEHIND=true`) through real servers on a real Redis and
//! memcached: three write-behind replicas and an exact one at a hot key stay within the
//! written bound and leave every hit in the store once, under upstream's keys; over
//! 10 000 keys the counts add up; with the store frozen, decisions go on from local counts
//! and the hits are sent once it is back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ratelimit_tests::sidecar as support;
use ratelimit_tests::{most_within, on_remote_backends};
use support::{Options, Server, Store, eventually, request};

const OK: i32 = 1;
const OVER: i32 = 2;
/// The flush interval the replicas run with, in milliseconds.
const FLUSH_MS: u64 = 100;

const RULES: &str = "domain: wb
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 300}
  - key: few
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: cold
    rate_limit: {unit: hour, requests_per_unit: 1}
";

fn start(store: &Store, behind: bool) -> Server {
    let mut options = Options::rules(RULES);
    options.env.extend(store.env());
    options.env.extend([
        ("WRITE_BEHIND", behind.to_string()),
        ("WRITE_BEHIND_FLUSH_INTERVAL", format!("{FLUSH_MS}ms")),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0".to_owned()),
        ("REDIS_TIMEOUT", "200ms".to_owned()),
        ("MEMCACHE_TIMEOUT", "200ms".to_owned()),
    ]);
    Server::start_with(options)
}

/// The overall codes of one request per `(key, value)` descriptor.
async fn ask(server: &Server, descriptors: &[(&str, &str)]) -> Vec<i32> {
    let lists: Vec<[(&str, &str); 1]> = descriptors.iter().map(|&d| [d]).collect();
    let refs: Vec<&[(&str, &str)]> = lists.iter().map(|l| l.as_slice()).collect();
    let mut client = server.client().await;
    let answer = client
        .should_rate_limit(request("wb", &refs))
        .await
        .unwrap();
    answer
        .into_inner()
        .statuses
        .iter()
        .map(|s| s.code)
        .collect()
}

/// Counters whose key starts with `prefix` and their values, read from the store.
fn counters(store: &Store, prefix: &str) -> HashMap<String, u64> {
    let number = |text: &str| text.trim().parse::<u64>().unwrap_or(0);
    match store {
        Store::Redis(redis) => (redis.keys().into_iter())
            .filter(|k| k.starts_with(prefix))
            .map(|k| (k.clone(), number(&redis.cli(&["GET", &k]))))
            .collect(),
        Store::Memcached(memcached) => (memcached.keys().into_iter())
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| (k.clone(), memcached.get(&k).map_or(0, |v| number(&v))))
            .collect(),
        Store::Memory => unreachable!("write-behind needs a remote store"),
    }
}

/// Sends `count` requests for the hot key, one after the other, and returns when each
/// admitted one was answered (ms since `since`).
async fn hammer(server: &Server, count: usize, since: Instant) -> Vec<u64> {
    let mut admitted = Vec::new();
    for _ in 0..count {
        if ask(server, &[("hot", "x")]).await == [OK] {
            admitted.push(since.elapsed().as_millis() as u64);
        }
    }
    admitted
}

async fn a_hot_key_stays_within_the_bound_and_every_hit_reaches_the_store(store: &Store) {
    let behind: Vec<Server> = (0..3).map(|_| start(store, true)).collect();
    let exact = start(store, false);
    let since = Instant::now();
    let (a, b, c, d) = tokio::join!(
        hammer(&behind[0], 300, since),
        hammer(&behind[1], 300, since),
        hammer(&behind[2], 300, since),
        hammer(&exact, 300, since),
    );
    let mut admitted: Vec<u64> = [a, b, c, d].concat();
    admitted.sort_unstable();
    // Never fewer than the exact mode admits; at most the limit plus what the fleet
    // admitted within 2F + D (D: a flush's round trip, at most the 200 ms deadline).
    let bound = 300 + most_within(&admitted, 2 * FLUSH_MS + 200);
    assert!(admitted.len() >= 300, "{} admitted", admitted.len());
    assert!(admitted.len() <= bound, "{} > {bound}", admitted.len());
    eprintln!(
        "hot key: {} admitted of 1200, bound {bound}",
        admitted.len()
    );
    let counted = eventually(Duration::from_secs(5), || async {
        counters(store, "wb_hot_x_").values().sum::<u64>() == 1_200
    })
    .await;
    assert!(counted, "{:?}", counters(store, "wb_hot_x_"));
    let flushes = async |server: &Server| {
        let flushes = server.stat("ratelimit.write_behind.flushes").await;
        (
            flushes.unwrap_or(0),
            server.stat("ratelimit.write_behind.dropped_hits").await,
        )
    };
    let mut sent = 0;
    for server in &behind {
        let (flushes, dropped) = flushes(server).await;
        assert_eq!(dropped, Some(0));
        sent += flushes;
    }
    if let Store::Redis(redis) = store {
        // One INCRBY a flush for the write-behind replicas, one a request for the exact.
        let calls = incrby_calls(redis);
        assert!(calls <= sent + 300, "{calls} INCRBY for {sent} flushes");
        eprintln!("hot key: {calls} INCRBY for 1200 decisions ({sent} flushes)");
    }
}

fn incrby_calls(redis: &support::Redis) -> u64 {
    let info = redis.cli(&["INFO", "commandstats"]);
    let line = info.lines().find(|l| l.starts_with("cmdstat_incrby:"));
    let calls = line.and_then(|l| l.split(['=', ',']).nth(1));
    calls.map_or(0, |n| n.parse().unwrap())
}

on_remote_backends!(a_hot_key_stays_within_the_bound_and_every_hit_reaches_the_store);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_ten_thousand_keys_the_counts_add_up_under_upstreams_keys() {
    let store = Store::Redis(support::Redis::start(&[]));
    let behind: Vec<Server> = (0..3).map(|_| start(&store, true)).collect();
    let values: Vec<String> = (0..10_000).map(|i| format!("k{i}")).collect();
    let mut admitted = 0;
    for server in &behind {
        for chunk in values.chunks(250) {
            let descriptors: Vec<(&str, &str)> =
                chunk.iter().map(|v| ("cold", v.as_str())).collect();
            admitted += ask(server, &descriptors)
                .await
                .iter()
                .filter(|&&c| c == OK)
                .count();
        }
    }
    // Each replica saw every key once: the first admitted, the others admitted at most
    // while they had not yet heard of it.
    assert!((10_000..=30_000).contains(&admitted), "{admitted}");
    let complete = eventually(Duration::from_secs(10), || async {
        let counts = counters(&store, "wb_cold_");
        counts.len() == 10_000 && counts.values().all(|&n| n == 3)
    })
    .await;
    assert!(complete, "every key holds 3 hits");
    // Upstream's keys and expiries: the hour's start, an hour to live.
    let Store::Redis(redis) = &store else {
        unreachable!()
    };
    let key = redis
        .keys()
        .into_iter()
        .find(|k| k.starts_with("wb_cold_k7_"))
        .unwrap();
    let hour: u64 = key.rsplit('_').next().unwrap().parse().unwrap();
    assert_eq!(hour % 3_600, 0, "{key}");
    let ttl: u64 = redis.cli(&["TTL", &key]).trim().parse().unwrap();
    assert!((3_000..=3_600).contains(&ttl), "{ttl}");
}

async fn with_the_store_frozen_decisions_go_on_and_the_hits_follow(store: &Store) {
    let server = start(store, true);
    for _ in 0..3 {
        assert_eq!(ask(&server, &[("few", "f")]).await, [OK]);
    }
    let counted = eventually(Duration::from_secs(10), || async {
        counters(store, "wb_few_f_").values().sum::<u64>() == 3
    });
    assert!(counted.await);
    freeze(store, true);
    let codes = [
        ask(&server, &[("few", "f")]).await,
        ask(&server, &[("few", "f")]).await,
        ask(&server, &[("few", "f")]).await,
    ];
    assert_eq!(codes, [[OK], [OK], [OVER]], "decided from local counts");
    let failed = eventually(Duration::from_secs(5), || async {
        server.stat("ratelimit.write_behind.flush_errors").await > Some(0)
    })
    .await;
    freeze(store, false);
    assert!(failed, "a flush to the frozen store failed");
    // The flush that timed out was still waiting in the store's socket, and runs once it
    // thaws; it is sent again after the store answers a ping. So its 3 hits may count
    // twice, never more, and none is lost.
    let sum = || counters(store, "wb_few_f_").values().sum::<u64>();
    let arrived = eventually(Duration::from_secs(10), || async { sum() >= 6 }).await;
    assert!(arrived, "the pending hits reached the store: {}", sum());
    tokio::time::sleep(Duration::from_millis(3 * FLUSH_MS)).await;
    assert!([6, 9].contains(&sum()), "{}", sum());
}

fn freeze(store: &Store, frozen: bool) {
    match (store, frozen) {
        (Store::Redis(redis), true) => redis.freeze(),
        (Store::Redis(redis), false) => redis.thaw(),
        (Store::Memcached(memcached), true) => memcached.freeze(),
        (Store::Memcached(memcached), false) => memcached.thaw(),
        (Store::Memory, _) => unreachable!(),
    }
}

on_remote_backends!(with_the_store_frozen_decisions_go_on_and_the_hits_follow);

#[test]
fn write_behind_on_the_memory_backend_stops_start_up() {
    let log = Server::refused(Options::with_env(&[("WRITE_BEHIND", "true")]));
    assert!(
        log.contains("WRITE_BEHIND=true needs BACKEND_TYPE redis or memcache"),
        "{log}"
    );
}

#[tokio::test]
async fn rules_with_a_token_bucket_are_refused_by_name() {
    let store = Store::Redis(support::Redis::start(&[]));
    let mut options = Options::rules(
        "domain: wb\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket}\n",
    );
    options.env.extend(store.env());
    options.env.push(("WRITE_BEHIND", "true".to_owned()));
    let server = Server::start_with(options);
    let refused = eventually(Duration::from_secs(5), || async {
        server.stat("ratelimit.service.config_load_error").await == Some(1)
    })
    .await;
    assert!(refused);
    assert!(
        server
            .log()
            .contains("wb.b: algorithm token_bucket cannot be counted write-behind"),
        "{}",
        server.log()
    );
}
