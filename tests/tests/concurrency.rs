//! A concurrency limit through a real Envoy (`envoy/concurrency.yaml`), on every
//! backend: each request takes a place named by its x-request-id, and Envoy gives it back
//! when the stream ends (`is_negative_hits`), however it ends. The upstream here streams
//! slowly and counts the streams it serves at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ratelimit_tests::envoy::{repo, start_envoy_on};
use ratelimit_tests::on_every_backend;
use ratelimit_tests::sidecar::{Options, Server, Store, eventually, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An HTTP/1.1 upstream whose answers stream for as long as the path says: `/v1/slow`
/// 1.5 s, `/v1/hang` 20 s, `/v1/broken` 0.5 s and then the connection is cut mid-body.
struct Upstream {
    port: u16,
    /// Streams being served now, and the most at once.
    serving: Arc<(AtomicUsize, AtomicUsize)>,
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serving = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let counts = serving.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(stream_one(stream, counts.clone()));
            }
        });
        Upstream { port, serving }
    }

    fn most_at_once(&self) -> usize {
        self.serving.1.load(Ordering::SeqCst)
    }
}

/// Answers one request on `stream` (Envoy opens a connection per stream it cannot reuse)
/// and closes it.
async fn stream_one(mut stream: TcpStream, serving: Arc<(AtomicUsize, AtomicUsize)>) {
    let mut head = Vec::new();
    let mut byte = [0; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            return;
        }
        head.push(byte[0]);
    }
    let path = String::from_utf8_lossy(&head);
    let (chunks, cut) = match path.split(' ').nth(1).unwrap_or_default() {
        "/v1/hang" => (400, false),
        "/v1/broken" => (10, true),
        _ => (30, false),
    };
    let now = serving.0.fetch_add(1, Ordering::SeqCst) + 1;
    serving.1.fetch_max(now, Ordering::SeqCst);
    let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    let mut sent = stream.write_all(answer).await.is_ok();
    for _ in 0..chunks {
        tokio::time::sleep(Duration::from_millis(50)).await;
        sent = sent && stream.write_all(b"5\r\ntoken\r\n").await.is_ok();
    }
    if sent && !cut {
        let _ = stream.write_all(b"0\r\n\r\n").await;
    }
    serving.0.fetch_sub(1, Ordering::SeqCst);
}

/// A sidecar on `envoy/concurrency-rules.yaml` (2 in flight, a 4-second lease) on `store`.
fn sidecar(store: &Store) -> Server {
    let rules = std::fs::read_to_string(repo().join("envoy/concurrency-rules.yaml")).unwrap();
    let mut options = Options {
        files: vec![("concurrency.yaml", rules)],
        ..Options::default()
    };
    options.env.extend(store.env());
    Server::start_with(options)
}

/// The places free, asked of the sidecar through `/json` with a check of 0 hits.
async fn free(sidecar: &Server) -> u64 {
    let body = r#"{"domain":"llm","descriptors":[{"entries":[{"key":"model","value":"chat"},{"key":"request_id","value":"probe"}],"hitsAddend":0}]}"#;
    let (_, text) = post(&sidecar.http_url("/json"), body).await;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    answer["statuses"][0]["limitRemaining"]
        .as_u64()
        .unwrap_or(0)
}

/// Waits, for less than the lease, until `places` are free: a place freed this soon was
/// given back, not lapsed.
async fn freed(sidecar: &Server, places: u64) {
    let back = eventually(Duration::from_secs(2), || async {
        free(sidecar).await == places
    })
    .await;
    assert!(back, "{} places free, not {places}", free(sidecar).await);
}

/// The status of `GET path` through Envoy, its body read to the end; 0 when the stream
/// broke off.
async fn get(port: u16, path: &str) -> u16 {
    let Ok(response) = reqwest::get(format!("http://127.0.0.1:{port}{path}")).await else {
        return 0;
    };
    let status = response.status().as_u16();
    match response.bytes().await {
        Ok(_) => status,
        Err(_) => 0,
    }
}

/// A client that sends `GET path`, reads the answer's head, and is returned still
/// connected (dropping it resets the stream).
async fn started(port: u16, path: &str) -> TcpStream {
    let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: llm\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0; 12];
    client.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    client
}

on_every_backend!(never_more_than_two_in_flight_and_every_ending_gives_its_place_back);

async fn never_more_than_two_in_flight_and_every_ending_gives_its_place_back(store: &Store) {
    let sidecar = sidecar(store);
    let upstream = Upstream::start().await;
    let envoy = start_envoy_on("concurrency.yaml", upstream.port, sidecar.grpc, false);
    // Five slow streams at once: two run, three are refused at once.
    let port = envoy.port;
    let calls: Vec<_> = (0..5)
        .map(|_| tokio::spawn(async move { get(port, "/v1/slow").await }))
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert_eq!(upstream.most_at_once(), 2);
    // Finished streams gave their places back.
    freed(&sidecar, 2).await;
    // A stream the client resets.
    let client = started(port, "/v1/slow").await;
    assert_eq!(free(&sidecar).await, 1);
    drop(client);
    freed(&sidecar, 2).await;
    // A stream the upstream cuts off mid-body.
    let broken = tokio::spawn(async move { get(port, "/v1/broken").await });
    assert!(
        eventually(Duration::from_secs(2), || async {
            free(&sidecar).await == 1
        })
        .await
    );
    assert_eq!(broken.await.unwrap(), 0, "the body broke off");
    freed(&sidecar, 2).await;
}

on_every_backend!(places_held_by_a_killed_envoy_come_back_after_the_lease);

async fn places_held_by_a_killed_envoy_come_back_after_the_lease(store: &Store) {
    let sidecar = sidecar(store);
    let upstream = Upstream::start().await;
    let envoy = start_envoy_on("concurrency.yaml", upstream.port, sidecar.grpc, false);
    let holding = [
        started(envoy.port, "/v1/hang").await,
        started(envoy.port, "/v1/hang").await,
    ];
    let taken = Instant::now();
    assert_eq!(free(&sidecar).await, 0);
    // SIGKILL: no stream-end call will ever give those places back.
    drop(envoy);
    drop(holding);
    let other = start_envoy_on("concurrency.yaml", upstream.port, sidecar.grpc, false);
    assert_eq!(get(other.port, "/v1/slow").await, 429);
    let back = eventually(Duration::from_secs(8), || async {
        free(&sidecar).await == 2
    })
    .await;
    assert!(back, "the places never lapsed");
    assert!(
        taken.elapsed() >= Duration::from_millis(3_500),
        "the places came back after {:?}, before their 4-second lease",
        taken.elapsed()
    );
    assert_eq!(get(other.port, "/v1/slow").await, 200);
}
