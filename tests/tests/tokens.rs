//! Token budgets through a real Envoy (`envoy/tokens.yaml`), on every backend: each
//! request is checked at a cost of 0, and when its stream ends Envoy charges what the
//! upstream reported in its `x-usage` header. The upstream here streams its body in
//! chunks and reports the cost the test asks of it (`x-cost`).

use std::time::Duration;

use ratelimit_tests::envoy::{repo, start_envoy_on};
use ratelimit_tests::sidecar::{Options, Server, Store, eventually};
use ratelimit_tests::{on_every_backend, within_one_minute};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const TOTAL_HITS: &str = "ratelimit.service.rate_limit.llm.user.total_hits";

/// An HTTP/1.1 upstream answering every request with `x-usage: <its x-cost header>` and a
/// chunked body: 3 chunks, or 40 chunks 50 ms apart for a path ending in `/slow`.
async fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
    port
}

/// Serves one connection's requests (bodiless, as Envoy forwards these GETs).
async fn serve(stream: TcpStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    loop {
        let (mut path, mut cost) = (String::new(), "0".to_owned());
        while let Ok(Some(line)) = lines.next_line().await {
            if line.is_empty() {
                break;
            }
            if let Some(target) = line.strip_prefix("GET ") {
                path = target.split(' ').next().unwrap_or_default().to_owned();
            } else if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("x-cost")
            {
                value.trim().clone_into(&mut cost);
            }
        }
        if path.is_empty() {
            return;
        }
        let head =
            format!("HTTP/1.1 200 OK\r\nx-usage: {cost}\r\ntransfer-encoding: chunked\r\n\r\n");
        if write.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let (chunks, pause) = if path.ends_with("/slow") {
            (40, 50)
        } else {
            (3, 5)
        };
        for _ in 0..chunks {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if write.write_all(b"6\r\ntoken \r\n").await.is_err() {
                return;
            }
        }
        if write.write_all(b"0\r\n\r\n").await.is_err() {
            return;
        }
    }
}

/// A sidecar on `envoy/tokens-rules.yaml` (10 tokens a minute per user) on `store`.
fn sidecar(store: &Store) -> Server {
    sidecar_with(store, &[])
}

/// [`sidecar`] with more settings.
fn sidecar_with(store: &Store, env: &[(&'static str, &str)]) -> Server {
    let rules = std::fs::read_to_string(repo().join("envoy/tokens-rules.yaml")).unwrap();
    let mut options = Options {
        files: vec![("tokens.yaml", rules)],
        ..Options::default()
    };
    options.env.extend(store.env());
    options
        .env
        .extend(env.iter().map(|(k, v)| (*k, (*v).to_owned())));
    options
        .env
        .push(("LIMIT_RESPONSE_HEADERS_ENABLED", "true".into()));
    Server::start_with(options)
}

/// `GET path` through Envoy as `user`, asking the upstream to report `cost`; the whole
/// answer is read.
async fn ask(
    port: u16,
    path: &str,
    user: &str,
    cost: u64,
) -> (u16, reqwest::header::HeaderMap, String) {
    let response = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .header("x-user", user)
        .header("x-cost", cost.to_string())
        .send()
        .await
        .unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    (status, headers, response.text().await.unwrap())
}

/// Waits until the sidecar has counted `hits` in all (the stream-end charge is sent
/// after the client has its answer).
async fn counted(sidecar: &Server, hits: u64) {
    let total = || async { sidecar.stat(TOTAL_HITS).await.unwrap_or(0) };
    let reached = eventually(Duration::from_secs(10), || async { total().await == hits }).await;
    assert!(reached, "{} hits counted, not {hits}", total().await);
}

on_every_backend!(a_budget_is_spent_by_the_reported_usage_and_refused_only_once_spent);

async fn a_budget_is_spent_by_the_reported_usage_and_refused_only_once_spent(store: &Store) {
    // The budget is per minute: the whole run in one.
    within_one_minute(15).await;
    let sidecar = sidecar(store);
    let envoy = start_envoy_on("tokens.yaml", upstream().await, sidecar.grpc, false);
    // 5 tokens a response against 10 a minute: after two, the budget is spent exactly.
    for spent in [5, 10] {
        let (status, _, body) = ask(envoy.port, "/v1/chat", "alice", 5).await;
        assert_eq!((status, body.as_str()), (200, "token token token "));
        counted(&sidecar, spent).await;
    }
    // A check at exactly the limit passes (0 more is not over 10, as upstream decides),
    // and its charge is counted although it takes the budget past the limit.
    let (status, headers, _) = ask(envoy.port, "/v1/chat", "alice", 5).await;
    assert_eq!(status, 200);
    assert_eq!(headers["ratelimit-remaining"], "0");
    counted(&sidecar, 15).await;
    // Now it is refused, with the limit's headers, and the refusal charges nothing.
    let (status, headers, _) = ask(envoy.port, "/v1/chat", "alice", 5).await;
    assert_eq!(status, 429);
    assert_eq!(headers["x-envoy-ratelimited"], "true");
    assert_eq!(headers["ratelimit-limit"], "10");
    assert_eq!(headers["ratelimit-remaining"], "0");
    assert!(headers.contains_key("ratelimit-reset"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        sidecar.stat(TOTAL_HITS).await,
        Some(15),
        "a refusal charges nothing"
    );
    // Another user's budget is untouched.
    assert_eq!(ask(envoy.port, "/v1/chat", "bob", 1).await.0, 200);
}

on_every_backend!(a_stream_the_client_resets_is_still_charged);

async fn a_stream_the_client_resets_is_still_charged(store: &Store) {
    let sidecar = sidecar(store);
    let envoy = start_envoy_on("tokens.yaml", upstream().await, sidecar.grpc, false);
    // The client reads the response's head and a little of its 2-second body, then
    // closes the connection.
    let mut client = TcpStream::connect(("127.0.0.1", envoy.port)).await.unwrap();
    let request = "GET /v1/slow HTTP/1.1\r\nhost: llm\r\nx-user: carol\r\nx-cost: 7\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    let mut start = [0; 64];
    let n = client.read(&mut start).await.unwrap();
    assert!(
        start[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&start[..n])
    );
    drop(client);
    counted(&sidecar, 7).await;
}

/// What is left of `user`'s budget, asked through `/json` at a cost of 0.
async fn left(sidecar: &Server, user: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"llm","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}],"hitsAddend":0}}]}}"#
    );
    let (_, text) = ratelimit_tests::sidecar::post(&sidecar.http_url("/json"), &body).await;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    answer["statuses"][0]["limitRemaining"]
        .as_u64()
        .unwrap_or(0)
}

on_every_backend!(stop_cache_key_increment_still_counts_a_charge_that_crosses_the_limit);

/// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, as upstream, a key that would go past
/// its limit is still added to when it is the one going over (only the request's other
/// keys are held back): a budget's stream-end charge is counted in full.
async fn stop_cache_key_increment_still_counts_a_charge_that_crosses_the_limit(store: &Store) {
    within_one_minute(15).await;
    let sidecar = sidecar_with(
        store,
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    );
    let envoy = start_envoy_on("tokens.yaml", upstream().await, sidecar.grpc, false);
    assert_eq!(ask(envoy.port, "/v1/chat", "dave", 5).await.0, 200);
    counted(&sidecar, 5).await;
    assert_eq!(left(&sidecar, "dave").await, 5);
    // 7 more make 12 of 10: counted, nothing left, and the next request is refused.
    assert_eq!(ask(envoy.port, "/v1/chat", "dave", 7).await.0, 200);
    counted(&sidecar, 12).await;
    assert_eq!(left(&sidecar, "dave").await, 0);
    assert_eq!(ask(envoy.port, "/v1/chat", "dave", 1).await.0, 429);
}
