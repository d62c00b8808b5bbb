//! Each Envoy's recent demand per bucket, shared by the streams of this process, from
//! which a bucket's quota is split ([`ratelimit_core::shares`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An Envoy whose last report is older than this no longer takes part in the split
/// (Envoy reports every 5 s).
const ACTIVE: Duration = Duration::from_secs(15);

/// Demands by bucket (its canonical id), then by stream.
#[derive(Debug)]
pub struct Demands {
    buckets: Mutex<HashMap<Arc<str>, Vec<Demand>>>,
    max_buckets: usize,
}

#[derive(Debug, Clone, Copy)]
struct Demand {
    stream: u64,
    /// Requests per second (allowed and denied), in thousandths.
    milli_rate: u64,
    at: Instant,
}

impl Demands {
    /// No demand yet; at most `max_buckets` buckets are tracked.
    pub fn new(max_buckets: usize) -> Demands {
        Demands {
            buckets: Mutex::new(HashMap::new()),
            max_buckets,
        }
    }

    /// Records that `stream` asked for `requests` over `elapsed` in `bucket`; `false` when
    /// the bucket is new and the bound on buckets is reached.
    pub fn report(&self, bucket: &Arc<str>, stream: u64, requests: u64, elapsed: Duration) -> bool {
        let seconds = elapsed.as_secs_f64().max(0.001);
        let milli_rate = (requests as f64 * 1_000.0 / seconds) as u64;
        let mut buckets = self.lock();
        let now = Instant::now();
        if !buckets.contains_key(bucket) && buckets.len() >= self.max_buckets {
            buckets.retain(|_, demands| {
                demands.retain(|d| now.duration_since(d.at) < ACTIVE);
                !demands.is_empty()
            });
            if buckets.len() >= self.max_buckets {
                return false;
            }
        }
        let demands = buckets.entry(Arc::clone(bucket)).or_default();
        let demand = Demand {
            stream,
            milli_rate,
            at: now,
        };
        match demands.iter_mut().find(|d| d.stream == stream) {
            Some(known) => *known = demand,
            None => demands.push(demand),
        }
        true
    }

    /// The demands of the Envoys active on `bucket` (`stream` always among them, with no
    /// demand if it never reported), and the place of `stream` in the list.
    pub fn active(&self, bucket: &str, stream: u64) -> (Vec<u64>, usize) {
        let buckets = self.lock();
        let now = Instant::now();
        let mut active: Vec<(u64, u64)> = buckets
            .get(bucket)
            .into_iter()
            .flatten()
            .filter(|d| d.stream == stream || now.duration_since(d.at) < ACTIVE)
            .map(|d| (d.stream, d.milli_rate))
            .collect();
        if !active.iter().any(|(s, _)| *s == stream) {
            active.push((stream, 0));
        }
        active.sort_unstable();
        let place = active.iter().position(|(s, _)| *s == stream).unwrap_or(0);
        (active.into_iter().map(|(_, rate)| rate).collect(), place)
    }

    /// `stream` ended: its demands leave every bucket in `buckets`.
    pub fn leave<'a>(&self, stream: u64, buckets: impl IntoIterator<Item = &'a Arc<str>>) {
        let mut all = self.lock();
        for bucket in buckets {
            if let Some(demands) = all.get_mut(bucket) {
                demands.retain(|d| d.stream != stream);
                if demands.is_empty() {
                    all.remove(bucket);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Vec<Demand>>> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demands_are_per_bucket_and_leave_with_their_stream() {
        let demands = Demands::new(2);
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        assert!(demands.report(&a, 7, 50, Duration::from_secs(5)));
        assert!(demands.report(&a, 3, 10, Duration::from_secs(5)));
        assert!(demands.report(&b, 7, 1, Duration::from_secs(1)));
        assert_eq!(demands.active("a", 7), (vec![2_000, 10_000], 1));
        assert_eq!(demands.active("b", 3), (vec![0, 1_000], 0));
        assert!(
            !demands.report(&"c".into(), 7, 1, Duration::from_secs(1)),
            "the bound on buckets"
        );
        demands.leave(7, [&a, &b]);
        assert_eq!(demands.active("a", 3), (vec![2_000], 0));
        assert!(demands.report(&"c".into(), 7, 1, Duration::from_secs(1)));
    }
}
