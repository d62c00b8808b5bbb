//! One connection to a memcached node, shared by a worker's requests.
//!
//! A request encodes its commands straight into the connection's one write buffer and
//! waits for its replies. memcached answers a connection's commands in order, so each
//! command leaves the kind of its reply in a queue, and the replies read are parsed by
//! it and handed to the requests in the order they wrote. The connection's task writes
//! whatever has gathered in one `write` and reads every reply that has arrived in one
//! `read`, so the requests a worker decides in the same turn share a round trip.
//!
//! The connection is opened when a request first needs it. When it breaks (closed, a
//! reply that is not one, or no reply for `MEMCACHE_TIMEOUT` while requests wait on it)
//! every request waiting on it fails with the error, and the next request opens another.
//! Waiting requests are bounded by [`MAX_WAITING`]; each request's own deadline bounds
//! its wait, through the connection's one timer ([`waiting`]).

use std::collections::VecDeque;
use std::io;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::Notify;

use super::protocol::{Commands, Kind, Reply, parse};
use super::tls::Tls;
use crate::backend::send_buffer::{self, SendBuffer, write_gathered};
use crate::backend::waiting::{self, Failure, Queue, Waiting, Woken};

/// The most requests that may wait on one connection.
pub const MAX_WAITING: usize = 65_536;

/// Where a node is and how to speak to it.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` as listed (the TLS name).
    pub label: String,
    /// What to connect to.
    pub connect: String,
    pub tls: Option<Tls>,
    /// `MEMCACHE_TIMEOUT`: for connecting, and for the oldest request's reply.
    pub timeout: Duration,
}

/// A node's shared, pipelined connection. Its task ends when this is dropped.
pub struct Link {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("node", &self.shared.target.label)
            .finish_non_exhaustive()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.lock().send_buffer.closed = true;
        self.shared.work.notify_one();
    }
}

struct Shared {
    target: Target,
    state: Mutex<State>,
    /// Wakes the connection's task: commands to write, a connection is asked for, or
    /// the link is dropped.
    work: Notify,
    /// Wakes the connection's deadline timer: a request's deadline comes sooner.
    sooner: Notify,
}

struct State {
    send_buffer: SendBuffer,
    /// The kind of each reply still to come, in order.
    kinds: VecDeque<Kind>,
    waiting: Waiting<Reply>,
    /// Since when the connection has owed a reply with none coming: the last reply, or
    /// when a request began waiting on a connection that owed none.
    owing_since: Instant,
    status: Status,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    /// No connection: the next request asks for one.
    Idle,
    /// Connecting; requests queue for the attempt.
    Connecting,
    Up,
}

/// A request's replies, or why there are none.
type Answer = waiting::Answer<Reply>;

impl Link {
    /// A link to `target`, whose task runs on `runtime` (the worker's); nothing is
    /// opened until a request needs it.
    pub fn new(target: Target, runtime: &Handle) -> Link {
        let shared = Arc::new(Shared {
            target,
            state: Mutex::new(State {
                send_buffer: SendBuffer::with_capacity(4 * 1024),
                kinds: VecDeque::new(),
                waiting: Waiting::new(),
                owing_since: Instant::now(),
                status: Status::Idle,
            }),
            work: Notify::new(),
            sooner: Notify::new(),
        });
        let task = Arc::clone(&shared);
        runtime.spawn(async move {
            let ended = "the connection's task ended";
            waiting::with_deadlines(&*task, &task.sooner, ended, supervise(&task)).await;
        });
        Link { shared }
    }

    /// Sends the commands `write` encodes and returns their replies, in order, or
    /// [`Failure::Late`] once `deadline` passes.
    pub async fn query(
        &self,
        deadline: Option<Instant>,
        write: impl FnOnce(&mut Commands<'_>),
    ) -> Answer {
        let shared = &self.shared;
        let (slot, sooner) = {
            let mut guard = shared.lock();
            let state = &mut *guard;
            if state.waiting.len() >= MAX_WAITING {
                let error = format!("{MAX_WAITING} requests are already waiting");
                return Err(Failure::Failed(error));
            }
            let mut commands = Commands::new(&mut state.send_buffer.out, &mut state.kinds);
            write(&mut commands);
            let count = commands.count();
            if count == 0 {
                return Ok(waiting::Got::new());
            }
            if state.waiting.is_empty() {
                state.owing_since = Instant::now();
            }
            if state.status == Status::Idle {
                state.status = Status::Connecting;
            }
            state.waiting.push(count, deadline)
        };
        let sooner = sooner.then_some(&shared.sooner);
        waiting::replies(&**shared, slot, sooner, &shared.work).await
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        send_buffer::lock(&self.state)
    }

    /// Fails every waiting request; the next request connects again.
    fn broken(&self, error: &str) {
        let failed = {
            let mut state = self.lock();
            state.send_buffer.out.clear();
            state.kinds.clear();
            state.status = Status::Idle;
            state.waiting.fail_all(error)
        };
        failed.into_iter().for_each(Waker::wake);
    }

    /// Parses the complete replies at the start of `input` and hands them to their
    /// requests, in order; returns the bytes used, or why the connection is out of step.
    fn deliver(&self, input: &[u8]) -> Result<usize, String> {
        let mut woken = Woken::new();
        let mut at = 0;
        let result = {
            let mut guard = self.lock();
            let state = &mut *guard;
            let result = loop {
                let Some(&kind) = state.kinds.front() else {
                    break match at < input.len() {
                        true => Err("memcached sent a reply to no command".to_owned()),
                        false => Ok(at),
                    };
                };
                let (reply, used) = match parse(&input[at..], kind) {
                    Ok(Some(parsed)) => parsed,
                    Ok(None) => break Ok(at),
                    Err(error) => break Err(error),
                };
                at += used;
                state.kinds.pop_front();
                if let Err(error) = state.waiting.reply(reply, &mut woken) {
                    break Err(error.to_owned());
                }
            };
            if at > 0 {
                state.owing_since = Instant::now();
            }
            result
        };
        woken.into_iter().for_each(Waker::wake);
        result
    }

    /// Waits until a request asks for a connection; `false` once the link is dropped.
    async fn asked(&self) -> bool {
        loop {
            let notified = self.work.notified();
            {
                let state = self.lock();
                if state.send_buffer.closed {
                    return false;
                }
                if state.status == Status::Connecting {
                    return true;
                }
            }
            notified.await;
        }
    }
}

impl Queue<Reply> for Shared {
    fn waiting<T>(&self, f: impl FnOnce(&mut Waiting<Reply>) -> T) -> T {
        f(&mut self.lock().waiting)
    }
}

/// Connects when asked, runs the connection until it breaks, and again; ends when the
/// link is dropped.
async fn supervise(shared: &Shared) {
    while shared.asked().await {
        let error = match open(&shared.target).await {
            Ok(halves) => {
                shared.lock().status = Status::Up;
                let Some(error) = drive(shared, halves).await else {
                    return;
                };
                tracing::warn!(node = %shared.target.label, %error, "memcached connection failed; waiting requests fail");
                error
            }
            Err(error) => error,
        };
        shared.broken(&error);
    }
}

type Halves = (
    Box<dyn AsyncRead + Send + Unpin>,
    Box<dyn AsyncWrite + Send + Unpin>,
);

/// Connects (and shakes hands over TLS) within the target's timeout.
async fn open(target: &Target) -> Result<Halves, String> {
    let attempt = async {
        let tcp = TcpStream::connect(&target.connect).await?;
        tcp.set_nodelay(true)?;
        Ok::<Halves, io::Error>(match &target.tls {
            Some(tls) => {
                let (read, write) = tokio::io::split(tls.wrap(&target.label, tcp).await?);
                (Box::new(read), Box::new(write))
            }
            None => {
                let (read, write) = tcp.into_split();
                (Box::new(read), Box::new(write))
            }
        })
    };
    match tokio::time::timeout(target.timeout, attempt).await {
        Ok(connected) => connected.map_err(|error| error.to_string()),
        Err(_) => Err(format!(
            "no connection within MEMCACHE_TIMEOUT ({:?})",
            target.timeout
        )),
    }
}

/// Writes what requests add and reads their replies until the connection breaks (the
/// error) or the link is dropped (`None`).
async fn drive(shared: &Shared, (mut reader, mut writer): Halves) -> Option<String> {
    let write = write_gathered(&mut writer, &shared.work, 4 * 1024, |buffer| {
        shared.lock().send_buffer.take(buffer)
    });
    let read = async {
        let mut input = BytesMut::with_capacity(16 * 1024);
        loop {
            match reader.read_buf(&mut input).await {
                Ok(0) => return Some("memcached closed the connection".to_owned()),
                Ok(_) => {}
                Err(error) => return Some(error.to_string()),
            }
            match shared.deliver(&input) {
                Ok(used) => input.advance(used),
                Err(error) => return Some(error),
            }
        }
    };
    tokio::select! {
        biased;
        ended = read => ended,
        ended = write => ended,
        late = watch(shared) => Some(late),
    }
}

/// Returns once the connection has owed a reply for the target's timeout with none
/// coming: it is late as a whole (a frozen or unreachable node). Replies come in order,
/// so the oldest waiting request is never late while others' replies arrive.
async fn watch(shared: &Shared) -> String {
    let timeout = shared.target.timeout;
    let mut alarm = pin!(tokio::time::sleep(timeout));
    loop {
        alarm.as_mut().await;
        let now = Instant::now();
        let owing = {
            let state = shared.lock();
            (!state.waiting.is_empty()).then_some(state.owing_since)
        };
        match owing {
            Some(since) if now.duration_since(since) >= timeout => {
                return format!("no reply within MEMCACHE_TIMEOUT ({timeout:?})");
            }
            Some(since) => alarm.as_mut().reset((since + timeout).into()),
            None => alarm.as_mut().reset((now + timeout).into()),
        }
    }
}
