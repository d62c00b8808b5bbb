//! A TCP proxy on loopback whose answers can be held back: what clients send reaches the
//! server, what the server answers waits while the proxy holds. A replica whose store
//! is behind it can be caught after its request reached the store and before it knew.
//! It can also stop a connection's requests at the first that carries given bytes, so
//! that one write of a replica's never reaches the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy to a server on 127.0.0.1; it stops with the test's runtime.
pub struct Proxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    held: Arc<AtomicBool>,
    stop_at: Arc<Mutex<Option<Vec<u8>>>>,
    stopped: Arc<AtomicBool>,
}

impl Proxy {
    /// Listens on a free port and forwards each connection to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(AtomicBool::new(false));
        let stop_at = Arc::new(Mutex::new(None));
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = Stop {
            at: Arc::clone(&stop_at),
            done: Arc::clone(&stopped),
        };
        let holding = Arc::clone(&held);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                tokio::spawn(forward(client, server, Arc::clone(&holding), stop.clone()));
            }
        });
        Proxy {
            port,
            held,
            stop_at,
            stopped,
        }
    }

    /// Whether a request was stopped (see [`Proxy::stop_requests_containing`]).
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// From now on, the first request read that carries `pattern` is not sent, nor is
    /// anything after it on its connection (the client waits for an answer that never
    /// comes, until its own timeout).
    pub fn stop_requests_containing(&self, pattern: &[u8]) {
        *self.stop_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(pattern.to_vec());
    }

    /// From now on the server's answers wait (what clients send still goes through).
    pub fn hold(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    /// The answers held, and those after, go through again.
    pub fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
    }
}

/// The pattern a request is stopped at, if any, and whether one was.
#[derive(Clone)]
struct Stop {
    at: Arc<Mutex<Option<Vec<u8>>>>,
    done: Arc<AtomicBool>,
}

/// Copies `client` to `server` as it comes until a read carries the pattern to stop at,
/// and `server` to `client` unless held.
async fn forward(client: TcpStream, server: TcpStream, held: Arc<AtomicBool>, stop: Stop) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::spawn(async move {
        let mut buffer = vec![0; 16 * 1024];
        while let Ok(read @ 1..) = client_read.read(&mut buffer).await {
            let chunk = &buffer[..read];
            let pattern = stop
                .at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if pattern.is_some_and(|pattern| chunk.windows(pattern.len()).any(|w| w == pattern)) {
                stop.done.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            if server_write.write_all(chunk).await.is_err() {
                break;
            }
        }
    });
    let mut buffer = vec![0; 16 * 1024];
    while let Ok(read @ 1..) = server_read.read(&mut buffer).await {
        while held.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if client_write.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    up.abort();
}
