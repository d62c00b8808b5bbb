//! The layer in front of a real axum server on a loopback TCP port, asked over HTTP/1.1.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::request::Parts;
use ratelimit_core::config::{Domain, RateLimit, Rule};
use ratelimit_core::{Descriptor, HeaderFormat, Limiter, Settings, Unit};
use ratelimit_tower::{LayerError, RateLimitLayer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// 20 seconds into a minute, in unix milliseconds.
const NOW_MS: u64 = 1_700_000_000_000;

/// An answer read off the socket: status, headers (names lower-cased) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` with `headers`, on a connection of its own.
async fn get_with(address: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete answer");
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Serves `router` (which counts the calls that reach it in `reached`) on a free port.
async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    address
}

fn hello(reached: &Arc<AtomicUsize>) -> Router {
    let reached = Arc::clone(reached);
    Router::new().route(
        "/",
        get(move || {
            reached.fetch_add(1, Ordering::Relaxed);
            async { "hello" }
        }),
    )
}

fn per_api_key(parts: &Parts) -> Vec<Descriptor> {
    match parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(key) => vec![Descriptor::new([("api_key", key)])],
        None => Vec::new(),
    }
}

fn limiter(settings: Settings) -> Arc<Limiter> {
    let rules = Domain::new("api")
        .rule(Rule::key("api_key").limit(RateLimit::per(Unit::Minute, 2)))
        .rule(Rule::key("peer").child(Rule::key("method").limit(RateLimit::per(Unit::Minute, 1))));
    Arc::new(Limiter::new(&rules.build().unwrap(), settings))
}

#[tokio::test(flavor = "current_thread")]
async fn each_api_key_gets_its_limit_then_429_with_headers_and_retry_after() {
    let clock = Arc::new(AtomicU64::new(NOW_MS));
    let layer = RateLimitLayer::new(limiter(Settings::default()), "api", per_api_key).with_clock({
        let clock = Arc::clone(&clock);
        move || clock.load(Ordering::Relaxed)
    });
    let reached = Arc::new(AtomicUsize::new(0));
    let address = serve(hello(&reached).layer(layer)).await;
    let alice = [("x-api-key", "alice")];

    let first = get_with(address, "/", &alice).await;
    assert_eq!((first.status, first.body.as_str()), (200, "hello"));
    assert_eq!(first.header("RateLimit-Limit"), Some("2"));
    assert_eq!(first.header("RateLimit-Remaining"), Some("1"));
    assert_eq!(first.header("RateLimit-Reset"), Some("40"));
    assert_eq!(first.header("Retry-After"), None);
    assert_eq!(
        get_with(address, "/", &alice)
            .await
            .header("RateLimit-Remaining"),
        Some("0")
    );

    let over = get_with(address, "/", &alice).await;
    assert_eq!((over.status, over.body.as_str()), (429, ""));
    assert_eq!(over.header("RateLimit-Limit"), Some("2"));
    assert_eq!(over.header("RateLimit-Remaining"), Some("0"));
    assert_eq!(over.header("Retry-After"), Some("40"));
    assert_eq!(
        reached.load(Ordering::Relaxed),
        2,
        "a refused request never reaches the service"
    );

    // Another key has its own counter; a request without one is not limited.
    let bob = get_with(address, "/", &[("x-api-key", "bob")]).await;
    assert_eq!(
        (bob.status, bob.header("RateLimit-Remaining")),
        (200, Some("1"))
    );
    let anonymous = get_with(address, "/", &[]).await;
    assert_eq!(
        (anonymous.status, anonymous.header("RateLimit-Limit")),
        (200, None)
    );

    // The injected clock moves into the next minute: alice is allowed again.
    clock.store(NOW_MS + 60_000, Ordering::Relaxed);
    let later = get_with(address, "/", &alice).await;
    assert_eq!(
        (later.status, later.header("RateLimit-Remaining")),
        (200, Some("1"))
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_ietf_draft_headers_and_descriptors_from_the_peer_and_method() {
    let settings = Settings {
        report_policies: true,
        ..Settings::default()
    };
    let by_peer = |parts: &Parts| {
        let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().unwrap().0;
        let method = parts.method.as_str();
        vec![Descriptor::new([
            ("peer", peer.ip().to_string()),
            ("method", method.into()),
        ])]
    };
    let layer = RateLimitLayer::new(limiter(settings), "api", by_peer)
        .with_clock(|| NOW_MS)
        .with_header_format(HeaderFormat::IetfDraft11)
        .unwrap();
    let reached = Arc::new(AtomicUsize::new(0));
    let address = serve(hello(&reached).layer(layer)).await;

    let first = get_with(address, "/", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("RateLimit-Policy"),
        Some(r#""api.peer.method";q=1;w=60"#)
    );
    assert_eq!(
        first.header("RateLimit"),
        Some(r#""api.peer.method";r=0;t=40"#)
    );
    let over = get_with(address, "/", &[]).await;
    assert_eq!(over.status, 429);
    assert_eq!(
        over.header("RateLimit"),
        Some(r#""api.peer.method";r=0;t=40"#)
    );
    assert_eq!(over.header("Retry-After"), Some("40"));
    assert_eq!(reached.load(Ordering::Relaxed), 1);
}

#[test]
fn the_ietf_draft_format_needs_reported_policies() {
    let layer = RateLimitLayer::new(limiter(Settings::default()), "api", per_api_key);
    let error = layer
        .with_header_format(HeaderFormat::IetfDraft11)
        .unwrap_err();
    assert_eq!(error, LayerError::PoliciesNotReported);
}
