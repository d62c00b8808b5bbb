//! The requests waiting on a pipelined connection (Redis's or memcached's) for their
//! replies, each until its deadline.
//!
//! A request's answer is left in its own slot of the connection's [`Waiting`], under the
//! connection's lock, and its [`Replies`] future takes it from there: no channel and no
//! allocation per request. The slots are reused; there are as many as requests have
//! waited on the connection at once (each one's future, or its unread replies), which
//! `MAX_WAITING` and the bound on requests in flight keep finite.
//!
//! One timer per connection, not one per request: the connection's [`fail_late`] sleeps
//! until the earliest deadline among the waiting requests, fails the requests whose
//! deadline has passed with [`Failure::Late`], and sleeps again. A request tells it only
//! when its deadline comes before the one it sleeps until (a caller's shorter
//! `grpc-timeout`), so a request under steady load touches no timer at all. A late
//! request, or one whose caller went away, keeps its place in the queue: its replies,
//! when they come, are read and dropped there, so the replies after them still reach
//! their own requests.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use smallvec::SmallVec;
use tokio::sync::Notify;

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

/// How a [`Replies`] future, and the connection's task, reach the connection's
/// [`Waiting`]: under the connection's lock.
pub(super) trait Queue<R> {
    /// Runs `f` on the waiting requests, with the connection locked.
    fn waiting<T>(&self, f: impl FnOnce(&mut Waiting<R>) -> T) -> T;
}

/// The waiting requests of one connection, in the order their replies will come.
pub(super) struct Waiting<R> {
    queue: VecDeque<Waiter>,
    /// Each request's replies and answer, until its future takes them.
    slots: Vec<Slot<R>>,
    /// The slots no request holds.
    free: Vec<usize>,
    /// The deadline [`fail_late`] sleeps until; `None` while it waits to be told of one.
    armed: Option<Instant>,
}

struct Waiter {
    /// Its replies still to come.
    left: usize,
    /// `None`: no deadline (a health check, bounded by its caller).
    deadline: Option<Instant>,
    /// Its request's slot; `None` once answered early (late): its replies are dropped.
    slot: Option<usize>,
}

/// A request's replies so far, and where its answer stands.
struct Slot<R> {
    got: Got<R>,
    state: State,
}

enum State {
    Free,
    /// Its request waits (woken by this, once it has polled).
    Waits(Option<Waker>),
    /// Its request's future is gone; its replies have not all come yet.
    Abandoned,
    /// Its replies are all in `got`, or why there are none.
    Answered(Result<(), Failure>),
}

/// Wakes the requests answered under the connection's lock, once it is released.
pub(super) type Woken = SmallVec<[Waker; 16]>;

impl<R> Waiting<R> {
    pub fn new() -> Waiting<R> {
        Waiting {
            queue: VecDeque::new(),
            slots: Vec::new(),
            free: Vec::new(),
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

    /// Queues a request that awaits `replies` replies until `deadline`: its slot, for
    /// [`Replies::new`], and whether [`fail_late`] must be told (`sooner`): it sleeps until
    /// a later deadline, or until told.
    pub fn push(&mut self, replies: usize, deadline: Option<Instant>) -> (usize, bool) {
        let waits = State::Waits(None);
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot].state = waits;
                slot
            }
            None => {
                let got = Got::new();
                self.slots.push(Slot { got, state: waits });
                self.slots.len() - 1
            }
        };
        self.queue.push_back(Waiter {
            left: replies,
            deadline,
            slot: Some(slot),
        });
        let sooner = deadline.is_some_and(|at| self.armed.is_none_or(|armed| at < armed));
        if sooner {
            self.armed = deadline;
        }
        (slot, sooner)
    }

    /// Hands `reply`, the next one read, to the first request; once that request has all
    /// of its replies, its waker (in `woken`). An error when no request awaits one.
    pub fn reply(&mut self, reply: R, woken: &mut Woken) -> Result<(), &'static str> {
        let waiter = self.queue.front_mut().ok_or("a reply to no command")?;
        if let Some(slot) = waiter.slot {
            self.slots[slot].got.push(reply);
        }
        waiter.left -= 1;
        if waiter.left > 0 {
            return Ok(());
        }
        if let Some(Waiter {
            slot: Some(slot), ..
        }) = self.queue.pop_front()
            && let Some(waker) = self.answer(slot, Ok(()))
        {
            woken.push(waker);
        }
        Ok(())
    }

    /// Every request, failed with `error` (the connection broke): their wakers.
    pub fn fail_all(&mut self, error: &str) -> Woken {
        let failure = Failure::Failed(error.to_owned());
        let slots: SmallVec<[usize; 16]> = self.queue.drain(..).filter_map(|w| w.slot).collect();
        slots
            .into_iter()
            .filter_map(|slot| self.answer(slot, Err(failure.clone())))
            .collect()
    }

    /// Marks `slot` answered (released instead when its request's future is gone), and
    /// returns the waker of the request to wake.
    fn answer(&mut self, slot: usize, answer: Result<(), Failure>) -> Option<Waker> {
        let state = &mut self.slots[slot].state;
        match std::mem::replace(state, State::Answered(answer)) {
            State::Waits(waker) => waker,
            _ => {
                self.release(slot);
                None
            }
        }
    }

    fn release(&mut self, slot: usize) {
        let Slot { got, state } = &mut self.slots[slot];
        got.clear();
        *state = State::Free;
        self.free.push(slot);
    }

    /// The answer in `slot`, taken (the slot is released), or `Pending` with `waker` kept
    /// to wake when it comes.
    fn poll_slot(&mut self, slot: usize, waker: &Waker) -> Poll<Answer<R>> {
        let Slot { got, state } = &mut self.slots[slot];
        match state {
            State::Waits(kept) => {
                if !kept.as_ref().is_some_and(|kept| kept.will_wake(waker)) {
                    *kept = Some(waker.clone());
                }
                Poll::Pending
            }
            State::Answered(_) => {
                let State::Answered(answer) = std::mem::replace(state, State::Free) else {
                    unreachable!("matched as answered")
                };
                let answer = answer.map(|()| std::mem::take(got));
                got.clear();
                self.free.push(slot);
                Poll::Ready(answer)
            }
            State::Free | State::Abandoned => unreachable!("a slot is its future's until taken"),
        }
    }

    /// `slot`'s future is gone: its answer is dropped, or, when its replies are still
    /// to come, the slot is released once they have.
    fn abandon(&mut self, slot: usize) {
        match self.slots[slot].state {
            State::Waits(_) => self.slots[slot].state = State::Abandoned,
            _ => self.release(slot),
        }
    }

    /// The requests whose deadline is `now` or earlier, failed as late (they keep their
    /// places for their replies): their wakers, and the earliest deadline left, which
    /// [`fail_late`] sleeps until next. One pass over the queue (at most its connection's
    /// `MAX_WAITING` long): under steady load it runs about once a deadline's length, when
    /// the deadline it slept until belonged to a request answered since.
    fn expire(&mut self, now: Instant) -> (Woken, Option<Instant>) {
        let mut late = SmallVec::<[usize; 16]>::new();
        let mut earliest: Option<Instant> = None;
        for waiter in self.queue.iter_mut().filter(|w| w.slot.is_some()) {
            let Some(deadline) = waiter.deadline else {
                continue;
            };
            if deadline <= now {
                late.extend(waiter.slot.take());
            } else if earliest.is_none_or(|at| deadline < at) {
                earliest = Some(deadline);
            }
        }
        self.armed = earliest;
        let woken = late
            .into_iter()
            .filter_map(|slot| self.answer(slot, Err(Failure::Late)))
            .collect();
        (woken, earliest)
    }
}

/// A request's answer, taken from its slot of the connection's [`Waiting`].
#[must_use = "a request's answer comes when awaited"]
pub(super) struct Replies<'a, Q: Queue<R>, R> {
    queue: &'a Q,
    /// `None` once the answer is taken.
    slot: Option<usize>,
    answer: PhantomData<fn() -> R>,
}

impl<'a, Q: Queue<R>, R> Replies<'a, Q, R> {
    /// The answer of the request [`Waiting::push`] gave `slot`, in `queue`.
    pub fn new(queue: &'a Q, slot: usize) -> Replies<'a, Q, R> {
        Replies {
            queue,
            slot: Some(slot),
            answer: PhantomData,
        }
    }
}

/// The answer of the request [`Waiting::push`] gave `slot`, in `queue`, once the
/// connection's task is woken to write its commands (`work`) and, when its deadline comes
/// sooner than the one the timer sleeps until, the timer told (`sooner`).
pub(super) fn replies<'a, Q: Queue<R>, R>(
    queue: &'a Q,
    slot: usize,
    sooner: Option<&Notify>,
    work: &Notify,
) -> Replies<'a, Q, R> {
    // Taken back from the queue if the request goes away before its answer.
    let answer = Replies::new(queue, slot);
    sooner.inspect(|timer| timer.notify_one());
    work.notify_one();
    answer
}

impl<Q: Queue<R>, R> Future for Replies<'_, Q, R> {
    type Output = Answer<R>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer<R>> {
        let this = self.get_mut();
        let slot = this.slot.expect("a request's answer is taken once");
        let answer = this
            .queue
            .waiting(|waiting| waiting.poll_slot(slot, cx.waker()));
        if answer.is_ready() {
            this.slot = None;
        }
        answer
    }
}

impl<Q: Queue<R>, R> Drop for Replies<'_, Q, R> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.queue.waiting(|waiting| waiting.abandon(slot));
        }
    }
}

/// Fails each request of a connection once its deadline passes; never ends (the
/// connection's task drops it). `sooner` is notified when a request's deadline comes
/// before the one this sleeps until.
async fn fail_late<R>(queue: &impl Queue<R>, sooner: &Notify) {
    loop {
        let told = sooner.notified();
        let now = Instant::now();
        let (late, next) = queue.waiting(|waiting| waiting.expire(now));
        late.into_iter().for_each(Waker::wake);
        match next {
            Some(at) => {
                let _ = tokio::time::timeout_at(at.into(), told).await;
            }
            None => told.await,
        }
    }
}

/// Fails the requests still waiting when the connection's task ends or is dropped (its
/// runtime shut down), with the error `ended`.
struct Ending<'a, Q: Queue<R>, R> {
    queue: &'a Q,
    ended: &'a str,
    replies: PhantomData<fn() -> R>,
}

impl<Q: Queue<R>, R> Drop for Ending<'_, Q, R> {
    fn drop(&mut self) {
        let woken = self.queue.waiting(|waiting| waiting.fail_all(self.ended));
        woken.into_iter().for_each(Waker::wake);
    }
}

/// Runs a connection's task, `run`, with its deadline timer ([`fail_late`], whose
/// arguments these are beside it) until `run` ends; then, or when dropped, the requests
/// still waiting fail with the error `ended`.
pub(super) async fn with_deadlines<R>(
    queue: &impl Queue<R>,
    sooner: &Notify,
    ended: &str,
    run: impl Future<Output = ()>,
) {
    let _ending = Ending {
        queue,
        ended,
        replies: PhantomData,
    };
    tokio::select! {
        () = run => {}
        () = fail_late(queue, sooner) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    struct Locked(Mutex<Waiting<u32>>);

    impl Queue<u32> for Locked {
        fn waiting<T>(&self, f: impl FnOnce(&mut Waiting<u32>) -> T) -> T {
            f(&mut self.0.lock().unwrap())
        }
    }

    fn after(ms: u64) -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(ms))
    }

    /// What a request polled now would get.
    fn answer(waiting: &mut Waiting<u32>, slot: usize) -> Poll<Answer<u32>> {
        waiting.poll_slot(slot, Waker::noop())
    }

    fn got(values: &[u32]) -> Poll<Answer<u32>> {
        Poll::Ready(Ok(values.iter().copied().collect()))
    }

    #[test]
    fn replies_reach_their_requests_in_order_and_late_ones_keep_their_place() {
        let mut waiting: Waiting<u32> = Waiting::new();
        let mut woken = Woken::new();
        let (first, _) = waiting.push(2, after(60_000));
        let (second, _) = waiting.push(1, Some(Instant::now()));
        let (third, _) = waiting.push(1, None);
        assert!(answer(&mut waiting, first).is_pending());
        let (_, next) = waiting.expire(Instant::now());
        assert_eq!(
            answer(&mut waiting, second),
            Poll::Ready(Err(Failure::Late))
        );
        assert!(next.is_some() && next < after(60_001), "{next:?}");
        waiting.reply(1, &mut woken).unwrap();
        assert!(answer(&mut waiting, first).is_pending(), "one reply of two");
        waiting.reply(2, &mut woken).unwrap();
        assert_eq!(woken.len(), 1, "the first request polled, so it is woken");
        assert_eq!(answer(&mut waiting, first), got(&[1, 2]));
        // The late request's reply is read in its place and dropped.
        waiting.reply(3, &mut woken).unwrap();
        waiting.reply(4, &mut woken).unwrap();
        assert_eq!(answer(&mut waiting, third), got(&[4]));
        assert_eq!(waiting.reply(5, &mut woken), Err("a reply to no command"));
    }

    #[test]
    fn only_a_sooner_deadline_is_told_and_a_broken_connection_fails_every_request() {
        let mut waiting: Waiting<u32> = Waiting::new();
        let (slot, sooner) = waiting.push(1, after(1_000));
        assert!(sooner, "nothing armed yet");
        assert!(answer(&mut waiting, slot).is_pending());
        assert!(!waiting.push(1, after(2_000)).1, "later than armed");
        assert!(!waiting.push(1, None).1, "no deadline");
        assert!(waiting.push(1, after(10)).1, "a shorter grpc-timeout");
        let woken = waiting.fail_all("closed");
        assert_eq!(woken.len(), 1, "only the request that polled has a waker");
        assert!(waiting.is_empty());
        for slot in 0..4 {
            let failed = Poll::Ready(Err(Failure::Failed("closed".into())));
            assert_eq!(answer(&mut waiting, slot), failed);
        }
    }

    /// A request whose caller went away keeps its place until its replies come; only
    /// then is its slot given to another, and a taken answer's slot is reused at once.
    #[test]
    fn slots_are_reused_once_nobody_needs_them() {
        let queue = Locked(Mutex::new(Waiting::new()));
        let mut woken = Woken::new();
        let (gone, _) = queue.waiting(|w| w.push(1, None));
        drop(Replies::new(&queue, gone));
        let (next, _) = queue.waiting(|w| w.push(1, None));
        assert_ne!(next, gone, "the gone request's replies are still to come");
        queue.waiting(|w| w.reply(7, &mut woken)).unwrap();
        assert!(
            woken.is_empty(),
            "nobody waits for the gone request's reply"
        );
        assert_eq!(queue.waiting(|w| w.push(1, None)).0, gone);
        queue.waiting(|w| w.reply(8, &mut woken)).unwrap();
        assert_eq!(queue.waiting(|w| answer(w, next)), got(&[8]));
        assert_eq!(queue.waiting(|w| w.push(1, None)).0, next);
        assert_eq!(queue.waiting(|w| w.slots.len()), 2);
    }

    /// A request that goes late between two of its replies gets `Late`; its other reply
    /// is dropped in its place, and its slot comes back empty to the next request.
    #[test]
    fn a_late_requests_replies_are_dropped_and_its_slot_comes_back_empty() {
        let mut waiting: Waiting<u32> = Waiting::new();
        let mut woken = Woken::new();
        let (late, _) = waiting.push(2, after(60_000));
        waiting.reply(1, &mut woken).unwrap();
        waiting.expire(Instant::now() + Duration::from_secs(61));
        assert_eq!(answer(&mut waiting, late), Poll::Ready(Err(Failure::Late)));
        let (next, _) = waiting.push(1, None);
        assert_eq!(next, late, "the taken slot is reused");
        waiting.reply(2, &mut woken).unwrap();
        assert!(
            answer(&mut waiting, next).is_pending(),
            "2 was the late one's"
        );
        waiting.reply(3, &mut woken).unwrap();
        assert_eq!(answer(&mut waiting, next), got(&[3]));
    }

    /// The watcher fails a request with a short deadline queued behind one with a long
    /// deadline at its own time, and the long one only when its time comes.
    #[tokio::test]
    async fn the_watcher_fails_each_request_at_its_own_deadline() {
        let state = Arc::new(Locked(Mutex::new(Waiting::new())));
        let sooner = Arc::new(Notify::new());
        let watcher = {
            let (state, sooner) = (Arc::clone(&state), Arc::clone(&sooner));
            tokio::spawn(async move { fail_late(&*state, &sooner).await })
        };
        let queue = |ms| {
            let (slot, tell) = state.waiting(|w| w.push(1, after(ms)));
            if tell {
                sooner.notify_one();
            }
            Replies::new(&*state, slot)
        };
        let started = Instant::now();
        let (mut long, short) = (queue(2_000), queue(50));
        assert_eq!(short.await, Err(Failure::Late));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(waited < Duration::from_millis(2_000), "{waited:?}");
        let polled = futures_util::poll!(&mut long);
        assert!(polled.is_pending(), "still waiting");
        assert_eq!(long.await, Err(Failure::Late));
        assert!(started.elapsed() >= Duration::from_millis(2_000));
        watcher.abort();
    }

    /// When the connection's task goes (its runtime shuts down), the requests still
    /// waiting on it fail at once instead of waiting for ever.
    #[tokio::test]
    async fn requests_fail_when_the_connections_task_is_gone() {
        let state = Locked(Mutex::new(Waiting::new()));
        let sooner = Notify::new();
        let (slot, _) = state.waiting(|w| w.push(1, None));
        let task = with_deadlines(&state, &sooner, "the task ended", std::future::pending());
        let ran = tokio::time::timeout(Duration::from_millis(10), task).await;
        assert!(ran.is_err(), "the task runs until dropped");
        let failed = Err(Failure::Failed("the task ended".into()));
        assert_eq!(Replies::new(&state, slot).await, failed);
    }
}
