//! One connection to a single Redis (TCP or unix socket), shared by a worker's requests.
//!
//! A request appends its commands to the connection's one write buffer and waits for its
//! replies, which come back in the order the commands went out. The connection's task
//! writes whatever has gathered in one `write` and reads every reply that has arrived in
//! one `read`, so requests decided in the same turn of the worker's runtime share a round
//! trip. Commands are encoded straight into that buffer: no per-command objects.
//!
//! When the connection breaks, every request waiting on it fails at once, requests fail
//! fast until the next attempt to connect (at most one every [`RECONNECT_EVERY`]), and
//! the first request after that waits for the attempt. Waiting requests are bounded by
//! [`MAX_WAITING`]; each request's own deadline (`REDIS_TIMEOUT`, or the caller's
//! shorter one) bounds its wait, through the connection's one timer ([`waiting`]).

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::Notify;

use super::resp::{self, Arg, Replies, Reply};
use crate::backend::send_buffer::{self, SendBuffer, write_gathered};
use crate::backend::waiting::{self, Failure, Queue, Waiting, Woken};

/// The most requests that may wait on one connection.
pub const MAX_WAITING: usize = 65_536;
/// How soon a broken connection is tried again.
pub const RECONNECT_EVERY: Duration = Duration::from_millis(100);

/// Keep-alive probes of an idle TCP connection: after 15 s of silence, every 5 s, three.
const KEEPALIVE: socket2::TcpKeepalive = socket2::TcpKeepalive::new()
    .with_time(Duration::from_secs(15))
    .with_interval(Duration::from_secs(5))
    .with_retries(3);
/// The shortest time sent data may go unacknowledged before the connection is closed.
const MIN_USER_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the server is, and how to log in.
#[derive(Debug, Clone)]
pub struct Target {
    pub address: Address,
    pub user: Option<String>,
    pub password: Option<String>,
    pub connect_timeout: Duration,
}

#[derive(Debug, Clone)]
pub enum Address {
    Tcp(String, u16),
    Unix(std::path::PathBuf),
}

/// A shared, pipelined connection. Its task ends when the last clone is dropped.
#[derive(Clone)]
pub struct Pipelined {
    handle: Arc<Handle>,
}

/// Tells the connection's task that nobody holds the connection any more.
struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.lock().send_buffer.closed = true;
        self.0.work.notify_one();
    }
}

impl std::fmt::Debug for Pipelined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipelined")
            .field("target", &self.handle.0.target)
            .finish_non_exhaustive()
    }
}

struct Shared {
    target: Target,
    state: Mutex<State>,
    /// Wakes the connection's task: commands to write, an attempt to connect is due, or
    /// the connection is no longer held.
    work: Notify,
    /// Wakes the connection's deadline timer: a request's deadline comes sooner.
    sooner: Notify,
}

struct State {
    send_buffer: SendBuffer,
    waiting: Waiting<Reply>,
    link: Link,
}

enum Link {
    Up,
    /// Connecting; requests queue for the attempt.
    Connecting,
    /// Broken since `at`, with the error; requests fail until the next attempt.
    Down {
        at: Instant,
        error: String,
    },
}

/// A request's replies, or why there are none.
type Answer = waiting::Answer<Reply>;

impl Pipelined {
    /// Connects (an error if the server cannot be reached or refuses the login) and
    /// starts the connection's task on the current runtime.
    pub async fn connect(target: Target) -> Result<Pipelined, String> {
        let connection = open(&target).await?;
        let shared = Arc::new(Shared {
            target,
            state: Mutex::new(State {
                send_buffer: SendBuffer::with_capacity(16 * 1024),
                waiting: Waiting::new(),
                link: Link::Up,
            }),
            work: Notify::new(),
            sooner: Notify::new(),
        });
        let task = Arc::clone(&shared);
        tokio::spawn(async move {
            let run = supervise(&task, connection);
            waiting::with_deadlines(&*task, &task.sooner, "redis connection: closed", run).await;
        });
        Ok(Pipelined {
            handle: Arc::new(Handle(shared)),
        })
    }

    /// How many requests wait for replies on this connection.
    pub fn waiting(&self) -> usize {
        self.handle.0.lock().waiting.len()
    }

    /// Sends the commands `write` encodes (each through the function it is given) and
    /// returns their replies, in order, or [`Failure::Late`] once `deadline` passes.
    pub async fn query(
        &self,
        deadline: Option<Instant>,
        write: impl FnOnce(&mut dyn FnMut(&[Arg<'_>])),
    ) -> Answer {
        let shared = &self.handle.0;
        let (slot, sooner) = {
            let mut state = shared.lock();
            match &state.link {
                Link::Up | Link::Connecting => {}
                Link::Down { at, .. } if at.elapsed() >= RECONNECT_EVERY => {
                    state.link = Link::Connecting;
                }
                Link::Down { error, .. } => return Err(Failure::Failed(error.clone())),
            }
            if state.waiting.len() >= MAX_WAITING {
                return Err(Failure::Failed(format!(
                    "redis connection: {MAX_WAITING} requests are already waiting on it"
                )));
            }
            let mut count = 0;
            let out = &mut state.send_buffer.out;
            write(&mut |args| {
                resp::encode(out, args);
                count += 1;
            });
            if count == 0 {
                return Ok(Replies::new());
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

    /// Fails every waiting request and marks the link down.
    fn broken(&self, error: &str) {
        let error = format!("redis connection: {error}");
        let failed = {
            let mut state = self.lock();
            state.send_buffer.out.clear();
            state.link = Link::Down {
                at: Instant::now(),
                error: error.clone(),
            };
            state.waiting.fail_all(&error)
        };
        failed.into_iter().for_each(Waker::wake);
    }

    /// Hands complete replies to their requests, in order (leaving `replies` empty).
    fn deliver(&self, replies: &mut Vec<Reply>) -> Result<(), &'static str> {
        let mut woken = Woken::new();
        let delivered = {
            let mut state = self.lock();
            replies
                .drain(..)
                .try_for_each(|reply| state.waiting.reply(reply, &mut woken))
        };
        woken.into_iter().for_each(Waker::wake);
        delivered
    }
}

impl Queue<Reply> for Shared {
    fn waiting<T>(&self, f: impl FnOnce(&mut Waiting<Reply>) -> T) -> T {
        f(&mut self.lock().waiting)
    }
}

/// Runs the connection; after a break, connects again when a request asks; ends when
/// nobody holds the connection.
async fn supervise(shared: &Shared, first: Connection) {
    let mut connection = first;
    loop {
        let Some(error) = drive(shared, connection).await else {
            return;
        };
        tracing::warn!(%error, address = ?shared.target.address, "redis connection broken");
        shared.broken(&error);
        connection = loop {
            let notified = shared.work.notified();
            let (closed, due) = {
                let state = shared.lock();
                (
                    state.send_buffer.closed,
                    matches!(state.link, Link::Connecting),
                )
            };
            if closed {
                return;
            }
            if !due {
                notified.await;
                continue;
            }
            match open(&shared.target).await {
                Ok(connection) => {
                    shared.lock().link = Link::Up;
                    break connection;
                }
                Err(error) => shared.broken(&error),
            }
        };
    }
}

/// Writes what requests add and reads their replies until the connection breaks (the
/// error) or is no longer held (`None`).
async fn drive(shared: &Shared, connection: Connection) -> Option<String> {
    let (mut reader, mut writer) = connection.split();
    let write = write_gathered(&mut writer, &shared.work, 16 * 1024, |buffer| {
        shared.lock().send_buffer.take(buffer)
    });
    let read = async {
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut replies = Vec::new();
        loop {
            match reader.read_buf(&mut input).await {
                Ok(0) => return Some("the server closed the connection".to_owned()),
                Ok(_) => {}
                Err(error) => return Some(error.to_string()),
            }
            let mut at = 0;
            loop {
                match resp::parse(&input[at..]) {
                    Ok(Some((reply, used))) => {
                        replies.push(reply);
                        at += used;
                    }
                    Ok(None) => break,
                    Err(error) => return Some(format!("not a Redis reply: {error}")),
                }
            }
            input.advance(at);
            if let Err(error) = shared.deliver(&mut replies) {
                return Some(error.to_owned());
            }
        }
    };
    tokio::select! {
        ended = write => ended,
        ended = read => ended,
    }
}

/// A connected socket.
enum Connection {
    Tcp(TcpStream),
    Unix(UnixStream),
}

type Halves = (
    Box<dyn AsyncRead + Send + Unpin>,
    Box<dyn AsyncWrite + Send + Unpin>,
);

impl Connection {
    fn split(self) -> Halves {
        match self {
            Connection::Tcp(stream) => {
                let (read, write) = stream.into_split();
                (Box::new(read), Box::new(write))
            }
            Connection::Unix(stream) => {
                let (read, write) = stream.into_split();
                (Box::new(read), Box::new(write))
            }
        }
    }
}

/// Connects and logs in (`AUTH`), within the target's connect timeout.
async fn open(target: &Target) -> Result<Connection, String> {
    let attempt = async {
        let mut connection = match &target.address {
            Address::Tcp(host, port) => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                // A server gone without a word (a host down, a dropped route) is noticed by
                // the kernel: an idle connection is probed, and one whose data goes
                // unacknowledged for REDIS_TIMEOUT is closed (then connected again).
                let socket = socket2::SockRef::from(&stream);
                socket.set_tcp_keepalive(&KEEPALIVE)?;
                socket.set_tcp_user_timeout(Some(target.connect_timeout.max(MIN_USER_TIMEOUT)))?;
                Connection::Tcp(stream)
            }
            Address::Unix(path) => Connection::Unix(UnixStream::connect(path).await?),
        };
        if let Some(password) = &target.password {
            let user = target.user.as_deref();
            match &mut connection {
                Connection::Tcp(stream) => login(stream, user, password).await?,
                Connection::Unix(stream) => login(stream, user, password).await?,
            }
        }
        Ok::<_, io::Error>(connection)
    };
    match tokio::time::timeout(target.connect_timeout, attempt).await {
        Ok(connected) => connected.map_err(|error| format!("{:?}: {error}", target.address)),
        Err(_) => Err(format!(
            "{:?}: no connection within {:?}",
            target.address, target.connect_timeout
        )),
    }
}

/// `AUTH [user] password`, and its answer.
async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    user: Option<&str>,
    password: &str,
) -> io::Result<()> {
    let mut command = Vec::new();
    match user {
        Some(user) => resp::encode(
            &mut command,
            &[Arg::Text("AUTH"), Arg::Text(user), Arg::Text(password)],
        ),
        None => resp::encode(&mut command, &[Arg::Text("AUTH"), Arg::Text(password)]),
    }
    stream.write_all(&command).await?;
    let mut input = BytesMut::with_capacity(512);
    let reply = loop {
        if stream.read_buf(&mut input).await? == 0 {
            return Err(io::Error::other("the server closed the connection"));
        }
        if let Some((reply, _)) = resp::parse(&input).map_err(io::Error::other)? {
            break reply;
        }
    };
    match reply {
        Reply::Error(error) => Err(io::Error::other(format!("AUTH refused: {error}"))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP connection to Redis has keep-alive probes and a user timeout, so that a
    /// server gone without a reset does not hold it for ever.
    #[tokio::test]
    async fn tcp_connections_notice_a_silent_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Target {
            address: Address::Tcp("127.0.0.1".into(), port),
            user: None,
            password: None,
            connect_timeout: Duration::from_secs(7),
        };
        let Connection::Tcp(stream) = open(&target).await.unwrap() else {
            panic!("a TCP address gives a TCP connection");
        };
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().unwrap());
        assert_eq!(
            socket.tcp_keepalive_time().unwrap(),
            Duration::from_secs(15)
        );
        assert_eq!(
            socket.tcp_user_timeout().unwrap(),
            Some(Duration::from_secs(7))
        );
    }
}
