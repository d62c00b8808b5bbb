//! The global tier without a callout per request (`global.report_interval_ms`): a
//! request is decided from what the rate limit service last reported for each
//! descriptor (its limit and the fleet's count, kept in shared data for every worker)
//! plus the hits this worker admitted since, and every interval each worker reports
//! its hits, one `ShouldRateLimit` per descriptor with `hits_addend`, whose answer
//! (`current_limit`, `limit_remaining`, `duration_until_reset`) is the new fleet count.
//! It speaks plain RLS, so the service may be the sidecar or envoyproxy/ratelimit.

use std::collections::HashMap;

use ratelimit_core::{Code, Descriptor};
use ratelimit_proto as proto;

use crate::slots::{SharedData, SlotCounters};

/// Descriptors a worker holds unreported hits for, at most; a request past it asks the
/// service with a callout instead.
pub const MAX_PENDING_KEYS: usize = 10_000;

/// This worker's hits not yet reported, by descriptor.
#[derive(Debug, Default)]
pub struct Pending {
    hits: HashMap<String, (Descriptor, u64)>,
}

impl Pending {
    /// Hits pending for `key`.
    pub fn get(&self, key: &str) -> u64 {
        self.hits.get(key).map_or(0, |(_, hits)| *hits)
    }

    /// Adds `hits` for `descriptor`, named `key`; `false` (nothing added) when the worker
    /// already holds [`MAX_PENDING_KEYS`] others.
    pub fn add(&mut self, key: &str, descriptor: &Descriptor, hits: u64) -> bool {
        if let Some((_, pending)) = self.hits.get_mut(key) {
            *pending = pending.saturating_add(hits);
            return true;
        }
        if self.hits.len() >= MAX_PENDING_KEYS {
            return false;
        }
        let mut descriptor = descriptor.clone();
        descriptor.hits_addend = None;
        self.hits.insert(key.to_owned(), (descriptor, hits));
        true
    }

    /// Whether the descriptors named `keys` all fit: the worker holds them already, or
    /// has room for the new ones.
    pub fn fits(&self, keys: &[String]) -> bool {
        let new = keys
            .iter()
            .filter(|k| !self.hits.contains_key(k.as_str()))
            .count();
        self.hits.len() + new <= MAX_PENDING_KEYS
    }

    /// Every descriptor with hits to report, with them: the worker holds none after.
    pub fn take(&mut self) -> Vec<(String, Descriptor, u64)> {
        self.hits
            .drain()
            .filter(|(_, (_, hits))| *hits > 0)
            .map(|(key, (descriptor, hits))| (key, descriptor, hits))
            .collect()
    }
}

/// The name of `descriptor` of `domain` in shared data.
pub fn fleet_key(domain: &str, descriptor: &Descriptor) -> String {
    let mut key = format!("fleet/{domain}");
    for entry in &descriptor.entries {
        key.push('/');
        key.push_str(&entry.key);
        key.push('=');
        key.push_str(&entry.value);
    }
    key
}

/// A descriptor's limit and the fleet's count, as the service last reported them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    pub limit: u64,
    pub used: u64,
}

/// Whether a request of `hits` passes, with `pending` hits of this worker unreported.
/// A descriptor the service never reported on passes (its first report tells).
pub fn admits(known: Option<Known>, pending: u64, hits: u64) -> bool {
    known.is_none_or(|k| k.used.saturating_add(pending).saturating_add(hits) <= k.limit)
}

/// What a report's answer says of its one descriptor, and for how many seconds: `None`
/// when the service has no limit for it.
pub fn known_from(response: &proto::RateLimitResponse) -> Option<(Known, u64)> {
    let status = response.statuses.first()?;
    let limit = u64::from(status.current_limit.as_ref()?.requests_per_unit);
    let remaining = u64::from(status.limit_remaining);
    let over = proto::client::code_from_pb(status.code) == Code::OverLimit;
    let used = match over {
        true => limit.saturating_add(1),
        false => limit.saturating_sub(remaining),
    };
    let seconds = status
        .duration_until_reset
        .as_ref()
        .map_or(1, |d| d.seconds.max(1));
    Some((Known { limit, used }, u64::try_from(seconds).unwrap_or(1)))
}

impl<S: SharedData> SlotCounters<S> {
    /// What the service last reported for `key`, unless it has expired by `now`.
    pub fn known(&self, key: &str, now: u64) -> Option<Known> {
        // The limit is kept plus one, so that a limit of 0 is told from none.
        let limit = self.value(&format!("{key}#limit"), now).checked_sub(1)?;
        let used = self.value(&format!("{key}#used"), now);
        Some(Known { limit, used })
    }

    /// Keeps `known` for `key` until unix second `until`.
    pub fn put_known(&self, key: &str, known: Known, until: u64, now: u64) {
        self.set_value(&format!("{key}#used"), known.used, until, now);
        self.set_value(&format!("{key}#limit"), known.limit + 1, until, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::MemoryShared;

    fn descriptor(user: &str) -> Descriptor {
        Descriptor::new([("user", user)])
    }

    #[test]
    fn pending_hits_are_taken_once_and_bounded() {
        let mut pending = Pending::default();
        assert!(pending.add("a", &descriptor("a").with_hits(3), 3));
        assert!(pending.add("a", &descriptor("a"), 1));
        assert_eq!(pending.get("a"), 4);
        let taken = pending.take();
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[0].0.as_str(), taken[0].2), ("a", 4));
        assert_eq!(taken[0].1.hits_addend, None, "the report sets its own");
        assert_eq!(pending.get("a"), 0);
        assert!(pending.take().is_empty());
        for i in 0..MAX_PENDING_KEYS {
            assert!(pending.add(&i.to_string(), &descriptor("x"), 1));
        }
        assert!(!pending.add("one more", &descriptor("x"), 1));
        assert!(!pending.fits(&["one more".to_owned()]));
        assert!(pending.fits(&["0".to_owned()]));
    }

    #[test]
    fn a_request_passes_while_the_fleet_and_this_worker_stay_within_the_limit() {
        let known = Some(Known { limit: 5, used: 3 });
        assert!(admits(None, 100, 1), "never reported: pass");
        assert!(admits(known, 1, 1));
        assert!(!admits(known, 2, 1));
        assert!(!admits(Some(Known { limit: 0, used: 0 }), 0, 1));
    }

    #[test]
    fn what_the_service_reported_is_kept_in_shared_data_until_the_window_ends() {
        let shared = MemoryShared::default();
        let slots = SlotCounters::new(&shared, 64);
        let key = fleet_key("fleet", &descriptor("gina"));
        assert_eq!(key, "fleet/fleet/user=gina");
        assert_eq!(slots.known(&key, 100), None);
        slots.put_known(&key, Known { limit: 0, used: 1 }, 160, 100);
        assert_eq!(slots.known(&key, 159), Some(Known { limit: 0, used: 1 }));
        assert_eq!(slots.known(&key, 160), None, "the window ended");
    }

    #[test]
    fn an_answer_gives_the_limit_and_the_count() {
        use proto::rate_limit_response::{DescriptorStatus, RateLimit};
        let answer = |code: Code, remaining: u32| proto::RateLimitResponse {
            overall_code: proto::client::code_to_pb(code) as i32,
            statuses: vec![DescriptorStatus {
                code: proto::client::code_to_pb(code) as i32,
                current_limit: Some(RateLimit {
                    requests_per_unit: 10,
                    ..Default::default()
                }),
                limit_remaining: remaining,
                duration_until_reset: Some(proto::Duration {
                    seconds: 42,
                    nanos: 0,
                }),
            }],
            ..Default::default()
        };
        let ok = known_from(&answer(Code::Ok, 4)).unwrap();
        assert_eq!(ok, (Known { limit: 10, used: 6 }, 42));
        let over = known_from(&answer(Code::OverLimit, 0)).unwrap();
        assert_eq!(over.0.used, 11, "over: more than the limit");
        assert_eq!(known_from(&proto::RateLimitResponse::default()), None);
    }
}
