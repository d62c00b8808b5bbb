//! The memcached backend on the real binary and real memcached servers: upstream's keys
//! on upstream's node, exact counting under simultaneous requests, keys memcached cannot
//! hold, long windows, a node that dies and comes back, and the one pipelined
//! connection per node and worker (shared, matched in order, failed as a whole when
//! frozen or cut, and opened again).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratelimit_tests::memcached::{Dns, Memcached};
use ratelimit_tests::pki::temp_pki;
use ratelimit_tests::sidecar as support;

use std::time::{Duration, Instant};

use support::{Options, Server, ask, codes, request};
use tonic::Code;
use tonic::transport::Channel;

const RULES: &str = include_str!("fixtures/memcache.yaml");

fn server(nodes: &[&Memcached]) -> Server {
    server_with(nodes, vec![])
}

/// A server on `nodes`, with `extra` settings.
fn server_with(nodes: &[&Memcached], extra: Vec<(&'static str, String)>) -> Server {
    let list: Vec<String> = nodes.iter().map(|n| n.address()).collect();
    let mut env = vec![
        ("BACKEND_TYPE", "memcache"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .chain([("MEMCACHE_HOST_PORT", list.join(","))])
    .collect::<Vec<_>>();
    env.extend(extra);
    Server::start_with(Options {
        env,
        ..Options::rules(RULES)
    })
}

fn window_start(seconds: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    now - now % seconds
}

#[tokio::test]
async fn counters_live_under_upstreams_keys() {
    let node = Memcached::start();
    let server = server(&[&node]);
    let mut client = server.client().await;
    let mut overall = Vec::new();
    for _ in 0..4 {
        let answer = ask(&mut client, "m", &[&[("user", "alice")]]).await;
        overall.push(codes(&answer)[0]);
    }
    assert_eq!(overall, [(1, 2), (1, 1), (1, 0), (2, 0)]);
    let key = format!("m_user_alice_{}", window_start(3600));
    assert_eq!(node.get(&key).as_deref(), Some("4"));

    // A year is longer than memcached's 30-day relative expiries: sent as a unix time,
    // the counter stays (upstream's expires at once and never limits).
    for _ in 0..2 {
        ask(&mut client, "m", &[&[("yearly", "y")]]).await;
    }
    let yearly = node
        .get(&format!("m_yearly_y_{}", yearly_window_start()))
        .expect("the year counter is kept");
    assert_eq!(yearly, "2");
}

/// The start of the current year window: windows are counted from the epoch in units of
/// 365 days.
fn yearly_window_start() -> u64 {
    window_start(31_536_000)
}

#[tokio::test]
async fn three_nodes_hold_each_key_where_upstreams_client_puts_it() {
    let nodes = [Memcached::start(), Memcached::start(), Memcached::start()];
    let server = server(&[&nodes[0], &nodes[1], &nodes[2]]);
    let mut client = server.client().await;
    spread(&mut client, &[&nodes[0], &nodes[1], &nodes[2]], "u", 30).await;
}

/// Counts `count` new users (`{prefix}0`, …) and checks that each key is on the node
/// upstream's client puts it on (the CRC-32 of the key modulo the node count), and on no
/// other; every node must get some.
async fn spread(
    client: &mut RateLimitServiceClient<Channel>,
    nodes: &[&Memcached],
    prefix: &str,
    count: usize,
) {
    let start = window_start(3600);
    let mut used = vec![0; nodes.len()];
    for i in 0..count {
        let user = format!("{prefix}{i}");
        ask(client, "m", &[&[("user", &user)]]).await;
        let key = format!("m_user_{user}_{start}");
        let home = crc32fast::hash(key.as_bytes()) as usize % nodes.len();
        used[home] += 1;
        for (index, node) in nodes.iter().enumerate() {
            let expected = (index == home).then(|| "1".to_owned());
            assert_eq!(node.get(&key), expected, "{key} on node {index}");
        }
    }
    assert!(used.iter().all(|&n| n > 0), "every node got keys: {used:?}");
}

#[tokio::test]
async fn simultaneous_requests_never_pass_more_than_the_limit() {
    let node = Memcached::start();
    let server = server(&[&node]);
    let clients = clients(&server, 10).await;
    let requests = (0..100).map(|_| burst("shared", 1)).collect();
    let answers = all_at_once(&clients, requests).await.unwrap();
    let allowed = answers
        .iter()
        .filter(|a| a.as_ref().unwrap().overall_code == 1);
    // 100 requests from 10 connections at once against a limit of 20.
    assert_eq!(allowed.count(), 20);
}

#[tokio::test]
async fn keys_memcached_cannot_hold_fail_the_request_and_nothing_else() {
    let node = Memcached::start();
    let server = server(&[&node]);
    let mut client = server.client().await;
    let long = "v".repeat(300);
    for (value, says) in [
        ("two words", "space or a control character"),
        ("line\r\nflush_all", "space or a control character"),
        (long.as_str(), "bytes long"),
    ] {
        let refused = client
            .should_rate_limit(request("m", &[&[("user", "ok")], &[("user", value)]]))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("descriptor 1"), "{refused:?}");
        assert!(refused.message().contains(says), "{refused:?}");
    }
    let stats = server.stats().await;
    assert_eq!(
        stats["ratelimit.service.call.should_rate_limit.memcache_error"],
        3
    );
    assert!(server.log().contains("cannot be stored in memcached"));
    // Nothing reached memcached, and the connection still works.
    assert_eq!(node.stat("cmd_flush"), 0);
    let key = format!("m_user_ok_{}", window_start(3600));
    assert_eq!(node.get(&key), None);
    let answer = ask(&mut client, "m", &[&[("user", "ok")]]).await;
    assert_eq!(answer.overall_code, 1);
}

#[tokio::test]
async fn a_node_that_dies_fails_calls_promptly_and_is_used_again_when_it_returns() {
    let mut node = Memcached::start();
    let server = server(&[&node]);
    let mut client = server.client().await;
    let call = |user: &'static str| request("m", &[&[("user", user)]]);
    assert!(client.should_rate_limit(call("a")).await.is_ok());
    node.kill();
    let started = Instant::now();
    unavailable(&client.should_rate_limit(call("a")).await.unwrap_err());
    within(started, Duration::from_secs(2));
    node.restart();
    let answer = client.should_rate_limit(call("a")).await.unwrap();
    assert_eq!(answer.into_inner().overall_code, 1);
    assert!(
        server
            .stat("ratelimit.service.call.should_rate_limit.memcache_error")
            .await
            .unwrap()
            >= 1
    );
}

#[tokio::test]
async fn a_dead_node_opens_its_own_breaker_and_the_other_node_keeps_deciding() {
    let (mut dead, alive) = (Memcached::start(), Memcached::start());
    let server = server_with(
        &[&dead, &alive],
        vec![
            ("BACKEND_BREAKER_FAILURES", "2".into()),
            ("BACKEND_BREAKER_OPEN_DURATION", "1h".into()),
        ],
    );
    let (on_dead, on_alive) = yearly_users_by_node();
    dead.kill();
    let mut client = server.client().await;
    let mut refusals = Vec::new();
    for round in 0..4 {
        let ask = |user: &str| request("m", &[&[("yearly", user)]]);
        let answer = client.should_rate_limit(ask(&on_alive[round])).await;
        assert_eq!(answer.unwrap().into_inner().overall_code, 1);
        let failed = client.should_rate_limit(ask(&on_dead[round])).await;
        let failed = failed.unwrap_err();
        assert_eq!(failed.code(), Code::Unavailable);
        refusals.push(failed.message().contains("circuit breaker open"));
    }
    assert_eq!(
        refusals,
        [false, false, true, true],
        "opens after 2 failures"
    );
    assert_eq!(
        server.stat("ratelimit.memcache.breaker_opened").await,
        Some(1)
    );
}

/// Users whose yearly counter is on the first of two nodes, and those on the second
/// (yearly: a user's node cannot change during a test).
fn yearly_users_by_node() -> (Vec<String>, Vec<String>) {
    let home = |user: &String| {
        let key = format!("m_yearly_{user}_{}", yearly_window_start());
        crc32fast::hash(key.as_bytes()) as usize % 2
    };
    (0..60)
        .map(|i| format!("y{i}"))
        .partition(|user| home(user) == 0)
}

/// `count` clients, each on its own connection.
async fn clients(server: &Server, count: usize) -> Vec<RateLimitServiceClient<Channel>> {
    let mut clients = Vec::new();
    for _ in 0..count {
        clients.push(server.client().await);
    }
    clients
}

/// Sends `requests` all at once over `clients` in turn; the answers, in order, once all
/// are in.
fn all_at_once(
    clients: &[RateLimitServiceClient<Channel>],
    requests: Vec<RateLimitRequest>,
) -> tokio::task::JoinHandle<Vec<Result<RateLimitResponse, tonic::Status>>> {
    let calls: Vec<_> = requests
        .into_iter()
        .enumerate()
        .map(|(i, request)| {
            let mut client = clients[i % clients.len()].clone();
            tokio::spawn(async move {
                let answer = client.should_rate_limit(request).await;
                answer.map(tonic::Response::into_inner)
            })
        })
        .collect();
    tokio::spawn(async move {
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        answers
    })
}

/// A request that failed because memcached did not answer: `UNAVAILABLE`, naming
/// memcached (or MEMCACHE_TIMEOUT).
fn unavailable(failed: &tonic::Status) {
    assert_eq!(failed.code(), Code::Unavailable, "{failed:?}");
    let message = failed.message().to_lowercase();
    assert!(message.contains("memcache"), "{failed:?}");
}

/// Asserts that less than `limit` has passed since `started`.
fn within(started: Instant, limit: Duration) {
    let elapsed = started.elapsed();
    assert!(elapsed < limit, "{elapsed:?}, more than {limit:?}");
}

/// A request for `user` under the `burst` limit (20 an hour), adding `hits`.
fn burst(user: &str, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        hits_addend: hits,
        ..request("m", &[&[("burst", user)]])
    }
}

#[tokio::test]
async fn concurrent_requests_on_a_worker_share_one_connection_per_node() {
    let nodes = [Memcached::start(), Memcached::start()];
    let server = server_with(&[&nodes[0], &nodes[1]], vec![("GRPC_WORKERS", "1".into())]);
    let requests = (0..400).map(|i| burst(&format!("c{i}"), 1)).collect();
    let answers = all_at_once(&clients(&server, 8).await, requests)
        .await
        .unwrap();
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().unwrap().overall_code == 1)
    );
    // Every node got its share of the keys, over one connection.
    for node in &nodes {
        assert_eq!(
            node.accepted(),
            1,
            "connections node {} accepted",
            node.port
        );
        assert!(
            node.stat("incr_misses") > 100,
            "node {} got its keys",
            node.port
        );
    }
}

#[tokio::test]
async fn replies_are_matched_to_their_requests_under_concurrency() {
    let nodes = [Memcached::start(), Memcached::start()];
    let server = server_with(&[&nodes[0], &nodes[1]], vec![("GRPC_WORKERS", "1".into())]);
    // Each user adds its own number of hits: a reply handed to another request would
    // show as another remaining count.
    let hits = |i: u32| 1 + i % 19;
    for round in 0..2 {
        let requests = (0..300).map(|i| burst(&format!("m{i}"), hits(i))).collect();
        let answers = all_at_once(&clients(&server, 8).await, requests)
            .await
            .unwrap();
        for (i, answer) in (0..).zip(answers) {
            let answer = answer.unwrap();
            let total = hits(i) * (round + 1);
            let expected = match total <= 20 {
                true => (1, 20 - total),
                false => (2, 0),
            };
            assert_eq!(codes(&answer), [expected], "user m{i}, round {round}");
        }
    }
    let start = window_start(3600);
    for i in 0..300 {
        let key = format!("m_burst_m{i}_{start}");
        let home = &nodes[crc32fast::hash(key.as_bytes()) as usize % 2];
        assert_eq!(home.get(&key), Some((2 * hits(i)).to_string()), "{key}");
    }
}

#[tokio::test]
async fn a_frozen_node_fails_waiting_requests_by_the_deadline_and_its_connection_recovers() {
    let node = Memcached::start();
    let server = server_with(
        &[&node],
        vec![
            ("GRPC_WORKERS", "1".into()),
            ("MEMCACHE_TIMEOUT", "300ms".into()),
            ("BACKEND_BREAKER_FAILURES", "1000".into()),
        ],
    );
    let mut client = server.client().await;
    assert_eq!(
        ask(&mut client, "m", &[&[("user", "f")]])
            .await
            .overall_code,
        1
    );
    node.freeze();
    let clients = clients(&server, 8).await;
    let started = Instant::now();
    let requests = (0..20).map(|i| burst(&format!("f{i}"), 1)).collect();
    for answer in all_at_once(&clients, requests).await.unwrap() {
        unavailable(&answer.unwrap_err());
    }
    // MEMCACHE_TIMEOUT, with room for a loaded machine.
    within(started, Duration::from_millis(1500));
    // The late connection is failed as a whole, and the next request opens another.
    let late = support::eventually(Duration::from_secs(3), || async {
        server.log().contains("no reply within MEMCACHE_TIMEOUT")
    })
    .await;
    assert!(late, "{}", server.log());
    node.thaw();
    assert_eq!(
        ask(&mut client, "m", &[&[("user", "f")]])
            .await
            .overall_code,
        1
    );
    assert_eq!(node.accepted(), 2);
}

#[tokio::test]
async fn a_connection_cut_mid_pipeline_fails_only_the_requests_in_flight() {
    let (cut, other) = (Memcached::start(), Memcached::start());
    let server = server_with(
        &[&cut, &other],
        vec![
            ("GRPC_WORKERS", "1".into()),
            ("MEMCACHE_TIMEOUT", "10s".into()),
            ("BACKEND_BREAKER_FAILURES", "1000".into()),
        ],
    );
    let (on_cut, on_other) = yearly_users_by_node();
    let yearly = |user: &String| request("m", &[&[("yearly", user)]]);
    let mut client = server.client().await;
    for user in [&on_cut[0], &on_other[0]] {
        assert_eq!(
            client
                .should_rate_limit(yearly(user))
                .await
                .unwrap()
                .into_inner()
                .overall_code,
            1
        );
    }
    // Requests wait on the frozen node's connection when it is cut.
    cut.freeze();
    let in_flight = on_cut[1..11].iter().map(yearly).collect();
    let waiting = all_at_once(&clients(&server, 2).await, in_flight);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = client.should_rate_limit(yearly(&on_other[1])).await;
    assert_eq!(
        answer.unwrap().into_inner().overall_code,
        1,
        "the other node decides"
    );
    let cut_at = Instant::now();
    cut.cut_connections();
    for answer in waiting.await.unwrap() {
        unavailable(&answer.unwrap_err());
    }
    within(cut_at, Duration::from_secs(2));
    cut.thaw();
    // The next request opens a new connection at once.
    let answer = client.should_rate_limit(yearly(&on_cut[0])).await;
    assert_eq!(answer.unwrap().into_inner().overall_code, 1);
    assert_eq!((cut.accepted(), other.accepted()), (2, 1));
}

#[tokio::test]
async fn srv_discovery_finds_the_nodes_and_a_refresh_adds_one() {
    let name = "_memcache._tcp.rl.test";
    let (first, second) = (Memcached::start(), Memcached::start());
    let mut dns = Dns::start(name, &[("a.rl.test", first.port)]);
    let server = Server::start_with(Options {
        env: vec![
            ("BACKEND_TYPE", "memcache".into()),
            ("MEMCACHE_SRV", name.into()),
            ("MEMCACHE_SRV_DNS_SERVER", dns.address()),
            ("MEMCACHE_SRV_REFRESH", "200ms".into()),
        ],
        ..Options::rules(RULES)
    });
    let mut client = server.client().await;
    let start = window_start(3600);
    ask(&mut client, "m", &[&[("user", "before")]]).await;
    assert_eq!(
        first.get(&format!("m_user_before_{start}")).as_deref(),
        Some("1")
    );

    // A second record: the nodes are ordered by `target:port`, as upstream sorts them.
    dns.serve(
        name,
        &[("b.rl.test", second.port), ("a.rl.test", first.port)],
    );
    let changed = support::eventually(Duration::from_secs(10), || async {
        server.log().contains("memcached nodes changed")
    })
    .await;
    assert!(changed, "{}", server.log());
    spread(&mut client, &[&first, &second], "after", 20).await;
}

#[test]
fn memcached_node_settings_that_cannot_work_stop_start_up() {
    let dns = Dns::start("_memcache._tcp.rl.test", &[("a.rl.test", 11211)]);
    for (env, says) in [
        (
            vec![
                ("MEMCACHE_SRV", "_memcache._tcp.missing.test".to_owned()),
                ("MEMCACHE_SRV_DNS_SERVER", dns.address()),
            ],
            "SRV lookup of _memcache._tcp.missing.test",
        ),
        (
            vec![
                ("MEMCACHE_SRV", "_memcache._tcp.rl.test".to_owned()),
                ("MEMCACHE_HOST_PORT", "127.0.0.1:11211".to_owned()),
            ],
            "MEMCACHE_HOST_PORT and MEMCACHE_SRV are both set",
        ),
        (vec![], "MEMCACHE_HOST_PORT"),
    ] {
        let mut env = env;
        env.push(("BACKEND_TYPE", "memcache".to_owned()));
        let log = Server::refused(Options {
            env,
            ..Options::default()
        });
        assert!(log.contains(says), "{says}: {}", log);
    }
}

#[tokio::test]
async fn tls_to_the_nodes_checks_their_certificates_and_presents_ours() {
    let pki = temp_pki();
    let file = |name: &str| pki.path().join(name).display().to_string();
    let tls_server = |node: &Memcached, extra: Vec<(&'static str, String)>| {
        let mut env = vec![
            ("BACKEND_TYPE", "memcache".to_owned()),
            ("MEMCACHE_HOST_PORT", node.address()),
            ("MEMCACHE_TLS", "true".to_owned()),
            ("MEMCACHE_TLS_CACERT", file("ca.crt")),
        ];
        env.extend(extra);
        Server::start_with(Options {
            env,
            ..Options::rules(RULES)
        })
    };

    // A node whose certificate names 127.0.0.1, requiring our client certificate.
    let strict = Memcached::start_tls(pki.path(), "server", true);
    let with_identity = tls_server(
        &strict,
        vec![
            ("MEMCACHE_TLS_CLIENT_CERT", file("client.crt")),
            ("MEMCACHE_TLS_CLIENT_KEY", file("client.key")),
        ],
    );
    assert_eq!(tls_call(&with_identity).await, Ok(1));
    let anonymous = tls_server(&strict, vec![]);
    assert_eq!(tls_call(&anonymous).await, Err(Code::Unavailable));

    // A node whose certificate names another host: refused, unless the name check is off.
    let misnamed = Memcached::start_tls(pki.path(), "elsewhere", false);
    let checking = tls_server(&misnamed, vec![]);
    assert_eq!(tls_call(&checking).await, Err(Code::Unavailable));
    let lenient = tls_server(
        &misnamed,
        vec![("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "true".to_owned())],
    );
    assert_eq!(tls_call(&lenient).await, Ok(1));
}

/// One request for `user=tls`: the overall code, or the gRPC error code.
async fn tls_call(server: &Server) -> Result<i32, Code> {
    server
        .client()
        .await
        .should_rate_limit(request("m", &[&[("user", "tls")]]))
        .await
        .map(|a| a.into_inner().overall_code)
        .map_err(|status| status.code())
}
