//! The floor: an HTTP/2 server on hyper, on a single-threaded runtime, that reads each
//! request's body and answers one pre-encoded `RateLimitResponse` (OK) and
//! `grpc-status: 0`. It does no gRPC or protobuf work per request, so every microsecond a
//! gRPC server spends above it on the same transport is that server's own.
//! `rls-floor 127.0.0.1:PORT [THREADS]`: with THREADS > 1, that many threads each run
//! such a runtime on a listener of their own sharing the port (`SO_REUSEPORT`), as the
//! sidecar's workers do.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use socket2::{Domain, Protocol, Socket, Type};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let address: SocketAddr = args
        .first()
        .map_or("127.0.0.1:18082", String::as_str)
        .parse()?;
    let threads: usize = args.get(1).map_or(Ok(1), |t| t.parse())?;
    ratelimit_load_bench::exit_on_sigterm()?;
    let listeners = (0..threads.max(1))
        .map(|_| listener(address, threads > 1))
        .collect::<std::io::Result<Vec<_>>>()?;
    let workers: Vec<_> = listeners
        .into_iter()
        .map(|listener| std::thread::spawn(move || serve(listener)))
        .collect();
    for worker in workers {
        worker.join().expect("a worker panicked")?;
    }
    Ok(())
}

/// A listener on `address`; `shared` lets the other threads' listeners take the port too.
fn listener(address: SocketAddr, shared: bool) -> std::io::Result<std::net::TcpListener> {
    let domain = if address.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    for (set, on) in [
        (Socket::set_reuse_address as fn(&Socket, bool) -> _, true),
        (Socket::set_reuse_port, shared),
        (Socket::set_nonblocking, true),
    ] {
        set(&socket, on)?;
    }
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

#[tokio::main(flavor = "current_thread")]
async fn serve(listener: std::net::TcpListener) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let message = framed_ok();
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder.max_concurrent_streams(1024);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let message = message.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let message = message.clone();
            async move {
                // Read the whole body, as a server must before it can decide.
                let _ = request.into_body().collect().await;
                Ok::<_, Infallible>(answer(message))
            }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(connection);
    }
}

/// `RateLimitResponse { overall_code: OK }` as one gRPC message frame.
fn framed_ok() -> Bytes {
    let body = RateLimitResponse {
        overall_code: Code::Ok as i32,
        ..RateLimitResponse::default()
    }
    .encode_to_vec();
    let mut frame = vec![0];
    frame.extend_from_slice(&u32::try_from(body.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

fn answer(message: Bytes) -> Response<OneMessage> {
    let mut response = Response::new(OneMessage::Message(message));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// One data frame, then the `grpc-status: 0` trailers.
enum OneMessage {
    Message(Bytes),
    Trailers,
    Done,
}

impl http_body::Body for OneMessage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let frame = match std::mem::replace(this, OneMessage::Done) {
            OneMessage::Message(message) => {
                *this = OneMessage::Trailers;
                Frame::data(message)
            }
            OneMessage::Trailers => {
                let mut trailers = HeaderMap::with_capacity(1);
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                Frame::trailers(trailers)
            }
            OneMessage::Done => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, OneMessage::Done)
    }
}
