//! An axum service limited per API key: each `x-api-key` gets 5 requests a minute; a
//! request over that is answered 429 with the rate-limit headers and `Retry-After`, and
//! never reaches the handler. Requests without a key are not limited.
//!
//! `cargo run -p ratelimit-tower --example axum_api_key` serves on 127.0.0.1:3000
//! (`curl -i -H 'x-api-key: alice' localhost:3000/`); with `--self-test` it serves on a
//! free port, asks it seven times over TCP, prints the answers and exits.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::routing::get;
use http::request::Parts;
use ratelimit_core::config::{Domain, RateLimit, Rule};
use ratelimit_core::{Descriptor, Limiter, Settings, Unit};
use ratelimit_tower::RateLimitLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One descriptor per request that carries an API key.
fn per_api_key(request: &Parts) -> Vec<Descriptor> {
    match request
        .headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
    {
        Some(key) => vec![Descriptor::new([("api_key", key)])],
        None => Vec::new(),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let rules =
        Domain::new("api").rule(Rule::key("api_key").limit(RateLimit::per(Unit::Minute, 5)));
    let limiter = Arc::new(Limiter::new(&rules.build()?, Settings::default()));
    let self_test = std::env::args().any(|a| a == "--self-test");
    let mut layer = RateLimitLayer::new(limiter, "api", per_api_key);
    if self_test {
        // One instant for the whole test, so that no minute ends in the middle of it.
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
        layer = layer.with_clock(move || now);
    }
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);

    let listener = TcpListener::bind(if self_test {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    })
    .await?;
    let address = listener.local_addr()?;
    if !self_test {
        println!("listening on http://{address}");
        return Ok(axum::serve(listener, app).await?);
    }
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut refused = 0;
    for _ in 0..7 {
        let head = ask(address, "alice").await?;
        println!("{}", head.replace("\r\n", " | "));
        refused += usize::from(head.starts_with("HTTP/1.1 429"));
    }
    let bob = ask(address, "bob").await?;
    println!("{}", bob.replace("\r\n", " | "));
    assert_eq!(refused, 2, "alice: 5 allowed, then refused");
    assert!(
        bob.starts_with("HTTP/1.1 200"),
        "bob has a limit of his own"
    );
    Ok(())
}

/// The status line and headers of `GET /` with `x-api-key: key`.
async fn ask(address: SocketAddr, key: &str) -> Result<String, Box<dyn Error>> {
    let mut stream = TcpStream::connect(address).await?;
    let request =
        format!("GET / HTTP/1.1\r\nHost: example\r\nx-api-key: {key}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let head = answer.split("\r\n\r\n").next().unwrap_or_default();
    Ok(head.to_owned())
}
