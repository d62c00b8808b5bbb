//! Hostile input and unlucky configurations, end to end on the real binary: huge addends,
//! oversized names, malformed protobuf, memory and connection bounds, symbolic link loops
//! and deeply nested YAML.

use ratelimit_tests::calls::exchange;
use ratelimit_tests::on_every_backend;
use ratelimit_tests::sidecar as support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use futures_util::StreamExt;
use prost::Message;
use support::{
    Options, Redis, Server, Store, ask, binary, codes, eventually, post, redis_env, request,
};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

const OK: i32 = 1;
const OVER: i32 = 2;

/// `user`: 100 an hour; `value`: 100 an hour with a statistic per value.
const RULES: &str = "domain: h\ndescriptors:
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: value, detailed_metric: true, rate_limit: {unit: hour, requests_per_unit: 100}}
";

fn start(backend: Vec<(&'static str, String)>, env: &[(&'static str, &str)]) -> Server {
    let mut options = Options {
        ..Options::rules(RULES)
    };
    options
        .env
        .extend(env.iter().map(|(k, v)| (*k, (*v).to_owned())));
    options.env.extend(backend);
    Server::start_with(options)
}

/// Runs `ratelimit-config-check` on `dir`: whether it passed, and what it printed.
fn config_check(dir: &std::path::Path) -> (bool, String) {
    let binary = binary("ratelimit-config-check");
    let output = Command::new(binary)
        .arg("-config_dir")
        .arg(dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (output.status.success(), stdout)
}

fn with_hits(mut request: RateLimitRequest, hits: u64) -> RateLimitRequest {
    request.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
    request
}

on_every_backend!(a_huge_addend_is_over_the_limit_and_cannot_reset_a_counter);

/// Asks `request` with each addend of `hits` in turn: every answer is over the limit
/// with nothing left.
async fn all_over(
    client: &mut RateLimitServiceClient<Channel>,
    request: &RateLimitRequest,
    hits: &[u64],
) {
    for &hits in hits {
        let response = client
            .should_rate_limit(with_hits(request.clone(), hits))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(codes(&response), [(OVER, 0)], "{hits}");
    }
}

/// `hits_addend` is a uint64, as upstream takes it: the whole range is accepted, and a
/// counter saturates instead of wrapping back under its limit.
async fn a_huge_addend_is_over_the_limit_and_cannot_reset_a_counter(store: &Store) {
    let server = start(store.env(), &[]);
    let mut client = server.client().await;
    let mallory = request("h", &[&[("user", "mallory")]]);
    let over = client
        .should_rate_limit(with_hits(mallory.clone(), 151))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&over), [(OVER, 0)]);

    // 2^64 - 151 wraps a counter to 0; 2^63 twice does the same; 2^32 + 5 is past u32.
    let huge = [u64::MAX - 150, 1 << 63, 1 << 63, (1 << 32) + 5, u64::MAX];
    all_over(&mut client, &mallory, &huge).await;
    let body = format!(
        r#"{{"domain":"h","descriptors":[{{"entries":[{{"key":"user","value":"mallory"}}],"hitsAddend":"{}"}}]}}"#,
        u64::MAX - 150
    );
    let (status, _) = post(&server.http_url("/json"), &body).await;
    assert_eq!(status, 429);

    let still = client
        .should_rate_limit(mallory)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&still), [(OVER, 0)], "the counter was not reset");

    // A fresh counter given the largest addend stays over: one more hit does not wrap it.
    let trudy = request("h", &[&[("user", "trudy")]]);
    all_over(&mut client, &trudy, &[u64::MAX, u64::MAX, 1]).await;
}

#[tokio::test]
async fn a_redis_counter_past_i64_is_over_the_limit_not_a_backend_failure() {
    let redis = Redis::start(&[]);
    let server = start(redis_env(redis.port), &[]);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for hour in [now - now % 3600, now - now % 3600 + 3600] {
        redis.cli(&[
            "SET",
            &format!("h_user_eve_{hour}"),
            &(i64::MAX - 10).to_string(),
        ]);
    }
    let eve = with_hits(request("h", &[&[("user", "eve")]]), 100);
    let response = server
        .client()
        .await
        .should_rate_limit(eve)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&response), [(OVER, 0)]);
    let stats = server.stats().await;
    assert_eq!(
        stats["ratelimit.service.call.should_rate_limit.redis_error"],
        0
    );
}

#[tokio::test]
async fn names_past_their_bounds_are_invalid_arguments() {
    let server = start(Vec::new(), &[("MAX_DESCRIPTOR_VALUE_BYTES", "64")]);
    let mut client = server.client().await;
    let long_value = "v".repeat(65);
    let cases = [
        (
            request(&"d".repeat(257), &[&[("user", "a")]]),
            "domain is 257 bytes long; at most 256 are allowed",
        ),
        (
            request("h", &[&[("user", "a")], &[("user", &long_value)]]),
            "descriptors[1].entries[0].value is 65 bytes long; at most 64 are allowed",
        ),
    ];
    for (request, message) in cases {
        let error = client.should_rate_limit(request).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument);
        assert_eq!(error.message(), message);
    }
    let at_bound = request("h", &[&[("user", &"v".repeat(64))]]);
    let ok = client
        .should_rate_limit(at_bound)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&ok), [(OK, 99)]);
}

/// Sends raw bytes as the request message.
#[derive(Clone, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

/// A client that sends raw bytes as messages, connected to `server`'s gRPC port.
async fn raw_client(server: &Server) -> tonic::client::Grpc<Channel> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", server.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc
}

#[tokio::test]
async fn a_malformed_protobuf_is_an_invalid_argument() {
    let server = start(Vec::new(), &[]);
    let mut grpc = raw_client(&server).await;
    let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        .parse()
        .unwrap();
    // Field 1 (domain) announced as 255 bytes long, with 2 present.
    let error = grpc
        .unary(
            tonic::Request::new(vec![0x0a, 0xff, 0x01, b'h', b'i']),
            path,
            Raw,
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
    assert!(
        error
            .message()
            .starts_with("the body is not a RateLimitRequest"),
        "{error:?}"
    );

    let unknown = "/envoy.service.ratelimit.v3.RateLimitService/Nope"
        .parse()
        .unwrap();
    grpc.ready().await.unwrap();
    let error = grpc
        .unary(tonic::Request::new(Vec::new()), unknown, Raw)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::Unimplemented);
}

on_every_backend!(a_call_is_answered_on_its_first_message_and_its_lists_are_bounded);

/// A call is answered on its first message while the client's stream stays open, as
/// grpc-go answers it (it was held, with its decoded message, until the client ended the
/// stream), on every backend; and a request with more descriptors or entries than the
/// bounds is refused.
async fn a_call_is_answered_on_its_first_message_and_its_lists_are_bounded(store: &Store) {
    let bounds = [("MAX_DESCRIPTORS", "4"), ("MAX_DESCRIPTOR_ENTRIES", "2")];
    let server = start(store.env(), &bounds);
    let mut grpc = raw_client(&server).await;
    let path = || {
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
            .parse()
            .unwrap()
    };
    let message = request("h", &[&[("user", "a")]]).encode_to_vec();
    let open = futures_util::stream::iter([message]).chain(futures_util::stream::pending());
    let call = grpc.client_streaming(tonic::Request::new(open), path(), Raw);
    let answer = tokio::time::timeout(Duration::from_secs(5), call).await;
    let answer = answer.expect("answered with the stream open").unwrap();
    let answer = RateLimitResponse::decode(&answer.into_inner()[..]).unwrap();
    assert_eq!(answer.overall_code, OK);
    let entry = [("user", "a")];
    for (descriptors, field) in [
        (vec![&entry[..]; 5], "descriptors has more than 4 items"),
        (
            vec![&[("a", "1"), ("b", "2"), ("c", "3")][..]],
            "descriptors[0].entries has more than 2 items",
        ),
    ] {
        let message = request("h", &descriptors).encode_to_vec();
        grpc.ready().await.unwrap();
        let error = grpc
            .unary(tonic::Request::new(message), path(), Raw)
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
        assert!(error.message().starts_with(field), "{error:?}");
    }
}

#[tokio::test]
async fn the_memory_backend_is_bounded_in_bytes_and_stats_stream() {
    let server = start(Vec::new(), &[("MEMORY_MAX_BYTES", "262144")]);
    let mut client = server.client().await;
    let big = "x".repeat(4000);
    for i in 0..300 {
        let value = format!("{big}{i}");
        ask(&mut client, "h", &[&[("user", &value)]]).await;
    }
    let bytes = server.stat("ratelimit.memory.bytes").await.unwrap();
    assert!(bytes <= 262_144, "{bytes} bytes held");
    assert!(server.stat("ratelimit.memory.evictions").await.unwrap() > 0);

    // 300 detailed_metric keys and 300 unknown domains: every line, sorted, streamed.
    for i in 0..300 {
        ask(&mut client, "h", &[&[("value", &format!("v{i:03}"))]]).await;
        ask(&mut client, &format!("nope{i:03}"), &[&[("user", "a")]]).await;
    }
    let response = reqwest::get(server.debug_url("/stats")).await.unwrap();
    assert!(
        response.headers().get("content-length").is_none(),
        "streamed, not one string"
    );
    let text = response.text().await.unwrap();
    let detailed = text
        .lines()
        .filter(|l| l.contains(".value_v") && l.contains(".total_hits: 1"))
        .count();
    let not_found = text
        .lines()
        .filter(|l| l.ends_with(".domain_not_found: 1"))
        .count();
    assert_eq!((detailed, not_found), (300, 300));
    let names: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("ratelimit_server."))
        .collect();
    assert!(names.windows(2).all(|w| w[0] <= w[1]), "sorted");
    assert!(text.contains("ratelimit.memory.counters: "));
}

#[tokio::test]
async fn idle_and_slow_connections_cannot_starve_the_http_listeners() {
    let mut options = Options {
        nofile: Some(128),
        ..Options::rules(RULES)
    };
    options.env.extend([
        ("HTTP_MAX_CONNECTIONS", "16".to_owned()),
        ("HTTP_HEADER_READ_TIMEOUT", "1s".to_owned()),
        ("HTTP_IDLE_TIMEOUT", "2s".to_owned()),
    ]);
    let server = Server::start_with(options);
    // More idle and half-sent connections than the process has file descriptors.
    let mut held = Vec::new();
    for i in 0..150 {
        for port in [server.http, server.debug] {
            let mut stream = TcpStream::connect(("127.0.0.1", port))
                .expect("the server accepts or queues every connection");
            if i % 2 == 0 {
                let _ = stream.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n");
            }
            held.push(stream);
        }
    }
    let answered = eventually(Duration::from_secs(60), || async {
        let health = reqwest::get(server.http_url("/healthcheck")).await;
        let debug = reqwest::get(server.debug_url("/")).await;
        matches!((health, debug), (Ok(h), Ok(d)) if h.status() == 200 && d.status() == 200)
    })
    .await;
    assert!(answered, "health and debug answer; log:\n{}", server.log());
    // The first connections were closed by the server, not left open.
    let mut first = held.swap_remove(0);
    first
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = match first.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "closed by the server");
}

#[tokio::test]
async fn symbolic_link_loops_are_refused_not_followed_forever() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), RULES).unwrap();
    std::os::unix::fs::symlink(".", dir.path().join("a")).unwrap();
    std::os::unix::fs::symlink(".", dir.path().join("b")).unwrap();
    let (ok, stdout) = config_check(dir.path());
    assert!(!ok, "{stdout}");
    assert!(stdout.contains("symbolic link loop"), "{stdout}");

    // The same directory swapped in under a running server: the reload is refused and
    // the previous rules keep answering.
    let server = start(Vec::new(), &[]);
    let v2 = server.dir.path().join("v2");
    std::fs::create_dir_all(v2.join("config")).unwrap();
    std::fs::write(v2.join("config/rules.yaml"), RULES).unwrap();
    std::os::unix::fs::symlink(".", v2.join("config/a")).unwrap();
    std::os::unix::fs::symlink(".", v2.join("config/b")).unwrap();
    let tmp = server.dir.path().join("current.tmp");
    std::os::unix::fs::symlink(&v2, &tmp).unwrap();
    std::fs::rename(&tmp, server.dir.path().join("current")).unwrap();
    let refused = eventually(Duration::from_secs(30), || async {
        server.log().contains("symbolic link loop")
    })
    .await;
    assert!(refused, "{}", server.log());
    let response = server.ask("h", &[&[("user", "a")]]).await;
    assert_eq!(codes(&response), [(OK, 99)]);
}

#[test]
fn the_watcher_does_not_follow_chains_of_directory_links() {
    // d0/{a,b} -> ../d1, d1/{a,b} -> ../d2, …: 2^24 paths through 24 directories.
    let mut links = Vec::new();
    for i in 0..24 {
        for name in ["a", "b"] {
            links.push((format!("d{i}/{name}"), format!("../d{}", i + 1)));
        }
    }
    let mut options = Options {
        watch_root: false,
        links,
        ..Options::rules(RULES)
    };
    options.env.push(("LOG_LEVEL", "info".to_owned()));
    let server = Server::start_with(options);
    assert!(
        server.log().contains("loaded rate limit configuration"),
        "{}",
        server.log()
    );
}

#[test]
fn an_addend_bound_of_zero_stops_start_up() {
    let mut options = Options::default();
    options.env.push(("MAX_HITS_ADDEND", "0".to_owned()));
    let log = Server::refused(options);
    assert!(log.contains("MAX_HITS_ADDEND"), "{log}");
}

#[tokio::test]
async fn connections_past_the_cap_get_a_503_until_one_closes() {
    // Three workers share one cap of two: whichever listeners the kernel gives the
    // connections to, two are served and the third, past the cap, is told so at once
    // (only health checks are answered there) until one of the two closes. No other
    // connection takes a slot meanwhile: the harness saw the port listening without
    // connecting to it, and the two are kept alive far longer than the test lasts.
    let server = start(
        Vec::new(),
        &[
            ("HTTP_MAX_CONNECTIONS", "2"),
            ("HTTP_HEADER_READ_TIMEOUT", "120s"),
            ("HTTP_IDLE_TIMEOUT", "120s"),
            ("GRPC_WORKERS", "3"),
        ],
    );
    let body = r#"{"domain":"h","descriptors":[{"entries":[{"key":"user","value":"cap"}]}]}"#;
    let decide = format!(
        "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // One after the other: the third is past the cap whichever worker accepts it.
    let mut connections = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..3 {
        let (stream, answer) =
            exchange(server.http, decide.as_bytes(), Duration::from_secs(30)).unwrap();
        answers.push(answer);
        connections.push(stream);
    }
    let statuses: Vec<&str> = answers.iter().map(|a| a.get(..12).unwrap_or(a)).collect();
    assert_eq!(
        statuses,
        ["HTTP/1.1 200", "HTTP/1.1 200", "HTTP/1.1 503"],
        "{answers:?}"
    );
    // Closing the kept-alive connections frees their slots.
    drop(connections);
    let served = eventually(Duration::from_secs(30), || async {
        post(&server.http_url("/json"), body).await.0 == 200
    })
    .await;
    assert!(served, "{}", server.log());
}

#[test]
fn deeply_nested_yaml_is_refused_early() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("deep.yaml"), "[".repeat(200_000)).unwrap();
    let (ok, stdout) = config_check(dir.path());
    assert!(!ok, "{stdout}");
    assert!(
        stdout.contains("collections are nested more than 100 levels deep"),
        "{stdout}"
    );
    let server = Server::start(&[("deep.yaml", &"[".repeat(200_000))]);
    assert!(
        server.log().contains("nested more than 100 levels"),
        "{}",
        server.log()
    );
}
