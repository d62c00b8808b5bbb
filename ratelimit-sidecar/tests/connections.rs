//! What a gRPC client can hold: connections past GRPC_MAX_CONNECTIONS wait in the listen
//! backlog, a connection that sends no HTTP/2 preface is closed after
//! GRPC_PREFACE_TIMEOUT, SETTINGS advertise GRPC_MAX_CONCURRENT_STREAMS, and silent gRPC
//! connections cannot take the descriptors the other listeners need.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ratelimit_tests::sidecar::{Options, Server, eventually, request};

const RULES: &str =
    "domain: c\ndescriptors:\n  - {key: user, rate_limit: {unit: hour, requests_per_unit: 100}}\n";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: what a client sends after the preface.
const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
/// SETTINGS_MAX_CONCURRENT_STREAMS.
const MAX_CONCURRENT_STREAMS: u16 = 3;

fn start(env: &[(&'static str, &str)], nofile: Option<u32>) -> Server {
    let mut options = Options {
        nofile,
        ..Options::rules(RULES)
    };
    options
        .env
        .extend(env.iter().map(|(k, v)| (*k, (*v).to_owned())));
    Server::start_with(options)
}

/// A connection that has sent the preface and an empty SETTINGS frame.
fn client(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(PREFACE).unwrap();
    stream.write_all(&EMPTY_SETTINGS).unwrap();
    stream
}

/// The server's first frame if it sends one within `wait`: it must be SETTINGS, whose
/// parameters are returned.
fn server_settings(stream: &mut TcpStream, wait: Duration) -> Option<Vec<(u16, u32)>> {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut header = [0; 9];
    match stream.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return None,
        Err(e) => panic!("the connection failed: {e}"),
    }
    assert_eq!(
        header[3], 4,
        "the server's first frame is SETTINGS: {header:?}"
    );
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut payload = vec![0; len];
    stream.read_exact(&mut payload).unwrap();
    let settings = payload
        .chunks_exact(6)
        .map(|p| {
            let value = u32::from_be_bytes([p[2], p[3], p[4], p[5]]);
            (u16::from_be_bytes([p[0], p[1]]), value)
        })
        .collect();
    Some(settings)
}

#[test]
fn connections_past_the_cap_wait_until_one_closes_and_settings_carry_the_stream_limit() {
    let server = start(
        &[
            ("GRPC_WORKERS", "1"),
            ("GRPC_MAX_CONNECTIONS", "2"),
            ("GRPC_MAX_CONCURRENT_STREAMS", "7"),
        ],
        None,
    );
    let wait = Duration::from_secs(5);
    let mut first = client(server.grpc);
    let settings = server_settings(&mut first, wait).expect("the first client is served");
    assert!(
        settings.contains(&(MAX_CONCURRENT_STREAMS, 7)),
        "{settings:?}"
    );
    let mut second = client(server.grpc);
    assert!(server_settings(&mut second, wait).is_some());
    let mut third = client(server.grpc);
    assert_eq!(
        server_settings(&mut third, Duration::from_secs(1)),
        None,
        "a third connection is served past a cap of two"
    );
    drop(first);
    assert!(
        server_settings(&mut third, Duration::from_secs(10)).is_some(),
        "the waiting client is served once a slot frees; log:\n{}",
        server.log()
    );
}

#[test]
fn a_connection_without_a_preface_is_closed_after_the_timeout() {
    let server = start(&[("GRPC_PREFACE_TIMEOUT", "1s")], None);
    let silent = TcpStream::connect(("127.0.0.1", server.grpc)).unwrap();
    let mut half = TcpStream::connect(("127.0.0.1", server.grpc)).unwrap();
    // The preface alone, without the SETTINGS frame that must follow it.
    half.write_all(PREFACE).unwrap();
    for mut stream in [silent, half] {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = Instant::now();
        let mut rest = Vec::new();
        let closed = stream.read_to_end(&mut rest);
        assert!(
            matches!(closed, Ok(0)),
            "closed by the server, having sent nothing: {closed:?} {rest:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(8));
    }
    // A client that speaks in time is served as before.
    let mut speaking = client(server.grpc);
    assert!(server_settings(&mut speaking, Duration::from_secs(5)).is_some());
}

#[test]
fn aged_connections_close_after_their_grace_and_an_age_of_zero_is_no_limit() {
    // Whether the server closes a connection within `wait`, reading whatever it sends.
    let closes_within = |port: u16, wait: Duration| {
        let mut stream = client(port);
        let deadline = Instant::now() + wait;
        stream.set_read_timeout(Some(wait)).unwrap();
        let mut buffer = [0u8; 4096];
        while Instant::now() < deadline {
            match stream.read(&mut buffer) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return true,
            }
        }
        false
    };
    let aged = start(
        &[
            ("GRPC_MAX_CONNECTION_AGE", "200ms"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "200ms"),
        ],
        None,
    );
    assert!(
        closes_within(aged.grpc, Duration::from_secs(5)),
        "{}",
        aged.log()
    );
    // grpc-go, upstream's server, reads 0 as no limit.
    let unlimited = start(
        &[
            ("GRPC_MAX_CONNECTION_AGE", "0"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "0"),
        ],
        None,
    );
    assert!(
        !closes_within(unlimited.grpc, Duration::from_secs(1)),
        "{}",
        unlimited.log()
    );
}

#[tokio::test]
async fn silent_grpc_connections_cannot_take_the_descriptors_health_needs() {
    let server = start(
        &[
            ("GRPC_MAX_CONNECTIONS", "32"),
            ("GRPC_PREFACE_TIMEOUT", "30s"),
        ],
        Some(128),
    );
    assert!(
        server.log().contains("open-file limit"),
        "a limit of 128 descriptors for caps of thousands is warned about:\n{}",
        server.log()
    );
    // More silent connections than the process has descriptors.
    let held: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(("127.0.0.1", server.grpc)).unwrap())
        .collect();
    let answered = eventually(Duration::from_secs(20), || async {
        let health = reqwest::get(server.http_url("/healthcheck")).await;
        matches!(health, Ok(h) if h.status() == 200)
    })
    .await;
    assert!(answered, "health answers; log:\n{}", server.log());
    drop(held);
    let mut client = server.client().await;
    let answer = client
        .should_rate_limit(request("c", &[&[("user", "a")]]))
        .await
        .expect("a decision once the silent clients left");
    assert_eq!(answer.into_inner().overall_code, 1);
}
