//! GRPC_WORKERS: one single-threaded runtime per worker, each with its own listeners on
//! the shared ports and its own Redis connections, deciding against one set of counters.

use ratelimit_tests::on_every_backend;
use ratelimit_tests::sidecar as support;

use support::{Options, Redis, Server, Store, ask, codes, redis_env};

const OK: i32 = 1;
const OVER: i32 = 2;
const RULES: &str =
    "domain: w\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 10}}]\n";

fn start(workers: u16, backend: Vec<(&'static str, String)>, uds: bool) -> Server {
    let mut env = vec![
        ("GRPC_WORKERS", workers.to_string()),
        ("REDIS_POOL_SIZE", "1".into()),
    ];
    env.extend(backend);
    Server::start_with(Options {
        env,
        uds,
        ..Options::rules(RULES)
    })
}

/// Listening TCP sockets on `port` (IPv4), from the kernel's table. The kernel writes
/// the table a page per read, and sockets that other tests open and close between two
/// reads can make it skip or repeat a line: the count is one that two whole readings in
/// a row agree on.
fn listeners_on(port: u16) -> usize {
    let mut last = read_listeners_on(port);
    for _ in 0..20 {
        let count = read_listeners_on(port);
        if count == last {
            return count;
        }
        last = count;
    }
    panic!("the kernel's table of sockets never read the same twice in a row");
}

fn read_listeners_on(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1).is_some_and(|a| a.ends_with(&local)) && fields.get(3) == Some(&"0A")
        })
        .count()
}

/// Sends one request on each of `connections` new connections; returns the codes.
async fn one_per_connection(server: &Server, connections: usize, uds: bool) -> Vec<i32> {
    let mut answers = Vec::new();
    for _ in 0..connections {
        let mut client = if uds {
            server.uds_client().await
        } else {
            server.client().await
        };
        let response = ask(&mut client, "w", &[&[("user", "shared")]]).await;
        answers.push(codes(&response)[0].0);
    }
    answers
}

fn tally(codes: &[i32]) -> (usize, usize) {
    (
        codes.iter().filter(|c| **c == OK).count(),
        codes.iter().filter(|c| **c == OVER).count(),
    )
}

on_every_backend!(workers_listen_on_one_port_and_share_the_counters);
async fn workers_listen_on_one_port_and_share_the_counters(store: &Store) {
    let server = start(3, store.env(), false);
    assert_eq!(listeners_on(server.grpc), 3, "{}", server.log());
    assert_eq!(listeners_on(server.http), 3, "{}", server.log());
    assert_eq!(listeners_on(server.debug), 1, "{}", server.log());
    // The kernel spreads new connections over the three listeners; the limit of 10 holds
    // across them.
    let answers = one_per_connection(&server, 14, false).await;
    assert_eq!(tally(&answers), (10, 4), "{answers:?}");
    // /json on new connections counts against the same counter.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..3 {
        let response = http
            .post(server.http_url("/json"))
            .body(r#"{"domain":"w","descriptors":[{"entries":[{"key":"user","value":"shared"}]}]}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 429);
    }
}

#[tokio::test]
async fn unix_socket_connections_are_handed_to_every_worker() {
    let server = start(3, Vec::new(), true);
    let answers = one_per_connection(&server, 12, true).await;
    assert_eq!(tally(&answers), (10, 2), "{answers:?}");
}

#[tokio::test]
async fn each_worker_opens_its_own_redis_connections() {
    let redis = Redis::start(&[]);
    let server = start(3, redis_env(redis.port), false);
    // REDIS_POOL_SIZE=1: one connection per worker (redis-cli's own is the fourth).
    let clients = redis.cli(&["CLIENT", "LIST"]);
    assert_eq!(clients.lines().count(), 4, "{clients}");
    let answers = one_per_connection(&server, 11, false).await;
    assert_eq!(tally(&answers), (10, 1), "{answers:?}");
}

#[test]
fn a_port_already_in_use_stops_start_up_even_for_shared_listeners() {
    let first = start(2, Vec::new(), false);
    // A second server on the same gRPC port, also with shared (SO_REUSEPORT) listeners,
    // must not quietly take half of the first one's connections.
    let log = Server::refused(Options {
        env: vec![
            ("GRPC_WORKERS", "2".into()),
            ("GRPC_PORT", first.grpc.to_string()),
        ],
        ..Options::rules(RULES)
    });
    assert!(
        log.contains(&format!("cannot listen on gRPC 127.0.0.1:{}", first.grpc)),
        "{log}"
    );
    assert_eq!(listeners_on(first.grpc), 2);
}
