//! Surviving a Redis outage: the circuit breakers, the failure modes, the caller's
//! deadline, the bound on work in flight and health, against real redis-servers (one,
//! or a cluster) that the tests freeze (SIGSTOP), thaw, kill and restart.

use std::time::{Duration, Instant};

use ratelimit_tests::sidecar as support;
use support::{Options, Redis, Server, ask, redis_addresses, redis_cluster, redis_env, request};
use tonic::Code as GrpcCode;

const OK: i32 = 1;
const OVER: i32 = 2;
const RULES: &str =
    "domain: o\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 10}}]\n";

fn start(redis: &Redis, extra: &[(&'static str, &str)]) -> Server {
    start_on(redis_env(redis.port), extra)
}

fn start_on(mut env: Vec<(&'static str, String)>, extra: &[(&'static str, &str)]) -> Server {
    env.extend([
        ("REDIS_TIMEOUT", "3s".to_owned()),
        ("BACKEND_BREAKER_FAILURES", "2".to_owned()),
        ("BACKEND_BREAKER_OPEN_DURATION", "1s".to_owned()),
        ("REDIS_POOL_SIZE", "1".to_owned()),
        ("GRPC_WORKERS", "1".to_owned()),
    ]);
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    Server::start_with(Options {
        env,
        ..Options::rules(RULES)
    })
}

/// A Redis that has stopped answering, and a server on it (with `setting`) whose breaker
/// stays closed: every call waits on Redis.
fn frozen(setting: (&'static str, &str)) -> (Redis, Server) {
    let redis = Redis::start(&[]);
    let server = start(&redis, &[setting, ("BACKEND_BREAKER_FAILURES", "100")]);
    redis.freeze();
    (redis, server)
}

/// One call: its gRPC code (or the decision's code) and how long it took.
async fn call(server: &Server, user: &str) -> (Result<i32, GrpcCode>, Duration) {
    let mut client = server.client().await;
    let started = Instant::now();
    let answer = client
        .should_rate_limit(request("o", &[&[("user", user)]]))
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|status| status.code());
    (answer, started.elapsed())
}

/// Calls until the breaker has opened (an answer that did not wait for REDIS_TIMEOUT
/// after answers that did); returns how many calls that took.
async fn until_open(server: &Server, user: &str) -> usize {
    for calls in 1..=10 {
        let (_, took) = call(server, user).await;
        if took < Duration::from_secs(1) && calls > 1 {
            return calls;
        }
    }
    panic!("the breaker never opened: {}", server.log());
}

async fn healthy(server: &Server) -> bool {
    reqwest::get(server.http_url("/healthcheck"))
        .await
        .unwrap()
        .status()
        .is_success()
}

#[tokio::test]
async fn error_mode_answers_unavailable_at_once_while_the_breaker_is_open() {
    let redis = Redis::start(&[]);
    let server = start(&redis, &[]);
    assert_eq!(call(&server, "a").await.0, Ok(OK));
    assert!(healthy(&server).await);
    redis.freeze();
    // Two calls wait for REDIS_TIMEOUT and fail; then the breaker is open.
    assert_eq!(until_open(&server, "a").await, 3);
    for _ in 0..20 {
        let (answer, took) = call(&server, "a").await;
        assert_eq!(answer, Err(GrpcCode::Unavailable));
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!healthy(&server).await, "health follows the breaker");
    assert_eq!(server.stat("ratelimit.redis.breaker_opened").await, Some(1));
    redis.thaw();
    // Within the open period plus one probe, Redis decides again and counts resume.
    // (The two calls that timed out were sent: Redis runs them when it is thawed.)
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let keys = redis.keys();
    let before: u64 = redis.cli(&["GET", &keys[0]]).parse().unwrap();
    assert_eq!(call(&server, "a").await.0, Ok(OK));
    assert_eq!(call(&server, "a").await.0, Ok(OK));
    let after: u64 = redis.cli(&["GET", &keys[0]]).parse().unwrap();
    assert_eq!(after, before + 2, "{keys:?}");
    assert_eq!(server.stat("ratelimit.redis.breaker_closed").await, Some(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(healthy(&server).await);
}

#[tokio::test]
async fn allow_mode_answers_ok_and_counts_it() {
    let redis = Redis::start(&[]);
    let server = start(&redis, &[("BACKEND_FAILURE_MODE", "allow")]);
    redis.freeze();
    until_open(&server, "b").await;
    for _ in 0..15 {
        let (answer, took) = call(&server, "b").await;
        assert_eq!(answer, Ok(OK), "over the limit of 10, but allowed");
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
    assert!(
        server
            .stat("ratelimit.service.backend_fallback_allowed")
            .await
            .unwrap()
            >= 15
    );
}

#[tokio::test]
async fn local_mode_holds_each_replica_to_its_share_and_drops_it_on_recovery() {
    let mut redis = Redis::start(&[]);
    let server = start(
        &redis,
        &[
            ("BACKEND_FAILURE_MODE", "local"),
            ("BACKEND_FALLBACK_REPLICAS", "2"),
        ],
    );
    // Killed, not frozen: connections are refused at once.
    redis.kill();
    let mut codes = Vec::new();
    for _ in 0..8 {
        let (answer, took) = call(&server, "c").await;
        assert!(took < Duration::from_secs(1), "{took:?}");
        codes.push(answer.unwrap());
    }
    assert_eq!(
        codes,
        [OK, OK, OK, OK, OK, OVER, OVER, OVER],
        "10 / 2 replicas = 5"
    );
    let mut client = server.client().await;
    let over = ask(&mut client, "o", &[&[("user", "c")]]).await;
    let limit = over.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        limit.requests_per_unit, 5,
        "the answer carries the local decision"
    );
    assert!(
        server
            .stat("ratelimit.service.backend_fallback_local")
            .await
            .unwrap()
            >= 9
    );
    redis.restart();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Redis decides again from its own count, which the outage never reached.
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(call(&server, "c").await.0.unwrap());
    }
    assert_eq!(after, [OK, OK, OK], "{}", server.log());
    assert_eq!(redis.cli(&["GET", &redis.keys()[0]]), "3");
}

/// A call asked with `grpc-timeout` set to `timeout`: its gRPC code (or the decision's
/// code) and how long it took.
async fn call_within(
    server: &Server,
    user: &str,
    timeout: Duration,
) -> (Result<i32, GrpcCode>, Duration) {
    let mut client = server.client().await;
    let mut asked = tonic::Request::new(request("o", &[&[("user", user)]]));
    asked.set_timeout(timeout);
    let started = Instant::now();
    let answer = client.should_rate_limit(asked).await;
    let answer = answer
        .map(|r| r.into_inner().overall_code)
        .map_err(|s| s.code());
    (answer, started.elapsed())
}

/// The caller's deadline bounds its own wait: under `local` it gets the local decision
/// in time; under `allow` it is DEADLINE_EXCEEDED, never an OK it did not earn (a caller
/// could skip its limit by asking with a short deadline).
#[tokio::test]
async fn the_callers_deadline_bounds_the_backend_call() {
    for (mode, expected) in [
        ("local", Ok(OK)),
        ("allow", Err(GrpcCode::DeadlineExceeded)),
    ] {
        let (_redis, server) = frozen(("BACKEND_FAILURE_MODE", mode));
        let (answer, took) = call_within(&server, "d", Duration::from_millis(400)).await;
        assert_eq!(answer, expected, "{mode}");
        assert!(
            took < Duration::from_secs(2),
            "REDIS_TIMEOUT is 3 s: {took:?}"
        );
        assert_eq!(
            server
                .stat("ratelimit.service.call.should_rate_limit.redis_error")
                .await,
            Some(0),
            "{mode}"
        );
    }
}

/// However short the deadlines callers choose, a node that answers is not judged failed:
/// its breaker stays closed and every other caller is decided (before, five calls with
/// `grpc-timeout: 1n` opened it for everyone).
#[tokio::test]
async fn a_callers_short_deadline_never_opens_the_breaker() {
    let redis = Redis::start(&[]);
    let server = start(&redis, &[("BACKEND_FAILURE_MODE", "allow")]);
    for _ in 0..20 {
        let _ = call_within(&server, "g", Duration::from_nanos(1)).await;
    }
    for _ in 0..10 {
        assert_eq!(call(&server, "h").await.0, Ok(OK), "{}", server.log());
    }
    assert_eq!(call(&server, "h").await.0, Ok(OVER), "the limit holds");
    assert!(healthy(&server).await);
    assert_eq!(server.stat("ratelimit.redis.breaker_opened").await, Some(0));
}

/// Each call waiting on one frozen connection fails at its own deadline, named: one
/// asked later with a shorter `grpc-timeout` fails first, while the one before it waits
/// for the whole REDIS_TIMEOUT.
#[tokio::test]
async fn each_waiting_call_ends_at_its_own_deadline() {
    let (_redis, server) = frozen(("BACKEND_FAILURE_MODE", "error"));
    let first = {
        let mut client = server.client().await;
        tokio::spawn(async move {
            let started = Instant::now();
            let answer = client
                .should_rate_limit(request("o", &[&[("user", "e")]]))
                .await;
            (answer.map(|_| ()), started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut client = server.client().await;
    let mut asked = tonic::Request::new(request("o", &[&[("user", "f")]]));
    asked.set_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let status = client.should_rate_limit(asked).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(status.code(), GrpcCode::DeadlineExceeded, "{status:?}");
    assert!(
        status
            .message()
            .contains("no answer within the caller's grpc-timeout (450ms)"),
        "{status:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(
        !first.is_finished(),
        "the first call waits for REDIS_TIMEOUT"
    );
    let (answer, took) = first.await.unwrap();
    let status = answer.unwrap_err();
    assert!(
        status
            .message()
            .contains("no answer within REDIS_TIMEOUT (3s)"),
        "{status:?}"
    );
    assert!(took >= Duration::from_secs(3), "{took:?}");
}

#[tokio::test]
async fn work_in_flight_is_bounded_and_the_service_recovers() {
    let (redis, server) = frozen(("MAX_INFLIGHT_REQUESTS", "2"));
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let port = server.grpc;
            tokio::spawn(async move {
                let mut client = support::client_on(port).await;
                let user = format!("e{i}");
                client
                    .should_rate_limit(request("o", &[&[("user", user.as_str())]]))
                    .await
                    .map(|_| ())
                    .map_err(|s| s.code())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    redis.thaw();
    let mut exhausted = 0;
    for call in calls {
        match call.await.unwrap() {
            Err(GrpcCode::ResourceExhausted) => exhausted += 1,
            Ok(()) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(exhausted, 8, "two decided, eight refused at once");
    assert!(
        server
            .stat("ratelimit.service.inflight_rejected")
            .await
            .unwrap()
            >= 8
    );
    assert_eq!(call(&server, "f").await.0, Ok(OK), "recovered");
}

#[tokio::test]
async fn two_replicas_in_local_mode_admit_the_limit_between_them() {
    let mut redis = Redis::start(&[]);
    let local = [
        ("BACKEND_FAILURE_MODE", "local"),
        ("BACKEND_FALLBACK_REPLICAS", "2"),
    ];
    let replicas = [start(&redis, &local), start(&redis, &local)];
    redis.kill();
    let mut admitted = 0;
    for round in 0..12 {
        let (answer, _) = call(&replicas[round % 2], "g").await;
        admitted += usize::from(answer.unwrap() == OK);
    }
    assert_eq!(
        admitted, 10,
        "the limit of 10, shared by two replicas during the outage"
    );
}

#[tokio::test]
async fn a_cluster_master_down_affects_only_the_keys_it_holds() {
    // Without full coverage required, the other masters keep serving their slots.
    let nodes = redis_cluster(3, &["--cluster-require-full-coverage", "no"]);
    let mut env = redis_env(nodes[0].port);
    env.extend([
        ("REDIS_TYPE", "cluster".to_owned()),
        ("REDIS_URL", redis_addresses(&nodes).join(",")),
    ]);
    let server = start_on(env, &[]);
    // A hash tag in the value keeps each user's counter in one slot whatever the window.
    let users: Vec<String> = (0..12).map(|i| format!("{{u{i}}}")).collect();
    for user in &users {
        assert_eq!(call(&server, user).await.0, Ok(OK));
    }
    let holder = |user: &str| {
        let holds = |node: &Redis| node.keys().iter().any(|key| key.contains(user));
        nodes.iter().position(holds).unwrap()
    };
    let down = holder(&users[0]);
    let (on_down, elsewhere): (Vec<&String>, Vec<&String>) =
        users.iter().partition(|user| holder(user) == down);
    assert!(!elsewhere.is_empty(), "12 users on one master of 3");
    nodes[down].freeze();
    assert_eq!(until_open(&server, on_down[0]).await, 3);
    for round in 0..10 {
        let (answer, took) = call(&server, elsewhere[round % elsewhere.len()]).await;
        assert_eq!(answer, Ok(OK), "other masters decide: {}", server.log());
        assert!(took < Duration::from_millis(500), "{took:?}");
        let (answer, took) = call(&server, on_down[round % on_down.len()]).await;
        assert_eq!(answer, Err(GrpcCode::Unavailable));
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
    assert_eq!(server.stat("ratelimit.redis.breaker_opened").await, Some(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!healthy(&server).await, "health follows any open breaker");
    nodes[down].thaw();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(call(&server, on_down[0]).await.0, Ok(OK));
    assert_eq!(server.stat("ratelimit.redis.breaker_closed").await, Some(1));
}
