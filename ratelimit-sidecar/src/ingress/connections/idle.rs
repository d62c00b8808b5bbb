//! Whether a connection has calls open, and for how long it has had none: every call
//! holds an [`Open`] mark from the moment its headers arrive until its answer's body is
//! dropped (sent, or reset), so a Rate Limit Quota Service stream counts for as long as
//! it lasts. [`Activity::idle_for`] completes once the connection has had no call open
//! for a given time.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Instant;
use tonic::codegen::http;

/// One connection's calls.
#[derive(Debug)]
pub struct Activity {
    open: AtomicUsize,
    /// When the last call ended, in microseconds after `opened`.
    last_end: AtomicU64,
    opened: Instant,
}

impl Activity {
    /// A connection opened now, with no call yet.
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            opened: Instant::now(),
        })
    }

    /// Marks a call open until the mark is dropped.
    pub fn open(self: &Arc<Activity>) -> Open {
        self.open.fetch_add(1, Ordering::AcqRel);
        Open(Arc::clone(self))
    }

    /// When the connection's calls all ended, if none is open.
    fn idle_since(&self) -> Option<Instant> {
        if self.open.load(Ordering::Acquire) != 0 {
            return None;
        }
        let ended = self.last_end.load(Ordering::Acquire);
        Some(self.opened + Duration::from_micros(ended))
    }

    /// Completes once no call has been open for `limit`; never when `limit` is 0.
    pub async fn idle_for(&self, limit: Duration) {
        if limit.is_zero() {
            return std::future::pending().await;
        }
        loop {
            match self.idle_since() {
                Some(since) => {
                    tokio::time::sleep_until(since + limit).await;
                    if self.idle_since() == Some(since) {
                        return;
                    }
                }
                None => tokio::time::sleep(limit).await,
            }
        }
    }
}

/// A call open on a connection: its end is recorded when this is dropped.
#[derive(Debug)]
pub struct Open(Arc<Activity>);

impl Drop for Open {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            let ended = activity.opened.elapsed().as_micros();
            let ended = u64::try_from(ended).unwrap_or(u64::MAX);
            activity.last_end.store(ended, Ordering::Release);
        }
    }
}

/// A call's future, holding its mark until the answer is ready, which then holds it.
pub struct Marked<F> {
    pub(super) call: F,
    pub(super) open: Option<Open>,
}

impl<F, B, E> Future for Marked<F>
where
    F: Future<Output = Result<http::Response<B>, E>> + Unpin,
{
    type Output = Result<http::Response<Opened<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let response = ready!(Pin::new(&mut this.call).poll(cx))?;
        let open = this.open.take();
        Poll::Ready(Ok(response.map(|body| Opened { body, _open: open })))
    }
}

/// An answer's body, which holds its call's mark.
pub struct Opened<B> {
    body: B,
    _open: Option<Open>,
}

impl<B: Body + Unpin> Body for Opened<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit of these tests: their waits are several of it, so that a slow machine
    /// cannot make them fail, only take longer.
    const LIMIT: Duration = Duration::from_millis(100);

    #[tokio::test]
    async fn a_connection_is_idle_only_after_its_last_call_ended_for_the_limit() {
        let activity = Activity::new();
        let started = Instant::now();
        activity.idle_for(LIMIT).await;
        assert!(
            started.elapsed() >= LIMIT,
            "no call at all: idle from the start"
        );

        let call = activity.open();
        let waiting = tokio::spawn({
            let activity = Arc::clone(&activity);
            async move { activity.idle_for(LIMIT).await }
        });
        tokio::time::sleep(LIMIT * 5).await;
        assert!(
            !waiting.is_finished(),
            "a call open for five limits keeps it busy"
        );
        let ended = Instant::now();
        drop(call);
        waiting.await.unwrap();
        assert!(
            ended.elapsed() >= LIMIT,
            "{:?} after the last call",
            ended.elapsed()
        );
    }

    #[tokio::test]
    async fn a_call_that_comes_and_goes_restarts_the_count() {
        let activity = Activity::new();
        let waiting = tokio::spawn({
            let activity = Arc::clone(&activity);
            async move { activity.idle_for(LIMIT).await }
        });
        tokio::time::sleep(LIMIT / 2).await;
        drop(activity.open());
        let ended = Instant::now();
        waiting.await.unwrap();
        assert!(ended.elapsed() >= LIMIT, "{:?}", ended.elapsed());
    }

    #[tokio::test]
    async fn a_limit_of_zero_is_no_limit() {
        let activity = Activity::new();
        let idle = tokio::time::timeout(LIMIT * 3, activity.idle_for(Duration::ZERO));
        assert!(idle.await.is_err());
    }
}
