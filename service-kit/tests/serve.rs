//! The HTTP serve loop against a real client over loopback: a body trickled a byte at a
//! time cannot hold a connection past HTTP_REQUEST_TIMEOUT, while a steady request on
//! another connection is answered.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ratelimit_service_kit::serve::{ConnectionLimits, ConnectionSlots, serve, warp_filter};
use warp::Filter;

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_off_at_the_request_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let echo = warp::post()
        .and(warp::body::bytes())
        .map(|body: bytes::Bytes| format!("{} bytes", body.len()))
        .recover(|_| async { Ok::<_, std::convert::Infallible>("refused".to_owned()) })
        .unify();
    let service = warp_filter(echo);
    let stop = std::future::pending::<()>();
    tokio::spawn(serve(
        listener,
        None,
        service,
        limits(),
        ConnectionSlots::new(8),
        stop,
    ));

    let trickle = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            .unwrap();
        let started = Instant::now();
        // One byte every 300 ms: never idle for the 5 s idle timeout.
        while started.elapsed() < Duration::from_secs(10) {
            if stream.write_all(b"x").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
            stream
                .set_read_timeout(Some(Duration::from_millis(1)))
                .unwrap();
            let mut byte = [0u8; 1];
            if matches!(stream.read(&mut byte), Ok(0)) {
                break;
            }
        }
        started.elapsed()
    });
    // A steady client is served meanwhile.
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .write_all(
                b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
            )
            .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    })
    .await
    .unwrap();
    assert!(answer.ends_with("3 bytes"), "{answer}");
    let held = trickle.await.unwrap();
    assert!(
        held >= Duration::from_millis(1_900) && held < Duration::from_secs(5),
        "the trickled request was cut off after {held:?}, not at the 2 s request timeout"
    );
}
