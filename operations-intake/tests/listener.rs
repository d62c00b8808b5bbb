//! The HTTP listener's bounds: idle and half-sent connections are closed and capped, so
//! they cannot starve the service.

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
