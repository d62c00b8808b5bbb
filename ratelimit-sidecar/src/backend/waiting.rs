//! The requests waiting on a pipelined connection (Redis's or memcached's) for their
//! replies, each until its deadline.
//!
//! One timer per connection, not one per request: the connection's [`fail_late`] sleeps
//! until the earliest deadline among the waiting requests, fails the requests whose
//! deadline has passed with [`Failure::Late`], and sleeps again. A request tells it only
//! when its deadline comes before the one it sleeps until (a caller's shorter
//! `grpc-timeout`), so a request under steady load touches no timer at all. A late
//! request keeps its place in the queue: its replies, when they come, are read and
//! dropped there, so the replies after them still reach their own requests.

use std::collections::VecDeque;
use std::time::Instant;

use smallvec::SmallVec;
use tokio::sync::{Notify, oneshot};

/// A request's replies, in order (a request sends a few commands: kept inline).
pub type Got<R> = SmallVec<[R; 4]>;

/// Why a request got no replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Its deadline passed first.
    Late,
    /// The connection failed, or could not take it: why.
    Failed(String),
}

/// A request's replies, or why there are none.
pub type Answer<R> = Result<Got<R>, Failure>;

/// The waiting requests of one connection, in the order their replies will come.
pub(super) struct Waiting<R> {
    queue: VecDeque<Waiter<R>>,
    /// The deadline [`fail_late`] sleeps until; `None` while it waits to be told of one.
    armed: Option<Instant>,
}

struct Waiter<R> {
    replies: usize,
    got: Got<R>,
    /// `None`: no deadline (a health check, bounded by its caller).
    deadline: Option<Instant>,
    /// Taken when the request is answered early (late): its replies are then dropped.
    answer: Option<oneshot::Sender<Answer<R>>>,
}

/// A request's answer, sent once the connection's lock is released.
#[must_use = "an answer reaches its request when sent"]
pub(super) struct Done<R>(Option<oneshot::Sender<Answer<R>>>, Answer<R>);

impl<R> Done<R> {
    /// Hands the answer to its request (which may have gone away).
    pub fn send(self) {
        if let Some(sender) = self.0 {
            let _ = sender.send(self.1);
        }
    }
}

impl<R> Waiting<R> {
    pub fn new() -> Waiting<R> {
        Waiting {
            queue: VecDeque::new(),
            armed: None,
        }
    }

    /// How many requests wait (late ones whose replies have not come yet included).
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues a request that awaits `replies` replies until `deadline`; the second value
    /// says whether [`fail_late`] must be told (`sooner`): it sleeps until a later deadline,
    /// or until told.
    pub fn push(
        &mut self,
        replies: usize,
        deadline: Option<Instant>,
    ) -> (oneshot::Receiver<Answer<R>>, bool) {
        let (answer, receiver) = oneshot::channel();
        self.queue.push_back(Waiter {
            replies,
            got: Got::new(),
            deadline,
            answer: Some(answer),
        });
        let sooner = deadline.is_some_and(|at| self.armed.is_none_or(|armed| at < armed));
        if sooner {
            self.armed = deadline;
        }
        (receiver, sooner)
    }

    /// Hands `reply`, the next one read, to the first request; that request's answer
    /// once it has all of its replies. An error when no request awaits one.
    pub fn reply(&mut self, reply: R) -> Result<Option<Done<R>>, &'static str> {
        let waiter = self.queue.front_mut().ok_or("a reply to no command")?;
        waiter.got.push(reply);
        if waiter.got.len() < waiter.replies {
            return Ok(None);
        }
        Ok(self
            .queue
            .pop_front()
            .map(|waiter| Done(waiter.answer, Ok(waiter.got))))
    }

    /// Every request, failed with `error` (the connection broke).
    pub fn fail_all(&mut self, error: &str) -> Vec<Done<R>> {
        let failure = Failure::Failed(error.to_owned());
        self.queue
            .drain(..)
            .map(|waiter| Done(waiter.answer, Err(failure.clone())))
            .collect()
    }

    /// The requests whose deadline is `now` or earlier, failed as late (they keep their
    /// places for their replies), and the earliest deadline left, which [`fail_late`] sleeps
    /// until next. One pass over the queue (at most its connection's `MAX_WAITING` long):
    /// under steady load it runs about once a deadline's length, when the deadline it slept
    /// until belonged to a request answered since.
    fn expire(&mut self, now: Instant) -> (Vec<Done<R>>, Option<Instant>) {
        let mut late = Vec::new();
        let mut earliest: Option<Instant> = None;
        for waiter in self.queue.iter_mut().filter(|w| w.answer.is_some()) {
            let Some(deadline) = waiter.deadline else {
                continue;
            };
            if deadline <= now {
                late.push(Done(waiter.answer.take(), Err(Failure::Late)));
            } else if earliest.is_none_or(|at| deadline < at) {
                earliest = Some(deadline);
            }
        }
        self.armed = earliest;
        (late, earliest)
    }
}

/// Fails each request of a connection once its deadline passes; never ends (the
/// connection's task drops it). `expire` locks the connection's [`Waiting`] and runs
/// `f` on it; `sooner` is notified when a request's deadline comes before the one this
/// sleeps until.
async fn fail_late<R>(sooner: &Notify, expire: impl Fn(&mut dyn FnMut(&mut Waiting<R>))) {
    loop {
        let told = sooner.notified();
        let mut late = Vec::new();
        let mut next = None;
        let now = Instant::now();
        expire(&mut |waiting| (late, next) = waiting.expire(now));
        late.into_iter().for_each(Done::send);
        match next {
            Some(at) => {
                let _ = tokio::time::timeout_at(at.into(), told).await;
            }
            None => told.await,
        }
    }
}

/// Runs a connection's task, `run`, with its deadline timer ([`fail_late`], whose
/// arguments these are beside it) until `run` ends.
pub(super) async fn with_deadlines<R>(
    sooner: &Notify,
    expire: impl Fn(&mut dyn FnMut(&mut Waiting<R>)),
    run: impl Future<Output = ()>,
) {
    tokio::select! {
        () = run => {}
        () = fail_late(sooner, expire) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    fn after(ms: u64) -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(ms))
    }

    #[test]
    fn replies_reach_their_requests_in_order_and_late_ones_keep_their_place() {
        let mut waiting: Waiting<u32> = Waiting::new();
        let (mut first, _) = waiting.push(2, after(60_000));
        let (mut second, _) = waiting.push(1, Some(Instant::now()));
        let (mut third, _) = waiting.push(1, None);
        let (late, next) = waiting.expire(Instant::now());
        late.into_iter().for_each(Done::send);
        assert_eq!(second.try_recv().unwrap(), Err(Failure::Late));
        assert!(next.is_some() && next < after(60_001), "{next:?}");
        assert!(waiting.reply(1).unwrap().is_none());
        waiting.reply(2).unwrap().unwrap().send();
        assert_eq!(first.try_recv().unwrap().unwrap().as_slice(), [1, 2]);
        // The late request's reply is read in its place and dropped.
        waiting.reply(3).unwrap().unwrap().send();
        waiting.reply(4).unwrap().unwrap().send();
        assert_eq!(third.try_recv().unwrap().unwrap().as_slice(), [4]);
        assert_eq!(waiting.reply(5).err(), Some("a reply to no command"));
    }

    #[test]
    fn only_a_sooner_deadline_is_told() {
        let mut waiting: Waiting<u32> = Waiting::new();
        assert!(waiting.push(1, after(1_000)).1, "nothing armed yet");
        assert!(!waiting.push(1, after(2_000)).1, "later than armed");
        assert!(!waiting.push(1, None).1, "no deadline");
        assert!(waiting.push(1, after(10)).1, "a shorter grpc-timeout");
        let failed = waiting.fail_all("closed");
        assert_eq!(failed.len(), 4);
        assert!(waiting.is_empty());
    }

    /// The watcher fails a request with a short deadline queued behind one with a long
    /// deadline at its own time, and the long one only when its time comes.
    #[tokio::test]
    async fn the_watcher_fails_each_request_at_its_own_deadline() {
        let state = Arc::new(Mutex::new(Waiting::<u32>::new()));
        let sooner = Arc::new(Notify::new());
        let watcher = {
            let (state, sooner) = (Arc::clone(&state), Arc::clone(&sooner));
            tokio::spawn(async move {
                fail_late(&sooner, |f| f(&mut state.lock().unwrap())).await;
            })
        };
        let queue = |ms| {
            let (receiver, tell) = state.lock().unwrap().push(1, after(ms));
            if tell {
                sooner.notify_one();
            }
            receiver
        };
        let started = Instant::now();
        let (mut long, short) = (queue(2_000), queue(50));
        assert_eq!(short.await.unwrap(), Err(Failure::Late));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(waited < Duration::from_millis(2_000), "{waited:?}");
        assert!(long.try_recv().is_err(), "still waiting");
        assert_eq!(long.await.unwrap(), Err(Failure::Late));
        assert!(started.elapsed() >= Duration::from_millis(2_000));
        watcher.abort();
    }
}
