//! Faults under load, with a checker (`ratelimit_tests::faults`): each test runs a
//! bounded load of `ShouldRateLimit` calls on hot and cold keys against a real sidecar
//! (or through a real Envoy in front of it), makes one fault while it runs, heals it,
//! and checks the history of every call: per key and window admitted ≤ limit (≤ limit +
//! the failure mode's bound across the fault), the failure mode's answer during the
//! fault (only on the lost keys for a partial fault; none at all for a fault that must
//! not show), no call past its deadline, exact answers again within a window of the
//! heal, health back, the breaker closed and memory back near where it started. The
//! short form runs here (a Redis cluster's faults in `faults_cluster.rs`);
//! `bench/faults/run.sh` runs it longer.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_tests::envoy::{start_envoy, upstream};
use ratelimit_tests::faults::Schedule;
use ratelimit_tests::faults::check::{Fault, Promise};
use ratelimit_tests::faults::load::now_us;
use ratelimit_tests::faults::load::{Profile, Target, envoy_rules, rules, tls_endpoint};
use ratelimit_tests::faults::run::{
    Breakers, Timed, around, checked, healed_and_reported, last_seen, store_fault,
};
use ratelimit_tests::faults::setup::{
    BOUNDS, LIMIT, MARGIN, OPEN, failing, on_grpc, profile, sidecar, store_under_load,
};
use ratelimit_tests::faults::xds::ControlPlane;
use ratelimit_tests::memcached::{Dns, Memcached};
use ratelimit_tests::pki::make_pki;
use ratelimit_tests::redis_failover::Sentinel;
use ratelimit_tests::sidecar::{Options, Redis, Server, eventually, limit_of, redis_env, request};

/// Freezes `redis` (SIGSTOP), as a fault's `make`.
fn freeze(redis: &Redis) -> impl FnOnce() -> std::future::Ready<()> {
    move || {
        redis.freeze();
        std::future::ready(())
    }
}

/// Lets `redis` run again (SIGCONT), as a fault's `heal`.
fn thaw(redis: &Redis) -> impl FnOnce() -> std::future::Ready<u64> {
    move || {
        redis.thaw();
        std::future::ready(now_us())
    }
}

/// Runs `restart` (which waits until what it starts listens); when it began.
fn restarted(restart: impl FnOnce()) -> u64 {
    let began = now_us();
    restart();
    began
}

/// Redis paused with SIGSTOP under load, then resumed, with the sidecar in `mode`.
async fn redis_paused(mode: &str, promise: Promise) {
    let redis = Redis::start(&[]);
    let server = sidecar(redis_env(redis.port), mode);
    let name = format!("Redis SIGSTOP, mode {mode}");
    let fault = |t: &_| store_fault(&name, promise, t, OPEN, false);
    store_under_load(
        &server,
        Schedule::from_env(),
        freeze(&redis),
        thaw(&redis),
        fault,
        Breakers::Of("redis"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_in_failure_mode_error() {
    redis_paused("error", Promise::Error).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_in_failure_mode_allow() {
    redis_paused("allow", Promise::Allow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_in_failure_mode_local() {
    let redis = Mutex::new(Redis::start(&[]));
    let port = redis.lock().unwrap().port;
    let server = sidecar(redis_env(port), "local");
    let share = u64::from(LIMIT / 2);
    let name = "Redis killed and restarted, mode local";
    let fault = |t: &_| store_fault(name, Promise::Local { share }, t, OPEN, true);
    let make = async || redis.lock().unwrap().kill();
    let heal = async || restarted(|| redis.lock().unwrap().restart());
    let (schedule, breakers) = (Schedule::from_env(), Breakers::Of("redis"));
    store_under_load(&server, schedule, make, heal, fault, breakers).await;
}

/// Envoy's deadline for the load through it: its rate limit filter waits 0.5 s.
const ENVOY_DEADLINE: Duration = Duration::from_secs(1);

/// The sidecar killed behind a real Envoy and started again on its port. While it is
/// down Envoy answers as `failure_mode_deny` says (500 when true, the upstream's 200
/// when false); once it is back (its counters lost: the memory backend) decisions
/// are exact again.
async fn sidecar_restarted_behind_envoy(deny: bool) {
    let upstream = upstream().await;
    let options = Options {
        env: failing(Vec::new(), "error"),
        ..Options::rules(&envoy_rules(LIMIT))
    };
    let first = Server::start_with(options.clone());
    let grpc = first.grpc;
    let envoy = start_envoy(upstream, grpc, deny);
    let server = Mutex::new(Some(first));
    let schedule = Schedule::from_env();
    let profile = Profile {
        deadline: ENVOY_DEADLINE,
        ..profile(&schedule)
    };
    let make = async || drop(server.lock().unwrap().take());
    let heal = async || {
        let began = now_us();
        let options = options.set("GRPC_PORT", &grpc.to_string());
        let again = tokio::task::spawn_blocking(move || Server::start_with(options));
        *server.lock().unwrap() = Some(again.await.unwrap());
        began
    };
    let timed = around(
        Target::Envoy(envoy.port),
        profile,
        schedule,
        None,
        make,
        heal,
    )
    .await;
    let server = server.into_inner().unwrap().expect("started again");
    let (name, promise) = if deny {
        (
            "sidecar killed and restarted behind Envoy, failure_mode_deny true",
            Promise::Error,
        )
    } else {
        (
            "sidecar killed and restarted behind Envoy, failure_mode_deny false",
            Promise::Allow,
        )
    };
    let fault = Fault {
        loses_counters: true,
        ..Fault::new(name, promise, timed.times(), timed.settle(Duration::ZERO))
    };
    let measured = checked(&timed, &fault, (LIMIT, ENVOY_DEADLINE, MARGIN), &server);
    healed_and_reported(&server, &timed, &fault, &measured, Breakers::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_restarted_behind_envoy_failure_mode_deny() {
    sidecar_restarted_behind_envoy(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_restarted_behind_envoy_failure_mode_allow() {
    sidecar_restarted_behind_envoy(false).await;
}

/// Whether a call over a new TLS connection trusting only `ca` is answered.
async fn answered_trusting(port: u16, ca: &Path) -> bool {
    let Ok(channel) = tls_endpoint(port, &[ca.to_path_buf()]).connect().await else {
        return false;
    };
    RateLimitServiceClient::new(channel)
        .should_rate_limit(request("faults", &[&[("k", "tls")]]))
        .await
        .is_ok()
}

/// Moves `from`'s server certificate and key over `to`'s, by rename (key first).
fn rotate(from: &Path, to: &Path) {
    for name in ["server.key", "server.crt"] {
        let staged = to.join(format!(".{name}.new"));
        std::fs::copy(from.join(name), &staged).unwrap();
        std::fs::rename(&staged, to.join(name)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotated_under_load_with_tls_on() {
    let [live, old, new] = [(); 3].map(|()| tempfile::tempdir().unwrap());
    make_pki(old.path());
    make_pki(new.path());
    rotate(old.path(), live.path());
    let file = |name: &str| live.path().join(name).display().to_string();
    let mut env = failing(Vec::new(), "error");
    env.extend([
        ("GRPC_SERVER_USE_TLS", "true".to_owned()),
        ("GRPC_SERVER_TLS_CERT", file("server.crt")),
        ("GRPC_SERVER_TLS_KEY", file("server.key")),
    ]);
    let server = Server::start_with(Options {
        env,
        ..Options::rules(&rules(LIMIT))
    });
    let (old_ca, new_ca) = (old.path().join("ca.crt"), new.path().join("ca.crt"));
    // Callers trust both CAs and make a new connection (a handshake) every 20 calls.
    let target = Target::Tls {
        port: server.grpc,
        trust: vec![old_ca.clone(), new_ca.clone()],
        reconnect: 20,
    };
    let schedule = Schedule {
        fault: Duration::ZERO,
        ..Schedule::from_env()
    };
    let make = async || rotate(new.path(), live.path());
    // Healed when a new connection trusting only the new CA is answered.
    let heal = async || {
        last_seen(
            Duration::from_secs(10),
            "the new certificate served",
            || answered_trusting(server.grpc, &new_ca),
        )
        .await
    };
    let timed = around(
        target,
        profile(&schedule),
        schedule,
        Some(server.pid()),
        make,
        heal,
    )
    .await;
    let name = "certificate rotated (renamed over) with TLS on, new connection every 20 calls";
    let fault = Fault::new(name, Promise::Exact, timed.times(), 0);
    let measured = checked(&timed, &fault, BOUNDS, &server);
    assert!(
        !answered_trusting(server.grpc, &old_ca).await,
        "new connections still get the old certificate"
    );
    healed_and_reported(&server, &timed, &fault, &measured, Breakers::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_server_restarted_while_the_rules_change() {
    let plane = ControlPlane::start(&rules(LIMIT));
    let mut env = failing(plane.sidecar_env(), "error");
    env.push(("BACKEND_TYPE", "memory".to_owned()));
    let server = Server::start_with(Options {
        env,
        ..Options::default()
    });
    let subscribed = eventually(Duration::from_secs(10), || async {
        limit_of(&server, "faults", &[("k", "0")]).await == Some(LIMIT)
    })
    .await;
    assert!(subscribed, "the rules never came\n{}", server.log());
    let plane = Mutex::new(plane);
    let halved = LIMIT / 2;
    // Killed; the rules change while it is away; started again on the new rules.
    let make = async || {
        let mut plane = plane.lock().unwrap();
        plane.kill();
        plane.write(&rules(halved));
    };
    let heal = async || restarted(|| plane.lock().unwrap().run());
    let schedule = Schedule::from_env();
    let timed = on_grpc(&server, schedule, make, heal).await;
    let name = "xDS server killed, rules changed (limit 20 → 10), started again";
    let fault = Fault {
        limit_after: Some(u64::from(halved)),
        ..Fault::new(name, Promise::Exact, timed.times(), timed.settle(OPEN))
    };
    let measured = checked(&timed, &fault, BOUNDS, &server);
    assert_eq!(
        limit_of(&server, "faults", &[("k", "0")]).await,
        Some(halved)
    );
    healed_and_reported(&server, &timed, &fault, &measured, Breakers::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_node_lost_and_the_srv_record_changed() {
    let srv = "_memcache._tcp.faults.test";
    let (a, b, c) = (Memcached::start(), Memcached::start(), Memcached::start());
    let dns = Dns::start(srv, &[("a.faults.test", a.port), ("b.faults.test", b.port)]);
    let env = vec![
        ("BACKEND_TYPE", "memcache".to_owned()),
        ("MEMCACHE_SRV", srv.to_owned()),
        ("MEMCACHE_SRV_DNS_SERVER", dns.address()),
        ("MEMCACHE_SRV_REFRESH", "200ms".to_owned()),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0".to_owned()),
    ];
    let server = sidecar(env, "error");
    let (b, dns) = (Mutex::new(b), Mutex::new(dns));
    let make = async || b.lock().unwrap().kill();
    // The record names a new node in the lost one's place; the sidecar looks it up
    // every 200 ms.
    let heal = async || {
        let began = now_us();
        let nodes = [("a.faults.test", a.port), ("c.faults.test", c.port)];
        dns.lock().unwrap().serve(srv, &nodes);
        let changed = eventually(Duration::from_secs(10), || async {
            server.log().contains("memcached nodes changed")
        });
        assert!(
            changed.await,
            "the node map never changed\n{}",
            server.log()
        );
        began
    };
    let name = "memcached node killed, its SRV record moved to a new node, mode error";
    let fault = |t: &Timed| Fault {
        partial: true,
        ..store_fault(name, Promise::Error, t, OPEN, true)
    };
    let (schedule, breakers) = (Schedule::from_env(), Breakers::NodeLeft("memcache"));
    store_under_load(&server, schedule, make, heal, fault, breakers).await;
    assert!(c.stat("curr_items") > 0, "the new node holds counters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_fails_over_when_the_master_is_killed() {
    let (master, replica, sentinel) = Sentinel::with_replica();
    let mut env = redis_env(master.port);
    env.extend([
        ("REDIS_TYPE", "sentinel".to_owned()),
        ("REDIS_URL", sentinel.url()),
    ]);
    let server = sidecar(env, "error");
    let master = Mutex::new(master);
    let make = async || master.lock().unwrap().kill();
    let heal = async || {
        last_seen(Duration::from_secs(30), "the replica promoted", || async {
            sentinel.master_port() == Some(replica.port)
        })
        .await
    };
    let schedule = Schedule {
        fault: Duration::ZERO,
        ..Schedule::from_env()
    };
    // Replication is asynchronous: the last counts the master took may not be on the
    // replica (counted as counters lost).
    let name = "sentinel failover: master killed, replica promoted, mode error";
    let fault = |t: &Timed| store_fault(name, Promise::Error, t, OPEN, true);
    store_under_load(&server, schedule, make, heal, fault, Breakers::Of("redis")).await;
    let keys = replica.keys();
    assert!(
        keys.iter().any(|k| k.starts_with("faults_k_")),
        "the promoted replica took the counts: {keys:?}"
    );
}
