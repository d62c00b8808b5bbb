//! The HTTP listener's bounds: idle and half-sent connections are closed and capped, so
//! they cannot starve the service, and the health routes are answered past the cap.

use ratelimit_tests::intake as support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{Intake, batch, health, post, wait_until};

#[tokio::test(flavor = "multi_thread")]
async fn idle_and_slow_connections_are_closed_and_capped() {
    let service = Intake::start(&[
        ("KAFKA_MOCK_BROKER", "true"),
        ("HTTP_MAX_CONNECTIONS", "8"),
        ("HTTP_HEADER_READ_TIMEOUT", "1s"),
        ("HTTP_IDLE_TIMEOUT", "2s"),
    ]);
    let mut held = Vec::new();
    for i in 0..60 {
        let mut stream = TcpStream::connect(("127.0.0.1", service.port)).unwrap();
        if i % 2 == 0 {
            let _ = stream.write_all(b"POST /operations HTTP/1.1\r\nHost: x\r\n");
        }
        held.push(stream);
    }
    wait_until("/health answers behind 60 idle connections", || async {
        health(&service).await.status == 200
    })
    .await;
    let mut first = held.swap_remove(0);
    first
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let closed = match first.read_to_end(&mut Vec::new()) {
        Ok(_) => true,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "the server closed the half-sent request");

    let answer = post(&service, &batch("buy", 1), &[("x-client-id", "a")]).await;
    assert_eq!(answer.status, 202, "{:?}", answer.body);
}

/// A client that holds a connection: `POST /operations` announcing a megabyte, then one
/// byte.
fn trickling(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"POST /operations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n[")
        .unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread")]
async fn health_is_answered_while_trickling_clients_hold_every_connection() {
    let held = "120s";
    let service = Intake::start(&[
        ("KAFKA_MOCK_BROKER", "true"),
        ("HTTP_MAX_CONNECTIONS", "8"),
        ("HTTP_HEADER_READ_TIMEOUT", held),
        ("HTTP_IDLE_TIMEOUT", held),
        ("HTTP_REQUEST_TIMEOUT", held),
    ]);
    wait_until("the broker is up", || async {
        health(&service).await.status == 200
    })
    .await;
    // Forty clients trickle bodies: eight hold every slot for two minutes, the others are
    // told at once that only health checks are answered past the cap.
    let mut clients: Vec<TcpStream> = (0..40).map(|_| trickling(service.port)).collect();
    let mut refused = 0;
    for client in &mut clients {
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut answer = [0; 512];
        if let Ok(n @ 1..) = client.read(&mut answer) {
            let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(
                answer.contains("all 8 HTTP connections are in use; past them only health checks (/health, /health/live, /health/ready) are answered"),
                "{answer}"
            );
            refused += 1;
        }
    }
    assert_eq!(refused, 40 - 8, "{}", service.log());
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for path in ["/health", "/health/live", "/health/ready"].repeat(5) {
        let answer = probe.get(service.url(path)).send().await;
        let answer = answer.expect("health answered past the cap");
        assert_eq!(answer.status(), 200, "{path}");
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(body["status"], "up", "{path}: {body}");
    }
    // Batches wait for a slot: past the cap they are refused loudly.
    let refused = probe
        .post(service.url("/operations"))
        .header("content-type", "application/json")
        .header("x-client-id", "a")
        .body(batch("buy", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    // Once the holders go, the slots serve batches again.
    drop(clients);
    wait_until("a batch is accepted once the holders are gone", || async {
        post(&service, &batch("buy", 1), &[("x-client-id", "a")])
            .await
            .status
            == 202
    })
    .await;
}
