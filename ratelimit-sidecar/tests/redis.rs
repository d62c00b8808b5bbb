//! The Redis backend against real `redis-server` processes.

use ratelimit_tests::pki::temp_pki;
use ratelimit_tests::redis_failover::{Sentinel, finish_migration, open_migration, pipe};
use ratelimit_tests::sidecar as support;

use std::time::{Duration, Instant};

use support::{
    Options, Redis, Server, ask, codes, post, redis_addresses, redis_cluster, redis_env, request,
};
use tonic::Code;

const OK: i32 = 1;
const OVER: i32 = 2;

const RULES: &str = include_str!("fixtures/redis.yaml");

fn sidecar(env: Vec<(&'static str, String)>) -> Server {
    Server::start_with(Options {
        env,
        ..Options::rules(RULES)
    })
}

/// A sidecar on [`RULES`] counting in the Redis on `port`, with `extra` settings.
fn on_redis(port: u16, extra: &[(&'static str, &str)]) -> Server {
    let mut env = redis_env(port);
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    sidecar(env)
}

/// A new Redis, and a sidecar on [`RULES`] counting in it with `extra` settings.
fn on_new_redis(extra: &[(&'static str, &str)]) -> (Redis, Server) {
    let redis = Redis::start(&[]);
    let server = on_redis(redis.port, extra);
    (redis, server)
}

fn minute_start() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    now - now % 60
}

#[tokio::test]
async fn counts_in_redis_under_envoy_ratelimit_keys_with_the_window_ttl() {
    let (redis, server) = on_new_redis(&[("CACHE_KEY_PREFIX", "pfx:")]);
    let mut client = server.client().await;
    let window = minute_start();
    let got: Vec<_> = ask_alice(&mut client, 3).await;
    if minute_start() != window {
        return; // the minute rolled over mid-test; the keys below would span two windows
    }
    assert_eq!(got, [(OK, 1), (OK, 0), (OVER, 0)]);
    let key = format!("pfx:rd_user_alice_{window}");
    assert_eq!(redis.keys(), std::slice::from_ref(&key));
    assert_eq!(redis.cli(&["GET", &key]), "3");
    let ttl: u64 = redis.cli(&["TTL", &key]).parse().unwrap();
    assert!((1..=60).contains(&ttl), "ttl {ttl}");
}

async fn ask_alice(
    client: &mut envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >,
    n: usize,
) -> Vec<(i32, u32)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = ask(client, "rd", &[&[("user", "alice")]]).await;
        out.extend(codes(&r));
    }
    out
}

#[tokio::test]
async fn per_second_limits_go_to_their_own_redis() {
    let main = Redis::start(&[]);
    let per_second = Redis::start(&[]);
    let mut env = redis_env(main.port);
    env.extend([
        ("REDIS_PERSECOND", "true".into()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".into()),
        (
            "REDIS_PERSECOND_URL",
            format!("127.0.0.1:{}", per_second.port),
        ),
    ]);
    let server = sidecar(env);
    let mut client = server.client().await;
    let r = ask(&mut client, "rd", &[&[("user", "u")], &[("burst", "b")]]).await;
    assert_eq!(codes(&r), [(OK, 1), (OK, 99)]);
    let main_keys = main.keys();
    let second_keys = per_second.keys();
    assert_eq!(main_keys.len(), 1);
    assert!(main_keys[0].starts_with("rd_user_u_"), "{main_keys:?}");
    assert_eq!(second_keys.len(), 1);
    assert!(second_keys[0].starts_with("rd_burst_b_"), "{second_keys:?}");
}

#[tokio::test]
async fn password_acl_user_and_unix_socket() {
    let with_password = Redis::start(&["--requirepass", "s3cret"]);
    let server = on_redis(with_password.port, &[("REDIS_AUTH", "s3cret")]);
    let r = server.ask("rd", &[&[("user", "p")]]).await;
    assert_eq!(codes(&r), [(OK, 1)]);
    assert!(
        !server.log().contains("s3cret"),
        "passwords never reach the log"
    );

    let acl = Redis::start(&["--user", "rl", "on", ">pw", "~*", "+@all"]);
    let server = on_redis(acl.port, &[("REDIS_AUTH", "rl:pw")]);
    let r = server.ask("rd", &[&[("user", "q")]]).await;
    assert_eq!(codes(&r), [(OK, 1)]);

    let socket_dir = tempfile::tempdir().unwrap();
    let socket = socket_dir.path().join("redis.sock");
    let unix = Redis::start(&[
        "--unixsocket",
        socket.to_str().unwrap(),
        "--unixsocketperm",
        "700",
    ]);
    let server = sidecar(vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_SOCKET_TYPE", "unix".into()),
        ("REDIS_URL", socket.display().to_string()),
    ]);
    let r = server.ask("rd", &[&[("user", "s")]]).await;
    assert_eq!(codes(&r), [(OK, 1)]);
    assert_eq!(unix.keys().len(), 1);
}

#[tokio::test]
async fn a_redis_outage_is_a_prompt_unavailable_and_recovers_by_itself() {
    let (mut redis, server) = on_new_redis(&[("REDIS_TIMEOUT", "1s")]);
    let mut client = server.client().await;
    ask(&mut client, "rd", &[&[("user", "o")]]).await;
    redis.kill();
    for _ in 0..3 {
        let started = Instant::now();
        let error = client
            .should_rate_limit(request("rd", &[&[("user", "o")]]))
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::Unavailable, "{}", error.message());
        assert!(error.message().contains("redis"), "{}", error.message());
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "took {:?}",
            started.elapsed()
        );
    }
    let body = r#"{"domain":"rd","descriptors":[{"entries":[{"key":"user","value":"o"}]}]}"#;
    let (status, _) = post(&server.http_url("/json"), body).await;
    assert_eq!(status, 500);
    assert!(
        server
            .stat("ratelimit.service.call.should_rate_limit.redis_error")
            .await
            .unwrap_or(0)
            >= 4
    );
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match client
            .should_rate_limit(request("rd", &[&[("user", "back")]]))
            .await
        {
            Ok(r) => {
                assert_eq!(codes(r.get_ref()), [(OK, 1)]);
                break;
            }
            Err(e) if Instant::now() < deadline => {
                assert_eq!(e.code(), Code::Unavailable);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("did not recover: {e}"),
        }
    }
}

#[tokio::test]
async fn a_three_master_cluster_spreads_keys_over_slots() {
    let nodes = redis_cluster(3, &[]);
    let addresses = redis_addresses(&nodes);
    let server = sidecar(vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_TYPE", "cluster".into()),
        ("REDIS_URL", addresses.join(",")),
        ("REDIS_PIPELINE_WINDOW", "150us".into()),
    ]);
    let mut client = server.client().await;
    for i in 0..30 {
        let user = format!("u{i}");
        let r = ask(
            &mut client,
            "rd",
            &[&[("user", &user)], &[("burst", &user)]],
        )
        .await;
        assert_eq!(codes(&r), [(OK, 1), (OK, 99)], "{user}");
    }
    let per_node: Vec<usize> = nodes.iter().map(|n| n.keys().len()).collect();
    assert_eq!(per_node.iter().sum::<usize>(), 60, "{per_node:?}");
    assert!(
        per_node.iter().all(|&n| n > 0),
        "keys on every master: {per_node:?}"
    );
}

#[tokio::test]
async fn the_local_cache_stops_asking_redis_about_keys_already_over() {
    let (redis, server) = on_new_redis(&[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")]);
    let mut client = server.client().await;
    let window = minute_start();
    let got = ask_alice(&mut client, 5).await;
    if minute_start() != window {
        return; // the minute rolled over mid-test
    }
    assert_eq!(got, [(OK, 1), (OK, 0), (OVER, 0), (OVER, 0), (OVER, 0)]);
    assert_eq!(
        redis.cli(&["GET", &format!("rd_user_alice_{window}")]),
        "3",
        "two answers came from the cache"
    );
    assert_eq!(server.stat("ratelimit.localcache.hitCount").await, Some(2));
    assert_eq!(
        server.stat("ratelimit.localcache.entryCount").await,
        Some(1)
    );
    let stats = server.stats().await;
    assert_eq!(
        stats["ratelimit.service.rate_limit.rd.user.over_limit_with_local_cache"],
        2
    );
}

#[tokio::test]
async fn sentinel_finds_the_master_and_follows_a_failover_during_traffic() {
    let (mut master, replica, sentinel) = Sentinel::with_replica();
    let server = sidecar(vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_TYPE", "sentinel".into()),
        ("REDIS_URL", sentinel.url()),
        ("REDIS_TIMEOUT", "1s".into()),
    ]);
    let mut client = server.client().await;
    let r = ask(&mut client, "rd", &[&[("burst", "before")]]).await;
    assert_eq!(codes(&r), [(OK, 99)]);
    assert_eq!(master.keys().len(), 1);

    master.kill();
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut failures = 0;
    loop {
        let started = Instant::now();
        match client
            .should_rate_limit(request("rd", &[&[("burst", "after")]]))
            .await
        {
            Ok(r) => {
                assert_eq!(codes(r.get_ref()).len(), 1);
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
                assert!(
                    started.elapsed() < Duration::from_secs(4),
                    "a call hung for {:?}",
                    started.elapsed()
                );
                failures += 1;
                assert!(
                    Instant::now() < deadline,
                    "no failover after {failures} failures: {}",
                    e.message()
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    assert!(failures > 0, "the master was down for a while");
    let keys = replica.keys();
    let took_writes = keys.iter().any(|k| k.starts_with("rd_burst_after_"));
    assert!(
        took_writes,
        "the promoted replica took the writes: {keys:?}"
    );
}

/// A TLS-only Redis presenting `<cert>.crt` from `pki`; `clients` is `yes` to require
/// client certificates.
fn tls_redis(pki: &std::path::Path, cert: &str, clients: &str) -> Redis {
    let file = |name: String| pki.join(name).display().to_string();
    let (cert, key, ca) = (
        file(format!("{cert}.crt")),
        file(format!("{cert}.key")),
        file("ca.crt".into()),
    );
    Redis::start_tls(&[
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        clients,
    ])
}

#[tokio::test]
async fn tls_with_a_client_certificate() {
    let pki = temp_pki();
    let file = |name: &str| pki.path().join(name).display().to_string();
    let redis = tls_redis(pki.path(), "server", "yes");
    let server = sidecar(vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("REDIS_TLS", "true".into()),
        ("REDIS_TLS_CACERT", file("ca.crt")),
        ("REDIS_TLS_CLIENT_CERT", file("client.crt")),
        ("REDIS_TLS_CLIENT_KEY", file("client.key")),
    ]);
    let r = server.ask("rd", &[&[("user", "tls")]]).await;
    assert_eq!(codes(&r), [(OK, 1)]);
}

#[tokio::test]
async fn tls_hostname_check_can_be_skipped_but_the_chain_is_still_verified() {
    let pki = temp_pki();
    let file = |name: &str| pki.path().join(name).display().to_string();
    // The server presents a certificate for another name.
    let redis = tls_redis(pki.path(), "elsewhere", "no");
    let env = |skip: &str| {
        vec![
            ("BACKEND_TYPE", "redis".into()),
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("REDIS_TLS", "true".into()),
            ("REDIS_TLS_CACERT", file("ca.crt")),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", skip.into()),
            ("REDIS_STARTUP_INITIAL_INTERVAL", "100ms".into()),
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s".into()),
        ]
    };
    let log = Server::refused(Options {
        env: env("false"),
        ..Options::default()
    });
    assert!(log.contains("not valid for name"), "{log}");

    let lenient = sidecar(env("true"));
    let r = lenient.ask("rd", &[&[("user", "name")]]).await;
    assert_eq!(codes(&r), [(OK, 1)]);

    // A CA that did not sign the certificate is refused even without the name check.
    let other = temp_pki();
    let mut untrusted_env = env("true");
    untrusted_env.retain(|(k, _)| *k != "REDIS_TLS_CACERT");
    untrusted_env.push((
        "REDIS_TLS_CACERT",
        other.path().join("ca.crt").display().to_string(),
    ));
    Server::refused(Options {
        env: untrusted_env,
        ..Options::default()
    });
}

#[tokio::test]
async fn sigterm_lets_a_request_in_flight_finish_before_exiting() {
    let redis = Redis::start(&[]);
    let mut server = sidecar(redis_env(redis.port));
    let mut client = server.client().await;
    ask(&mut client, "rd", &[&[("user", "warm")]]).await;
    // Redis holds every command for two seconds: the next request stays in flight.
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "2000", "ALL"]), "OK");
    let in_flight = tokio::spawn(async move {
        client
            .should_rate_limit(request("rd", &[&[("user", "slow")]]))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("TERM");
    // The signal is delivered asynchronously: health must turn while the request is
    // still held by Redis (the pause lasts 1.7 s more).
    let unhealthy = support::eventually(Duration::from_millis(1000), || async {
        match reqwest::get(server.http_url("/healthcheck")).await {
            Ok(r) => r.status() == 500,
            Err(_) => true,
        }
    })
    .await;
    assert!(unhealthy, "unhealthy while draining");
    let answer = in_flight
        .await
        .unwrap()
        .expect("the request in flight was answered");
    assert_eq!(codes(answer.get_ref()), [(OK, 1)]);
    let status = server
        .wait_exit(Duration::from_secs(15))
        .expect("exits after draining");
    assert!(status.success(), "{status:?}");
}

/// Concurrent requests on one worker go out on the first connection of the pool, so that
/// their commands share writes; the pool's other connections stay idle until that one has
/// hundreds of requests waiting.
#[tokio::test]
async fn concurrent_requests_share_the_first_connection_of_the_pool() {
    let (redis, server) = on_new_redis(&[("GRPC_WORKERS", "1"), ("REDIS_POOL_SIZE", "4")]);
    let client = server.client().await;
    let calls: Vec<_> = (0..64)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let value = format!("b{i}");
                let r = ask(&mut client, "rd", &[&[("burst", &value)]]).await;
                codes(&r)
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), [(OK, 99)]);
    }
    assert_eq!(redis.keys().len(), 64);
    let list = redis.cli(&["CLIENT", "LIST"]);
    let pool: Vec<&str> = list
        .lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .collect();
    assert_eq!(pool.len(), 4, "{list}");
    let used = pool
        .iter()
        .filter(|line| !line.contains("cmd=NULL"))
        .count();
    assert_eq!(used, 1, "{list}");
}

#[tokio::test]
async fn a_migrating_slot_is_asked_of_its_target_once_then_moved() {
    let nodes = redis_cluster(3, &[]);
    let server = sidecar(vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_TYPE", "cluster".into()),
        ("REDIS_URL", redis_addresses(&nodes).join(",")),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0".into()),
    ]);
    let mut client = server.client().await;
    // The users whose counters of this minute fall in the first master's slots (`redis-cli
    // --cluster create` gives it the first third): those slots migrate to the second.
    let (from, to) = (&nodes[0], &nodes[1]);
    let window = minute_start();
    let users: Vec<String> = (0..24).map(|i| format!("u{i}")).collect();
    let keys: Vec<String> = users
        .iter()
        .map(|u| format!("rd_user_{u}_{window}"))
        .collect();
    let key_slots: String = keys
        .iter()
        .map(|k| format!("CLUSTER KEYSLOT {k}\n"))
        .collect();
    let slots: Vec<u16> = pipe(from, &key_slots)
        .lines()
        .map(|slot| slot.trim().parse().unwrap())
        .collect();
    let migrating: Vec<u16> = slots.iter().copied().filter(|&s| s < 5461).collect();
    assert!(
        !migrating.is_empty(),
        "no counter on the first master: {slots:?}"
    );
    open_migration(from, to, &migrating);
    // Each call must be answered (`ask` fails on an error status); the counts are
    // compared at the end, within one minute's window.
    let mut got = Vec::new();
    for user in users.iter().chain(&users) {
        got.extend(codes(&ask(&mut client, "rd", &[&[("user", user)]]).await));
    }
    // The source holds none of the new counters: those of its slots were asked of the
    // target.
    assert_eq!(from.keys(), Vec::<String>::new());
    finish_migration(from, to, &[&nodes[2]], &migrating);
    for user in &users {
        got.extend(codes(&ask(&mut client, "rd", &[&[("user", user)]]).await));
    }
    if minute_start() != window {
        return; // the minute rolled over mid-test: the counts spanned two windows
    }
    // Counted once each while asked (the second answer is not OVER), then followed
    // where the slots moved, each with its window's TTL.
    let expected = [(OK, 1), (OK, 0), (OVER, 0)].map(|code| vec![code; users.len()]);
    assert_eq!(got, expected.concat());
    let asked = keys.iter().zip(&slots).filter(|(_, slot)| **slot < 5461);
    for (key, _) in asked {
        let ttl: i64 = to.cli(&["TTL", key]).parse().unwrap();
        assert!((1..=60).contains(&ttl), "{key}: ttl {ttl}");
    }
}
