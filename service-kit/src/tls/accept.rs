//! TLS handshakes off the accept loop: a connection is handed to the server only once
//! its handshake completes, within a deadline, and at most [`MAX_HANDSHAKES`] run at
//! once. A connection first has [`FIRST_BYTE_TIMEOUT`] to send the start of its
//! ClientHello, waiting among at most [`MAX_WAITING`] others without holding a
//! handshake's place: connections that never speak are dropped quickly and cannot keep
//! working clients from their handshakes. Past both bounds, connections wait in the
//! listen backlog.

use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// Handshakes in progress per listener.
pub const MAX_HANDSHAKES: usize = 256;
/// Time a client has to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections per listener waiting for their first byte.
pub const MAX_WAITING: usize = 4096;
/// Time a client has to send the first byte of its ClientHello.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(2);

/// The connections on `listener` that complete a handshake with `config`, until the
/// stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (ready, connections) = mpsc::channel(MAX_HANDSHAKES);
    let acceptor = TlsAcceptor::from(config);
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let waiting = Arc::new(Semaphore::new(MAX_WAITING));
    tokio::spawn(async move {
        loop {
            let waits = tokio::select! {
                permit = Arc::clone(&waiting).acquire_owned() => permit.expect("never closed"),
                () = ready.closed() => return,
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = ready.closed() => return,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a TLS connection; retrying shortly");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (acceptor, ready) = (acceptor.clone(), ready.clone());
            let handshakes = Arc::clone(&handshakes);
            tokio::spawn(async move {
                if !spoke(&stream).await {
                    tracing::debug!(%peer, "TLS connection sent nothing; closed");
                    return;
                }
                let Ok(permit) = handshakes.acquire_owned().await else {
                    return;
                };
                drop(waits);
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
                match handshake.await {
                    Ok(Ok(tls)) => {
                        drop(permit);
                        let _ = ready.send(Ok(tls)).await;
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                    }
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(connections)
}

/// Whether the client sent a byte within [`FIRST_BYTE_TIMEOUT`] (left in the socket for
/// the handshake to read).
async fn spoke(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.peek(&mut first)).await,
        Ok(Ok(n)) if n > 0
    )
}
