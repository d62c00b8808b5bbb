//! What the pipelined connections to Redis and memcached share: the buffer their
//! requests encode commands into, and the loop of the connection's task that writes
//! whatever has gathered there in one `write`.

use std::sync::{Mutex, MutexGuard};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

/// The commands requests have written and not yet sent, and whether the connection is
/// still held (kept under the connection's lock, with what else it guards).
#[derive(Debug, Default)]
pub(super) struct SendBuffer {
    /// Encoded commands, in the order their replies will come.
    pub out: Vec<u8>,
    /// Nobody holds the connection any more: its task ends.
    pub closed: bool,
}

impl SendBuffer {
    /// An empty send buffer with room for `capacity` bytes of commands.
    pub fn with_capacity(capacity: usize) -> SendBuffer {
        SendBuffer {
            out: Vec::with_capacity(capacity),
            closed: false,
        }
    }

    /// Swaps the gathered commands into `buffer` (which must be empty); `false` once the
    /// connection is no longer held.
    pub fn take(&mut self, buffer: &mut Vec<u8>) -> bool {
        if self.closed {
            return false;
        }
        std::mem::swap(&mut self.out, buffer);
        true
    }
}

/// Writes what requests gather, all of it in one `write` each time `work` is notified,
/// until the connection is no longer held (`None`: `take` gave `false`) or a write fails
/// (the error). `take` runs [`SendBuffer::take`] under the connection's lock.
pub(super) async fn write_gathered(
    writer: &mut (impl AsyncWrite + Unpin + ?Sized),
    work: &Notify,
    capacity: usize,
    mut take: impl FnMut(&mut Vec<u8>) -> bool,
) -> Option<String> {
    let mut buffer = Vec::with_capacity(capacity);
    loop {
        let notified = work.notified();
        if !take(&mut buffer) {
            return None;
        }
        if buffer.is_empty() {
            notified.await;
            continue;
        }
        if let Err(error) = writer.write_all(&buffer).await {
            return Some(error.to_string());
        }
        buffer.clear();
    }
}

/// The connection's state, locked; a request that panicked while holding it left it
/// whole (every change under the lock is a single step), so the lock is taken anyway.
pub(super) fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
