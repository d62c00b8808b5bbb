//! The HTTP listener's bounds: idle and half-sent connections are closed and capped, so
//! they cannot starve the service, and the health routes are answered past the cap.

use ratelimit_tests::intake as support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use ratelimit_tests::calls::trickling_clients;

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

    // Once the idle clients leave, a batch is served again (while they hold every slot,
    // it may land in the health reserve and be told so with a 503).
    drop(held);
    wait_until("a batch is accepted once the idle clients left", || async {
        post(&service, &batch("buy", 1), &[("x-client-id", "a")])
            .await
            .status
            == 202
    })
    .await;
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
    let (clients, refused) = trickling_clients(
        service.port,
        40,
        b"POST /operations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n[",
        "all 8 HTTP connections are in use; past them only health checks (/health, /health/live, /health/ready) are answered",
    );
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
    let send_batch = || {
        probe
            .post(service.url("/operations"))
            .header("content-type", "application/json")
            .header("x-client-id", "a")
            .body(batch("buy", 1))
            .send()
    };
    assert_eq!(send_batch().await.unwrap().status(), 503);
    // Once the holders go, the slots serve batches again. Until the server has seen them
    // close, a batch is still refused by the cap (in plain text, as above): only the
    // status is read.
    drop(clients);
    wait_until("a batch is accepted once the holders are gone", || async {
        send_batch()
            .await
            .is_ok_and(|answer| answer.status() == 202)
    })
    .await;
}

/// The walkthrough's service (the mock broker) stops quietly: no librdkafka error about
/// a broker that went away before the producer did.
#[tokio::test(flavor = "multi_thread")]
async fn a_service_on_the_mock_broker_stops_without_an_error() {
    let mut service = Intake::start(&[("KAFKA_MOCK_BROKER", "true")]);
    let answer = post(&service, &batch("buy", 2), &[("x-client-id", "a")]).await;
    assert_eq!(answer.status, 202, "{}", answer.body);
    service.terminate();
    let status = service
        .wait_exit(Duration::from_secs(30))
        .expect("exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    let log = service.log();
    assert!(log.contains("bye"), "{log}");
    assert!(!log.contains("level=error"), "{log}");
}
