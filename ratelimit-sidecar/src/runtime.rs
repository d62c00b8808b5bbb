//! One single-threaded runtime per core.
//!
//! A request is served from accept to answer on one thread: each worker runs a
//! `current_thread` runtime with its own listeners (`SO_REUSEPORT`, so the kernel spreads
//! connections over them) and its own backend connections, so no request wakes another
//! thread. The rules, the memory store and the statistics are shared. Worker 0 is the
//! thread that starts the server; it also runs the configuration watcher and the signal
//! handling. The debug and Prometheus listeners run on a thread of their own ([`AdminThread`]),
//! so that a slow `/explain` or dashboard poll never delays a decision.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::{mpsc, oneshot};

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The index of the worker running on this thread (0 off the workers).
pub fn current() -> usize {
    INDEX.with(Cell::get)
}

/// GRPC_WORKERS, or the CPUs this process may use (its affinity mask and cgroup CPU
/// quota respected).
pub fn count(setting: Option<u16>) -> usize {
    setting.map_or_else(
        || std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        usize::from,
    )
}

/// One value per worker, read by the worker that runs.
#[derive(Debug)]
pub struct PerWorker<T>(Vec<T>);

impl<T> PerWorker<T> {
    /// Values in worker order; at least one.
    pub fn new(values: Vec<T>) -> PerWorker<T> {
        assert!(!values.is_empty(), "one value per worker, at least one");
        PerWorker(values)
    }

    /// The running worker's value.
    pub fn get(&self) -> &T {
        &self.0[current().min(self.0.len() - 1)]
    }

    /// Worker 0's value.
    pub fn first(&self) -> &T {
        &self.0[0]
    }
}

type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The worker threads past the first (which is the caller's own runtime).
pub struct Pool {
    senders: Vec<mpsc::UnboundedSender<Job>>,
}

impl Pool {
    /// Starts `workers - 1` threads, each with a single-threaded runtime.
    pub fn start(workers: usize) -> io::Result<Pool> {
        let mut senders = Vec::with_capacity(workers.saturating_sub(1));
        for index in 1..workers.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (sender, mut jobs) = mpsc::unbounded_channel::<Job>();
            std::thread::Builder::new()
                .name(format!("ratelimit-worker-{index}"))
                .spawn(move || {
                    INDEX.with(|cell| cell.set(index));
                    runtime.block_on(async move {
                        while let Some(job) = jobs.recv().await {
                            tokio::spawn(job());
                        }
                    });
                })?;
            senders.push(sender);
        }
        Ok(Pool { senders })
    }

    /// How many workers, the caller's runtime included.
    pub fn workers(&self) -> usize {
        self.senders.len() + 1
    }

    /// Runs `job(input)` on every worker, with the worker's own input (one per worker, in
    /// worker order), and returns the results in worker order. Must be called from worker
    /// 0's runtime.
    pub async fn on_each<I, F, Fut>(&self, inputs: Vec<I>, job: F) -> Vec<Fut::Output>
    where
        I: Send + 'static,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        assert_eq!(inputs.len(), self.workers(), "one input per worker");
        let job = Arc::new(job);
        let mut results = Vec::with_capacity(self.workers());
        for (index, input) in inputs.into_iter().enumerate() {
            let (tx, rx) = oneshot::channel();
            let job = Arc::clone(&job);
            let run: Job = Box::new(move || {
                Box::pin(async move {
                    let _ = tx.send(job(input).await);
                })
            });
            match index {
                0 => drop(tokio::spawn(run())),
                _ => {
                    // A worker thread only ends when the pool is dropped.
                    let _ = self.senders[index - 1].send(run);
                }
            }
            results.push(rx);
        }
        let mut out = Vec::with_capacity(results.len());
        for rx in results {
            out.push(rx.await.expect("a worker ran its job to the end"));
        }
        out
    }
}

/// A thread of its own with a single-threaded runtime, for the admin work that must never
/// share a thread with decisions (the debug and Prometheus listeners, Envoy's admin
/// interface's counterpart). It runs until dropped;
/// tasks still running then are cancelled.
pub struct AdminThread {
    handle: tokio::runtime::Handle,
    _stop: oneshot::Sender<()>,
}

impl AdminThread {
    /// Starts the thread, named `name`.
    pub fn start(name: &str) -> io::Result<AdminThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let _ = stopped.await;
                });
            })?;
        Ok(AdminThread {
            handle,
            _stop: stop,
        })
    }

    /// Runs `future` on this thread.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(future)
    }

    /// Moves `listener` (registered with the caller's runtime) to this thread's and runs
    /// `serve` on it. A listener this runtime cannot take stops the process: the kernel
    /// would go on queueing connections that nobody accepts.
    pub fn serve<F, Fut>(
        &self,
        listener: tokio::net::TcpListener,
        serve: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let moved = listener.into_std();
        self.spawn(async move {
            match moved.and_then(tokio::net::TcpListener::from_std) {
                Ok(listener) => serve(listener).await,
                Err(error) => {
                    tracing::error!(%error, "the debug thread cannot take its listener");
                    eprintln!("ratelimit: the debug thread cannot take its listener: {error}");
                    std::process::exit(1)
                }
            }
        })
    }
}

/// `count` listeners on `host:port`. With more than one, each has `SO_REUSEPORT` and they
/// share one port (the kernel spreads connections over them); the port is first taken by
/// a plain socket, so that one already in use, even by another process that shares ports,
/// is an error rather than a silent split of the traffic.
pub fn listeners(host: &str, port: u16, count: usize) -> io::Result<Vec<StdTcpListener>> {
    let address = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the host has no address"))?;
    let probe = StdTcpListener::bind(address)?;
    if count <= 1 {
        probe.set_nonblocking(true)?;
        return Ok(vec![probe]);
    }
    let address = probe.local_addr()?;
    drop(probe);
    (0..count).map(|_| shared_listener(address)).collect()
}

fn shared_listener(address: SocketAddr) -> io::Result<StdTcpListener> {
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}
