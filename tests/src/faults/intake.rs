//! The intake under faults: callers post batches, each with an `Idempotency-Key` of its
//! own, to one replica or spread over several, and retry a 503, a 409 (the key still in
//! flight) or a dropped connection with the same key (after a dropped connection, on the
//! next replica); the checker reads the topic back: every batch answered 2xx is on it
//! exactly once, no batch answered only 4xx is on it, and one that ended unsure (503,
//! dropped) is on it at most once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::load::now_us;

/// One batch and every answer it got, in order.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Its id: the quantity of its one operation, unique in the run.
    pub id: u64,
    /// `(sent, answered, status)` of each attempt (µs since the epoch).
    pub attempts: Vec<(u64, u64, u16)>,
}

impl Batch {
    /// The last answer's status.
    pub fn last(&self) -> u16 {
        self.attempts.last().map_or(0, |a| a.2)
    }
}

/// The running senders; [`Senders::stop`] returns every batch.
pub struct Senders {
    shared: Arc<Shared>,
    callers: Vec<JoinHandle<Vec<Batch>>>,
}

/// What the callers share: whether to stop, and the posts in flight to each replica.
struct Shared {
    stop: AtomicBool,
    in_flight: Vec<AtomicUsize>,
}

/// The batch of id `id`: one sale of `id` units.
fn body(id: u64) -> String {
    format!(r#"[{{"operation":"sell","unit-cost":1.00,"quantity":{id}}}]"#)
}

impl Senders {
    /// `callers` callers posting to `urls` (each `…/operations` of a replica), caller
    /// `n` to the `n`th (round the list); each retries a 503, a dropped connection or a
    /// 409 (its key still in flight) every 200 ms with the same key for up to
    /// `retry_for`, and after a dropped connection on the next replica.
    pub fn start(urls: &[String], callers: u64, retry_for: Duration) -> Senders {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            in_flight: urls.iter().map(|_| AtomicUsize::new(0)).collect(),
        });
        let callers = (0..callers)
            .map(|caller| {
                let (shared, urls) = (Arc::clone(&shared), urls.to_vec());
                tokio::spawn(async move {
                    let client = reqwest::Client::builder()
                        .timeout(Duration::from_secs(30))
                        .build()
                        .unwrap();
                    let home = usize::try_from(caller).unwrap() % urls.len();
                    let mut batches = Vec::new();
                    for n in 1.. {
                        if shared.stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let id = caller * 1_000_000 + n;
                        let to = (&urls[..], home);
                        batches.push(send(&client, &shared, to, id, retry_for).await);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    batches
                })
            })
            .collect();
        Senders { shared, callers }
    }

    /// How many posts to the `replica`th of the urls are waiting for their answer.
    pub fn in_flight(&self, replica: usize) -> usize {
        self.shared.in_flight[replica].load(Ordering::Relaxed)
    }

    /// Stops the callers once their batches are done; every batch.
    pub async fn stop(self) -> Vec<Batch> {
        self.shared.stop.store(true, Ordering::Relaxed);
        let mut batches = Vec::new();
        for caller in self.callers {
            batches.extend(caller.await.expect("a caller ran to the end"));
        }
        batches
    }
}

/// No answer at all (the connection dropped or refused): as unsure as a 503.
pub const DROPPED: u16 = 599;

/// Posts batch `id` to `urls[home]` until it gets an answer other than 503, 409 or
/// none, or `retry_for` passes; after no answer, to the next of `urls`.
async fn send(
    client: &reqwest::Client,
    shared: &Shared,
    (urls, home): (&[String], usize),
    id: u64,
    retry_for: Duration,
) -> Batch {
    let first = Instant::now();
    let mut batch = Batch {
        id,
        attempts: Vec::new(),
    };
    let mut at = home;
    loop {
        let sent = now_us();
        shared.in_flight[at].fetch_add(1, Ordering::Relaxed);
        let answer = client
            .post(&urls[at])
            .header("content-type", "application/json")
            .header("idempotency-key", format!("batch-{id}"))
            .body(body(id))
            .send()
            .await;
        shared.in_flight[at].fetch_sub(1, Ordering::Relaxed);
        let status = answer.map_or(DROPPED, |a| a.status().as_u16());
        batch.attempts.push((sent, now_us(), status));
        if !matches!(status, 503 | 409 | DROPPED) || first.elapsed() >= retry_for {
            return batch;
        }
        if status == DROPPED {
            at = (at + 1) % urls.len();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the topic held.
#[derive(Clone, Debug, Default)]
pub struct Checked {
    /// Batches sent.
    pub batches: usize,
    /// Answered 2xx in the end (each on the topic once).
    pub accepted: usize,
    /// Retried after a 503 before their 2xx.
    pub retried: usize,
    /// Answered only 4xx (none on the topic).
    pub refused: usize,
    /// Ended on a 503 (on the topic at most once).
    pub unsure: usize,
    /// Of those, on the topic.
    pub unsure_on_topic: usize,
}

/// The ids of the batches in `values` (the topic's message values).
pub fn ids_on_topic(values: &[Vec<u8>]) -> Vec<u64> {
    let mut ids = Vec::new();
    for value in values {
        let json: serde_json::Value = serde_json::from_slice(value).expect("a JSON message");
        collect_quantities(&json, &mut ids);
    }
    ids
}

fn collect_quantities(value: &serde_json::Value, out: &mut Vec<u64>) {
    match value {
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_quantities(v, out)),
        serde_json::Value::Object(map) => {
            if let Some(q) = map.get("quantity").and_then(serde_json::Value::as_u64) {
                out.push(q);
            }
            map.values().for_each(|v| collect_quantities(v, out));
        }
        _ => {}
    }
}

/// Checks the batches whose last answer came after `since` (µs) against the ids on the
/// topic (a broker restarted on memory storage has lost what it held before). No batch
/// may be on the topic twice, whatever it was answered: a batch answered 503 and then
/// 2xx on its retry with the same key is held to exactly once like any other.
pub fn check_topic(
    batches: &[Batch],
    on_topic: &[u64],
    since: u64,
) -> Result<Checked, Vec<String>> {
    let mut count: HashMap<u64, usize> = HashMap::new();
    for id in on_topic {
        *count.entry(*id).or_default() += 1;
    }
    let mut checked = Checked::default();
    let mut broken = Vec::new();
    for batch in batches
        .iter()
        .filter(|b| b.attempts.last().is_some_and(|a| a.1 >= since))
    {
        checked.batches += 1;
        let times = count.get(&batch.id).copied().unwrap_or(0);
        let unsure_before = batch.attempts.iter().any(|a| a.2 == 503 || a.2 == DROPPED);
        let (ok, what) = match batch.last() {
            200..=299 => {
                checked.accepted += 1;
                checked.retried += usize::from(unsure_before);
                (times == 1, "answered 2xx: exactly once")
            }
            400..=499 if !unsure_before => {
                checked.refused += 1;
                (times == 0, "answered 4xx: not at all")
            }
            _ => {
                checked.unsure += 1;
                checked.unsure_on_topic += usize::from(times > 0);
                (times <= 1, "unsure (503): at most once")
            }
        };
        if !ok && broken.len() < 20 {
            broken.push(format!(
                "batch {} on the topic {times} times; {what}: {batch:?}",
                batch.id
            ));
        }
    }
    if broken.is_empty() {
        Ok(checked)
    } else {
        Err(broken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(id: u64, statuses: &[u16]) -> Batch {
        Batch {
            id,
            attempts: statuses.iter().map(|s| (1, 2, *s)).collect(),
        }
    }

    #[test]
    fn a_batch_retried_after_a_503_may_not_be_on_the_topic_twice() {
        let retried = [batch(7, &[503, 202])];
        let broken = check_topic(&retried, &[7, 7], 0).unwrap_err();
        assert!(broken[0].contains("on the topic 2 times"), "{broken:?}");
        let checked = check_topic(&retried, &[7], 0).unwrap();
        assert_eq!((checked.accepted, checked.retried), (1, 1));
    }

    #[test]
    fn answers_bound_how_often_a_batch_is_on_the_topic() {
        let batches = [batch(1, &[202]), batch(2, &[400]), batch(3, &[503, 503])];
        let checked = check_topic(&batches, &[1, 3], 0).unwrap();
        assert_eq!((checked.refused, checked.unsure_on_topic), (1, 1));
        assert!(check_topic(&batches, &[], 0).is_err(), "a 2xx batch lost");
        assert!(
            check_topic(&batches, &[1, 2], 0).is_err(),
            "a 4xx batch on it"
        );
        assert!(
            check_topic(&batches, &[1, 3, 3], 0).is_err(),
            "a 503 batch twice"
        );
    }
}
