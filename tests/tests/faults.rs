//! Faults under load, with a checker (`ratelimit_tests::faults`): each test runs a
//! bounded load of `ShouldRateLimit` calls on hot and cold keys against a real sidecar,
//! makes one fault while it runs, heals it, and checks the history of every call: per
//! key and window admitted ≤ limit (≤ limit + the failure mode's bound across the
//! fault), the failure mode's answer during the fault, no call past its deadline, exact
//! answers again within a window of the heal, the breaker closed and memory back near
//! where it started. The short form runs here; `bench/faults/run.sh` runs it longer.

use std::future::Future;
use std::time::Duration;

use ratelimit_tests::faults::check::{Bounds, Fault, Promise, check};
use ratelimit_tests::faults::load::{Load, Profile, now_us, rules};
use ratelimit_tests::faults::{Schedule, report, rss_kib};
use ratelimit_tests::sidecar::{Options, Redis, Server, eventually, redis_env};

const LIMIT: u32 = 20;
const DEADLINE: Duration = Duration::from_millis(500);
/// Beyond the deadline a call may take: the machine is shared with other tests.
const MARGIN: Duration = Duration::from_millis(400);
/// BACKEND_BREAKER_OPEN_DURATION, and the time to use the store again after it.
const OPEN: Duration = Duration::from_secs(1);
/// Resident memory may end this much above where it was before the fault.
const RSS_GROWTH_KIB: u64 = 32 * 1024;

fn profile(schedule: &Schedule) -> Profile {
    Profile {
        callers: 4 * schedule.scale as usize,
        pause: Duration::from_millis(4),
        hot_keys: 2,
        cold_keys: 100,
        deadline: DEADLINE,
    }
}

/// A sidecar on `backend` deciding the load's rules, in failure mode `mode`.
fn sidecar(mut env: Vec<(&'static str, String)>, mode: &str) -> Server {
    env.extend([
        ("BACKEND_FAILURE_MODE", mode.to_owned()),
        ("BACKEND_FALLBACK_REPLICAS", "2".to_owned()),
        ("BACKEND_BREAKER_FAILURES", "3".to_owned()),
        ("BACKEND_BREAKER_OPEN_DURATION", "1s".to_owned()),
        ("REDIS_TIMEOUT", "300ms".to_owned()),
        ("GRPC_WORKERS", "2".to_owned()),
    ]);
    Server::start_with(Options {
        env,
        ..Options::rules(&rules(LIMIT))
    })
}

/// Runs the load on `server`, makes the fault with `make` after the schedule's first
/// phase, heals it with `heal` after the second, and checks the history.
async fn under_load<M, H, HF>(
    server: &Server,
    name: &str,
    promise: Promise,
    lost: bool,
    make: M,
    heal: H,
) where
    M: FnOnce(),
    H: FnOnce() -> HF,
    HF: Future<Output = ()>,
{
    let schedule = Schedule::from_env();
    let load = Load::start(server.grpc, profile(&schedule)).await;
    tokio::time::sleep(schedule.before).await;
    let rss_before = rss_kib(server.pid());
    let started = now_us();
    make();
    tokio::time::sleep(schedule.fault).await;
    heal().await;
    let healed = now_us();
    tokio::time::sleep(schedule.after).await;
    let history = load.stop().await;
    let rss_after = rss_kib(server.pid());
    let fault = Fault {
        name: name.to_owned(),
        started,
        healed,
        promise,
        loses_counters: lost,
        settle: u64::try_from((OPEN + Duration::from_millis(500)).as_micros()).unwrap(),
    };
    let bounds = Bounds {
        limit: u64::from(LIMIT),
        deadline: u64::try_from(DEADLINE.as_micros()).unwrap(),
        margin: u64::try_from(MARGIN.as_micros()).unwrap(),
    };
    let measured = check(&history, bounds, &fault)
        .unwrap_or_else(|broken| panic!("{name}:\n{}\n{}", broken.join("\n"), server.log()));
    // The breaker closed and health is back.
    let healthy = eventually(Duration::from_secs(5), || async {
        reqwest::get(server.http_url("/healthcheck"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(
        healthy,
        "{name}: unhealthy after the heal\n{}",
        server.log()
    );
    let stats = server.stats().await;
    let opened = stats
        .get("ratelimit.redis.breaker_opened")
        .copied()
        .unwrap_or(0);
    let closed = stats
        .get("ratelimit.redis.breaker_closed")
        .copied()
        .unwrap_or(0);
    assert!(
        opened >= 1 && closed >= 1,
        "{name}: breaker opened {opened}, closed {closed}"
    );
    assert!(
        rss_after <= rss_before + RSS_GROWTH_KIB,
        "{name}: resident memory {rss_before} KiB before the fault, {rss_after} KiB at the end"
    );
    report(&format!(
        "| {name} | {:?} | {measured}; RSS {rss_before} → {rss_after} KiB; breaker opened {opened}, closed {closed} |",
        fault.promise
    ));
}

#[tokio::test]
async fn redis_paused_in_failure_mode_error() {
    let redis = Redis::start(&[]);
    let server = sidecar(redis_env(redis.port), "error");
    under_load(
        &server,
        "Redis SIGSTOP, mode error",
        Promise::Error,
        false,
        || redis.freeze(),
        || async {
            redis.thaw();
        },
    )
    .await;
}

#[tokio::test]
async fn redis_paused_in_failure_mode_allow() {
    let redis = Redis::start(&[]);
    let server = sidecar(redis_env(redis.port), "allow");
    under_load(
        &server,
        "Redis SIGSTOP, mode allow",
        Promise::Allow,
        false,
        || redis.freeze(),
        || async {
            redis.thaw();
        },
    )
    .await;
}

#[tokio::test]
async fn redis_killed_and_restarted_in_failure_mode_local() {
    let redis = std::cell::RefCell::new(Redis::start(&[]));
    let port = redis.borrow().port;
    let server = sidecar(redis_env(port), "local");
    let share = u64::from(LIMIT / 2);
    under_load(
        &server,
        "Redis killed and restarted, mode local",
        Promise::Local { share },
        true,
        || redis.borrow_mut().kill(),
        || async { redis.borrow_mut().restart() },
    )
    .await;
}
