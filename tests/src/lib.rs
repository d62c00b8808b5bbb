//! What every test suite of the workspace shares: launchers for the real processes (the
//! sidecar in [`sidecar`], Redis in [`redis`], the intake and a tansu broker in [`intake`]), each
//! on free loopback ports with a directory of its own, what the tests do with a running
//! sidecar in one call ([`calls`]), and small helpers.
//!
//! The workspace's binaries are found next to the test executable (`cargo test
//! --workspace` builds them), or in `$RATELIMIT_TEST_BIN_DIR` to run the same tests
//! against another build: a regression test must fail on the build before its fix.

pub mod calls;
pub mod envoy;
pub mod envoy_gateway;
pub mod faults;
pub mod image;
pub mod intake;
pub mod kafka;
pub mod kubernetes;
pub mod memcached;
pub mod pki;
pub mod prometheus;
pub mod redis;
pub mod redis_failover;
pub mod sidecar;
pub mod upstream;

/// The names and integer parameters of a Structured Field List (RFC 8941) of strings,
/// as the draft-11 rate-limit headers are: `"burst";q=2;w=1, ...`.
pub fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(value).parse().unwrap();
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("an item, not an inner list: {value}")
            };
            let params = item
                .params
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), i64::from(v.as_integer().unwrap())))
                .collect();
            (
                item.bare_item.as_string().unwrap().as_str().to_owned(),
                params,
            )
        })
        .collect()
}

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The path of one of the workspace's binaries.
pub fn binary(name: &str) -> PathBuf {
    let path = match std::env::var_os("RATELIMIT_TEST_BIN_DIR") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => {
            // target/<profile>/deps/<test> -> target/<profile>/<name>
            let exe = std::env::current_exe().expect("the test executable's path");
            exe.parent()
                .and_then(Path::parent)
                .expect("a test executable in target/<profile>/deps")
                .join(name)
        }
    };
    assert!(
        path.exists(),
        "{} is missing: build the workspace's binaries first (cargo test --workspace builds them)",
        path.display()
    );
    path
}

/// A free TCP port on 127.0.0.1 (free when asked; the process binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits up to 30 s for something to listen on `port`; else panics with `log`.
pub fn wait_for_port(port: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "{what} did not start; log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Whether a socket listens on `port` (on any address), read from `/proc/net/tcp` and
/// `/proc/net/tcp6`. Unlike a connection, the check leaves nothing for the listener to
/// accept: a server capped at a few connections would count one made to see whether it
/// listens as one of them until it had accepted it and seen it close.
pub fn listening(port: u16) -> bool {
    let local = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).is_ok_and(|text| {
            // `sl local_address rem_address st …`, addresses in hex; state 0A is LISTEN.
            text.lines().skip(1).any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.len() > 3 && fields[1].ends_with(&local) && fields[3] == "0A"
            })
        })
    })
}

/// The most of `times` (sorted, in ms) within any interval of `length` ms: what a fleet
/// admitted in its busiest stretch, the slack a shared limit's written bound allows.
pub fn most_within(times: &[u64], length: u64) -> usize {
    let mut start = 0;
    (0..times.len())
        .map(|end| {
            while times[end] - times[start] > length {
                start += 1;
            }
            end - start + 1
        })
        .max()
        .unwrap_or(0)
}

/// Waits, when needed, so that the next `seconds` fall within one minute of the wall
/// clock: a test of a per-minute limit must not see its window end half-way.
pub async fn within_one_minute(seconds: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let into = now.as_millis() % 60_000;
    let needed = u128::from(seconds.min(50)) * 1_000;
    if into + needed > 60_000 {
        let wait = 60_000 - into + 200;
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

/// Polls `check` every 50 ms until it holds (true) or `timeout` passes (false).
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
