//! envoyproxy/ratelimit and this sidecar as one fleet, on one Redis (single, then with
//! the per-second split, the local over-limit cache and
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`) and on one memcached.
//!
//! For each store, three groups decide the same calls with the same rules
//! (`tests/src/upstream_rules.yaml`) and settings, each under a `CACHE_KEY_PREFIX` of its own: the
//! mixed fleet (upstream and the sidecar taking turns), upstream alone and the sidecar
//! alone. Every call must get the same answer from the three (code, limit, remaining,
//! `duration_until_reset`, `RateLimit-*` headers), and the keys each group left in the
//! store, without their prefix, must be the same with the same values and expiries. A
//! call whose three answers straddle a second is not compared (its windows may differ).
//!
//! `UPSTREAM_RATELIMIT_BIN=… cargo run -p ratelimit-tests --example upstream_fleet`
//! (bench/upstream/run.sh). Prints one line per store and every difference; exits 1 on
//! any.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use ratelimit_tests::memcached::Memcached;
use ratelimit_tests::sidecar::{Options, Redis, Server, redis_env};
use ratelimit_tests::upstream::{ROUNDS, RULES, answer, calls, now_secs, upstream_binary};

/// The groups' `CACHE_KEY_PREFIX`: the mixed fleet, upstream alone, the sidecar alone.
const PREFIXES: [&str; 3] = ["mixed_", "upstream_", "sidecar_"];

/// What a group's servers are started with, besides the rules and the key prefix.
struct Store {
    name: &'static str,
    env: Vec<(&'static str, String)>,
    /// The store's keys: (key, value, seconds to expiry).
    keys: Box<dyn Fn() -> Keys>,
    /// Whether counters of a group, and the expiries each write renews, must equal the
    /// others' (not with a local over-limit cache: each instance's cache holds back its
    /// own writes, so a fleet of several writes more, and later, than one instance).
    same_counts: bool,
    /// How far apart two groups' expiries of one key may be, in seconds: a second for
    /// the time between their writes, and on memcached the second the sidecar adds.
    expiry_tolerance: i64,
    /// Calls on which the sidecar differs from upstream on purpose, with the reason
    /// (docs/compatibility.md lists them): reported, not failed.
    deliberate: &'static [(&'static str, &'static str)],
}

/// One group's servers: the mixed fleet has two (upstream's first), the others one.
fn start_group(
    upstream: &Path,
    env: &[(&'static str, String)],
    prefix: &str,
    members: &[bool],
) -> Vec<Server> {
    members
        .iter()
        .map(|&is_upstream| {
            let mut options = Options {
                files: vec![("fleet.yaml", RULES.to_owned())],
                binary: is_upstream.then(|| upstream.to_path_buf()),
                ..Options::default()
            };
            options.env.extend(env.iter().cloned());
            options.env.extend([
                ("CACHE_KEY_PREFIX", prefix.to_owned()),
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true".to_owned()),
                ("LOG_LEVEL", "warn".to_owned()),
            ]);
            Server::start_with(options)
        })
        .collect()
}

/// Sends every call to the three groups; returns (calls compared, calls at a second's
/// edge, differences).
async fn decide_everywhere(
    groups: &[Vec<Server>; 3],
    store: &Store,
) -> (usize, usize, Vec<String>) {
    let mut clients = Vec::new();
    for group in groups {
        let mut members = Vec::new();
        for server in group {
            members.push(server.client().await);
        }
        clients.push(members);
    }
    let (mut compared, mut at_edge, mut differences) = (0, 0, Vec::new());
    for round in 0..ROUNDS {
        for (index, (label, call)) in calls().into_iter().enumerate() {
            // Three answers in one second: a call starts 100 ms before an edge at latest.
            before_a_second_edge().await;
            let before = now_secs();
            let mut answers = Vec::new();
            for members in &mut clients {
                // Each call goes to upstream and to the sidecar in turn, round by round.
                let member = (round + index) % members.len();
                let client = &mut members[member];
                let response = client.should_rate_limit(call.clone()).await;
                answers.push(
                    response
                        .map(|r| answer(&r.into_inner()))
                        .map_err(|s| s.to_string()),
                );
            }
            if now_secs() != before {
                at_edge += 1;
                continue;
            }
            if store.deliberate.iter().any(|(l, _)| *l == label) {
                continue;
            }
            compared += 1;
            if answers[0] != answers[1] || answers[0] != answers[2] {
                differences.push(format!(
                    "round {round}, {label}:\n  mixed    {:?}\n  upstream {:?}\n  sidecar  {:?}",
                    answers[0], answers[1], answers[2]
                ));
            }
        }
    }
    (compared, at_edge, differences)
}

/// The store's keys: (key, value, seconds to expiry).
type Keys = Vec<(String, String, i64)>;

/// The keys of `all` (one reading of the store, so that every group's expiries are read
/// at the same moment) under `prefix`, without it; not the per-second limit's, whose
/// windows end while they are read.
fn keys_of(all: &Keys, prefix: &str) -> Keys {
    all.iter()
        .cloned()
        .filter_map(|(key, value, ttl)| {
            key.strip_prefix(prefix)
                .filter(|rest| !rest.starts_with("fleet_second_"))
                .map(|rest| (rest.to_owned(), value, ttl))
        })
        .collect()
}

/// The differences between the groups' keys: their names, and with `same_counts` their
/// values and expiries (within `expiry_tolerance`).
fn compare_keys(store: &Store, prefixes: &[&str]) -> Vec<String> {
    let [reference, others @ ..] = prefixes else {
        return Vec::new();
    };
    let all = (store.keys)();
    let first = keys_of(&all, reference);
    let names =
        |keys: &[(String, String, i64)]| keys.iter().map(|k| k.0.clone()).collect::<Vec<_>>();
    let mut differences = Vec::new();
    for prefix in others {
        let other = keys_of(&all, prefix);
        if names(&first) != names(&other) {
            differences.push(format!(
                "keys: {reference} {:?}\n  {prefix} {:?}",
                names(&first),
                names(&other)
            ));
            continue;
        }
        for (a, b) in first.iter().zip(other.iter()) {
            let expiries_differ = (a.2 - b.2).abs() > store.expiry_tolerance;
            if store.same_counts && (a.1 != b.1 || expiries_differ) {
                differences.push(format!("key {}: {reference} {a:?}, {prefix} {b:?}", a.0));
            }
        }
    }
    if first.is_empty() {
        differences.push("no key was written".to_owned());
    }
    differences
}

/// Calls between two replacements of the rolling fleet.
const CALLS_PER_REPLACEMENT: usize = 30;

/// Three instances, upstream's, replaced one at a time by the sidecar's and then back,
/// while the calls go on to the instances that are up (a replacement starts while the
/// others answer); each call is also put to the sidecar alone, and the answers and the
/// keys must be the same. Returns (calls compared, differences).
async fn rolling(upstream: &Path, store: &Store) -> (usize, Vec<String>) {
    let single = start_group(upstream, &store.env, "single_", &[false]).remove(0);
    let mut members: Vec<Option<Server>> =
        start_group(upstream, &store.env, "rolling_", &[true; 3])
            .into_iter()
            .map(Some)
            .collect();
    // The replacements in order: (instance, upstream's binary or not).
    let mut replacements = (0..6).map(|i| (i % 3, i >= 3));
    let mut pending: Option<(usize, tokio::task::JoinHandle<Server>)> = None;
    let (mut compared, mut differences, mut replaced) = (0, Vec::new(), 0);
    let all: Vec<_> = calls();
    // The calls go on until the last replacement has answered its share of them.
    let mut last_replaced_at = usize::MAX;
    for step in 0.. {
        if replaced == 6 && step >= last_replaced_at + CALLS_PER_REPLACEMENT {
            break;
        }
        if pending
            .as_ref()
            .is_some_and(|(_, handle)| handle.is_finished())
        {
            let (index, handle) = pending.take().unwrap();
            members[index] = Some(handle.await.unwrap());
            replaced += 1;
            last_replaced_at = step;
        }
        if step % CALLS_PER_REPLACEMENT == 0
            && pending.is_none()
            && let Some((index, is_upstream)) = replacements.next()
        {
            members[index] = None; // stopped
            let (upstream, env) = (upstream.to_path_buf(), store.env.clone());
            let start = move || start_group(&upstream, &env, "rolling_", &[is_upstream]).remove(0);
            pending = Some((index, tokio::task::spawn_blocking(start)));
        }
        let up: Vec<&Server> = members.iter().flatten().collect();
        let (label, call) = &all[step % all.len()];
        before_a_second_edge().await;
        let before = now_secs();
        let fleet = up[step % up.len()]
            .client()
            .await
            .should_rate_limit(call.clone())
            .await;
        let alone = single.client().await.should_rate_limit(call.clone()).await;
        if now_secs() != before || store.deliberate.iter().any(|(l, _)| l == label) {
            continue;
        }
        let [fleet, alone] = [fleet, alone].map(|r| {
            r.map(|r| answer(&r.into_inner()))
                .map_err(|s| s.to_string())
        });
        compared += 1;
        if fleet != alone {
            differences.push(format!(
                "rolling, step {step}, {label}:\n  fleet {fleet:?}\n  alone {alone:?}"
            ));
        }
    }
    if replaced != 6 {
        differences.push(format!(
            "{replaced} of 6 replacements done during the calls"
        ));
    }
    differences.extend(compare_keys(store, &["single_", "rolling_"]));
    (compared, differences)
}

/// Waits out the last 100 ms of a second, so that a call and its comparison fall in one.
async fn before_a_second_edge() {
    let into_second = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    if into_second > 900 {
        tokio::time::sleep(std::time::Duration::from_millis(u64::from(
            1_005 - into_second,
        )))
        .await;
    }
}

fn redis_store(
    name: &'static str,
    redis: &'static Redis,
    extra: Vec<(&'static str, String)>,
) -> Store {
    let mut env = redis_env(redis.port);
    let same_counts = !extra.iter().any(|(k, _)| *k == "LOCAL_CACHE_SIZE_IN_BYTES");
    env.extend(extra);
    Store {
        name,
        env,
        keys: Box::new(move || {
            redis
                .keys()
                .into_iter()
                .map(|key| {
                    let value = redis.cli(&["GET", &key]);
                    let ttl = redis.cli(&["TTL", &key]).parse().unwrap_or(-3);
                    (key, value, ttl)
                })
                .collect()
        }),
        same_counts,
        expiry_tolerance: 1,
        deliberate: &[],
    }
}

fn memcached_store(memcached: &'static Memcached) -> Store {
    Store {
        name: "memcached",
        env: vec![
            ("BACKEND_TYPE", "memcache".into()),
            ("MEMCACHE_HOST_PORT", memcached.address()),
            ("EXPIRATION_JITTER_MAX_SECONDS", "0".into()),
        ],
        keys: Box::new(move || {
            memcached
                .keys()
                .into_iter()
                .filter_map(|(key, _)| {
                    let (value, ttl) = memcached.value_and_ttl(&key)?;
                    Some((key, value, ttl))
                })
                .collect()
        }),
        same_counts: true,
        expiry_tolerance: 2,
        deliberate: &[
            (
                "second",
                "a counter lives one second longer than its unit: memcached expires by whole seconds of its own clock, and upstream's per-second counters can end early and admit more",
            ),
            (
                "share_threshold",
                "two descriptors of one request on one counter count in turn, as on Redis; upstream's memcached answers both from the total read before the request",
            ),
        ],
    }
}

fn stores() -> Vec<Store> {
    let leak = |redis: Redis| -> &'static Redis { Box::leak(Box::new(redis)) };
    let (single, per_second) = (leak(Redis::start(&[])), leak(Redis::start(&[])));
    let split = vec![
        ("REDIS_PERSECOND", "true".to_owned()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".to_owned()),
        (
            "REDIS_PERSECOND_URL",
            format!("127.0.0.1:{}", per_second.port),
        ),
    ];
    let cache = vec![("LOCAL_CACHE_SIZE_IN_BYTES", "1048576".to_owned())];
    let stop = vec![("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true".to_owned())];
    vec![
        redis_store("redis", single, Vec::new()),
        redis_store("redis, per-second split", leak(Redis::start(&[])), split),
        redis_store(
            "redis, local over-limit cache",
            leak(Redis::start(&[])),
            cache,
        ),
        redis_store(
            "redis, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
            leak(Redis::start(&[])),
            stop,
        ),
        memcached_store(Box::leak(Box::new(Memcached::start()))),
    ]
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Some(upstream) = upstream_binary() else {
        return std::process::ExitCode::from(2);
    };
    let mut failed = false;
    for store in stores() {
        let groups = [
            start_group(&upstream, &store.env, "mixed_", &[true, false]),
            start_group(&upstream, &store.env, "upstream_", &[true]),
            start_group(&upstream, &store.env, "sidecar_", &[false]),
        ];
        let (compared, at_edge, mut differences) = decide_everywhere(&groups, &store).await;
        differences.extend(compare_keys(&store, &PREFIXES));
        let (rolled, rolling_differences) = rolling(&upstream, &store).await;
        differences.extend(rolling_differences);
        let keys = keys_of(&(store.keys)(), "mixed_").len();
        println!(
            "{}: {compared} calls compared over the three groups ({at_edge} at a second's edge, not compared), {keys} keys; {rolled} calls to a fleet of three replaced one by one, upstream to the sidecar and back; {} differences",
            store.name,
            differences.len()
        );
        for difference in &differences {
            println!("  {difference}");
        }
        for (label, reason) in store.deliberate {
            println!("  '{label}' not compared, a deliberate difference: {reason}");
        }
        failed |= !differences.is_empty();
    }
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
