//! What the tests do with a running sidecar, each in one call: start it on a rules file,
//! ask it for a decision over gRPC, read or post to its HTTP and debug listeners, watch
//! it refuse to start; and run a command line that must succeed.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::sidecar::{Options, Server, request};

/// The answer to one request of `descriptors` (`(key, value)` lists) in `domain`.
pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> RateLimitResponse {
    client
        .should_rate_limit(request(domain, descriptors))
        .await
        .unwrap()
        .into_inner()
}

/// The body of a GET of `url`, whatever its status.
pub async fn get_text(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// The status and body of a POST of `body` to `url`.
pub async fn post(url: &str, body: &str) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(url)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Runs `command`, which must succeed; its standard output.
pub fn run_ok(command: &mut Command) -> String {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{command:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

impl Options {
    /// Options that set the environment variables `env`, and nothing else.
    pub fn with_env(env: &[(&'static str, &str)]) -> Options {
        Options {
            env: env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            ..Options::default()
        }
    }

    /// These options with the environment variable `key` set to `value` as well.
    pub fn set(mut self, key: &'static str, value: &str) -> Options {
        self.env.push((key, value.to_owned()));
        self
    }

    /// Options that start a server on one rules file, `rules.yaml`, holding `yaml`.
    pub fn rules(yaml: &str) -> Options {
        Options {
            files: vec![("rules.yaml", yaml.to_owned())],
            ..Options::default()
        }
    }
}

impl Server {
    /// Starts a server on `options`, which must make it stop with a failure within 20 s;
    /// its log.
    pub fn refused(options: Options) -> String {
        let mut server = Server::spawn(options);
        let Some(status) = server.wait_exit(Duration::from_secs(20)) else {
            panic!("still running after 20 s:\n{}", server.log());
        };
        let log = server.log();
        assert!(!status.success(), "exited with success:\n{log}");
        log
    }

    /// Every statistic of `/stats` with an integer value, by name.
    pub async fn stats(&self) -> HashMap<String, u64> {
        let body = get_text(&self.debug_url("/stats")).await;
        body.lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(": ")?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// The answer to one request of `descriptors` in `domain`, on a new connection.
    pub async fn ask(&self, domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
        ask(&mut self.client().await, domain, descriptors).await
    }
}

/// `count` clients that each send `head` (a request's headers and the first byte of a body
/// announced far longer) on `port` and then nothing, holding an HTTP connection, and how
/// many of them were answered at once with a 503 whose text contains `refusal` (past the
/// connection cap); any other early answer fails the test.
pub fn trickling_clients(
    port: u16,
    count: usize,
    head: &[u8],
    refusal: &str,
) -> (Vec<TcpStream>, usize) {
    let mut clients: Vec<TcpStream> = (0..count)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            stream.write_all(head).unwrap();
            stream
        })
        .collect();
    let mut refused = 0;
    for client in &mut clients {
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut answer = [0; 512];
        if let Ok(n @ 1..) = client.read(&mut answer) {
            let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(answer.contains(refusal), "{answer}");
            refused += 1;
        }
    }
    (clients, refused)
}

/// Clients that each connect to an HTTP port, send nothing, and connect again as soon as
/// the server closes the connection, until stopped (or dropped).
pub struct SilentClients {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<usize>>,
}

impl SilentClients {
    /// `count` silent clients of `port` on loopback, each on a thread of its own.
    pub fn start(port: u16, count: usize) -> SilentClients {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..count)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || silent_client(port, &stop))
            })
            .collect();
        SilentClients { stop, threads }
    }

    /// Stops them: how many of their connections the server closed.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        std::mem::take(&mut self.threads)
            .into_iter()
            .map(|thread| thread.join().unwrap_or(0))
            .sum()
    }
}

impl Drop for SilentClients {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One of [`SilentClients`]: how many of its connections the server closed.
fn silent_client(port: u16, stop: &AtomicBool) -> usize {
    let mut closed = 0;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        // Woken every 50 ms to see whether to stop; anything but a timeout (the end of
        // the stream, a reset, or an answer it did not ask for) is the server closing.
        let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
        let mut byte = [0; 1];
        loop {
            match stream.read(&mut byte) {
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if stop.load(Ordering::Relaxed) {
                        return closed;
                    }
                }
                _ => {
                    closed += 1;
                    break;
                }
            }
        }
    }
    closed
}

/// Connects to `port` on loopback, sends `request` and reads the head of its answer, all
/// within `within` (as a client with that timeout): the connection, left open, and the
/// head, empty or cut short when the time ran out or the server closed first. An error
/// when the connection could not be made in time.
pub fn exchange(
    port: u16,
    request: &[u8],
    within: Duration,
) -> std::io::Result<(TcpStream, String)> {
    let deadline = Instant::now() + within;
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, within)?;
    stream.write_all(request)?;
    let head = response_head(&mut stream, deadline);
    Ok((stream, head))
}

/// An HTTP/1.1 answer's status line and headers as they came before `deadline`, however
/// the server's writes split them (a loaded machine may deliver them in pieces, or late).
pub fn response_head(stream: &mut TcpStream, deadline: Instant) -> String {
    let mut head = Vec::new();
    let mut byte = [0; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}
