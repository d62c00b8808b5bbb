//! One Envoy's `StreamRateLimitQuotas` stream: its usage reports feed the rules'
//! statistics and the share policy, and each of its buckets gets an assignment, re-sent
//! with every report (which keeps it from expiring), refilled at every window and
//! whenever its share changes, and abandoned when a reload removes the bucket's rule.
//! Answers are split under [`budget::MAX_ANSWER_BYTES`] and wait for a slow reader only so long.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use ratelimit_service_kit::clock::unix_now_ms;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::assign::Grant;
use super::bucket::{self, Bucket, Told, Usage, canonical};
use super::budget::{self, MAX_STREAM_BUCKETS, MAX_STREAM_BYTES, Queued, bucket_cost};
use super::{Nudge, Shared};

/// How often windows are checked for their end, and the rules for a reload.
const TICK: Duration = Duration::from_millis(100);
/// A stream that reports nothing for this many assignment TTLs is ended (every
/// assignment it was sent has expired in its Envoy by then): idle streams do not hold
/// places under RLQS_MAX_STREAMS. Envoy opens a new one with its next report.
const IDLE_TTLS: u32 = 4;
/// What Envoy's report interval is taken to be when a report does not say.
const DEFAULT_ELAPSED: Duration = Duration::from_secs(5);
/// Nudges from other streams waiting to be looked at (more are dropped).
const NUDGES: usize = 64;

/// One Envoy's stream.
pub struct EnvoyStream {
    id: u64,
    shared: Arc<Shared>,
    domain: Option<String>,
    buckets: HashMap<Arc<str>, Bucket>,
    /// The buckets' bytes ([`bucket_cost`]).
    bytes: usize,
    generation: u64,
    /// Where other streams nudge this one about a bucket they share, and (until the stream
    /// runs) the nudges.
    nudges: mpsc::Sender<Nudge>,
    nudged: Option<mpsc::Receiver<Nudge>>,
}

impl EnvoyStream {
    pub fn new(id: u64, shared: Arc<Shared>) -> EnvoyStream {
        let generation = shared.service.limiter.config_generation();
        let (nudges, nudged) = mpsc::channel(NUDGES);
        EnvoyStream {
            id,
            shared,
            domain: None,
            buckets: HashMap::new(),
            bytes: 0,
            generation,
            nudges,
            nudged: Some(nudged),
        }
    }

    /// Serves the stream until Envoy ends it, stops listening or stops reading.
    pub async fn run(
        mut self,
        mut reports: Streaming<RateLimitQuotaUsageReports>,
        out: mpsc::Sender<Queued>,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let idle = self.shared.ttl * IDLE_TTLS;
        let mut last_report = Instant::now();
        let mut nudged = self.nudged.take().expect("a stream runs once");
        loop {
            let answer = tokio::select! {
                report = reports.message() => match report {
                    Ok(Some(report)) => {
                        last_report = Instant::now();
                        self.on_report(report).await
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, stream = self.id, "RLQS stream ended");
                        break;
                    }
                },
                // Only a stream with buckets has windows and reloads to follow.
                _ = tick.tick(), if !self.buckets.is_empty() => Ok(self.on_tick().await),
                Some(nudge) = nudged.recv() => Ok(self.on_nudge(nudge).await),
                () = tokio::time::sleep_until(last_report + idle) => {
                    tracing::debug!(stream = self.id, "RLQS stream ended: no report for {idle:?}");
                    self.shared.stats.streams_idle.add(1);
                    break;
                }
                () = out.closed() => break,
            };
            let delivered = match answer {
                Ok(actions) => self.deliver(&out, actions).await,
                Err(status) => {
                    tracing::warn!(%status, stream = self.id, "RLQS stream refused");
                    let refused = out.send((Err(status), None));
                    let _ = tokio::time::timeout(self.shared.ttl, refused).await;
                    break;
                }
            };
            if !delivered {
                break;
            }
        }
        self.end();
    }

    /// Queues `actions` in answers of at most [`budget::MAX_ANSWER_BYTES`], each holding its bytes
    /// of the process's queue until the reader takes it; `false` when the stream must end:
    /// the reader is gone, or took nothing for an assignment TTL (a reader that does not
    /// read must not make the service hold answers for it).
    async fn deliver(&self, out: &mpsc::Sender<Queued>, actions: Vec<BucketAction>) -> bool {
        if actions.is_empty() {
            return true;
        }
        let answers = budget::answers(actions);
        if answers.len() > 1 {
            self.shared.stats.answers_split.add(1);
        }
        let until = Instant::now() + self.shared.ttl;
        for answer in answers {
            let queue = Arc::clone(&self.shared.queue);
            let size = budget::queued_size(&answer);
            let queued = async move {
                let permit = queue.acquire_many_owned(size).await.ok()?;
                out.send((Ok(answer), Some(permit))).await.ok()
            };
            match tokio::time::timeout_at(until, queued).await {
                Ok(Some(())) => {}
                Ok(None) => return false,
                Err(_) => {
                    self.shared.stats.streams_slow.add(1);
                    tracing::warn!(
                        stream = self.id,
                        "RLQS stream ended: its reader took no answer for {:?}",
                        self.shared.ttl
                    );
                    return false;
                }
            }
        }
        true
    }

    async fn on_report(
        &mut self,
        report: RateLimitQuotaUsageReports,
    ) -> Result<Vec<BucketAction>, Status> {
        if self.domain.is_none() {
            if report.domain.is_empty() {
                return Err(Status::invalid_argument(
                    "the first usage report of a stream must name its domain",
                ));
            }
            self.shared.count_stream(&report.domain, true);
            self.domain = Some(report.domain);
        }
        let mut out = Vec::new();
        for usage in report.bucket_quota_usages {
            self.shared.stats.reports.add(1);
            let Some((key, entries)) = canonical(usage.bucket_id.as_ref())? else {
                continue;
            };
            self.check_counts(&usage)?;
            if !self.buckets.contains_key(&key) && !self.hold(&key, entries, &usage) {
                continue;
            }
            let elapsed = usage
                .time_elapsed
                .and_then(|d| {
                    let seconds = u64::try_from(d.seconds).ok()?;
                    let nanos = u32::try_from(d.nanos).ok()?;
                    Some(Duration::new(seconds, nanos.min(999_999_999)))
                })
                .filter(|d| !d.is_zero())
                .unwrap_or(DEFAULT_ELAPSED);
            let usage = Usage {
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
                elapsed,
            };
            out.extend(self.assign(&key, Some(usage)).await);
        }
        Ok(out)
    }

    /// Takes a new bucket into the stream, within the stream's and the process's bounds on
    /// buckets and bytes; `false` when it is refused.
    fn hold(
        &mut self,
        key: &Arc<str>,
        entries: Vec<ratelimit_core::Entry>,
        usage: &BucketQuotaUsage,
    ) -> bool {
        let id = usage.bucket_id.clone().unwrap_or_default();
        let cost = bucket_cost(&id);
        let fits = self.buckets.len() < MAX_STREAM_BUCKETS && self.bytes + cost <= MAX_STREAM_BYTES;
        if !fits || !self.shared.budget.take(cost) {
            self.shared.stats.buckets_refused.add(1);
            tracing::warn!(
                bucket_bytes = cost,
                stream_bytes = self.bytes,
                "RLQS bucket refused: too many buckets or bytes held; Envoy keeps its no_assignment_behavior"
            );
            return false;
        }
        self.bytes += cost;
        let bucket = Bucket {
            id,
            entries,
            grant: Grant::default(),
            cost,
        };
        self.buckets.insert(Arc::clone(key), bucket);
        self.shared.holds(key, self.id, Some(&self.nudges));
        true
    }

    /// Refuses a usage whose counts are past MAX_HITS_ADDEND, as `ShouldRateLimit` refuses
    /// such an addend: a report cannot count more hits at once than a request may.
    fn check_counts(&self, usage: &BucketQuotaUsage) -> Result<(), Status> {
        let bound = self
            .shared
            .service
            .limiter
            .settings()
            .bounds
            .max_hits_addend;
        let counts = [usage.num_requests_allowed, usage.num_requests_denied];
        if counts.iter().all(|&count| count <= bound) {
            return Ok(());
        }
        self.shared.stats.usage_refused.add(1);
        Err(Status::invalid_argument(format!(
            "a bucket usage reports {} allowed and {} denied requests; at most {bound} \
             (MAX_HITS_ADDEND) are accepted",
            counts[0], counts[1]
        )))
    }

    /// Windows that ended, and every bucket again after a reload.
    async fn on_tick(&mut self) -> Vec<BucketAction> {
        let now_ms = unix_now_ms();
        let generation = self.shared.service.limiter.config_generation();
        let reloaded = generation != self.generation;
        self.generation = generation;
        let due: Vec<Arc<str>> = self
            .buckets
            .iter()
            .filter(|(_, b)| {
                reloaded || (b.grant.window_end_ms != 0 && b.grant.window_end_ms <= now_ms)
            })
            .map(|(k, _)| Arc::clone(k))
            .collect();
        let mut out = Vec::new();
        for key in due {
            out.extend(self.assign(&key, None).await);
        }
        out
    }

    /// The actions for bucket `key` now, after `usage` when a report brought one.
    async fn assign(&mut self, key: &Arc<str>, usage: Option<Usage>) -> Vec<BucketAction> {
        let domain = self.domain.as_deref().unwrap_or_default();
        let Some(bucket) = self.buckets.get_mut(key) else {
            return Vec::new();
        };
        match bucket::assign(&self.shared, domain, key, bucket, usage, unix_now_ms()).await {
            Told::Actions(actions) => {
                if bucket.grant.short {
                    self.shared
                        .nudge(key, self.id, &Nudge::Give(Arc::clone(key)));
                }
                actions
            }
            Told::Abandoned(action) => {
                self.shared.holds(key, self.id, None);
                if let Some(bucket) = self.buckets.remove(key) {
                    self.bytes -= bucket.cost;
                    self.shared.budget.give(bucket.cost);
                }
                vec![action]
            }
        }
    }

    /// Another stream's nudge about a bucket both hold: an Envoy joined it short of its
    /// even share (this one gives back what it surely has not spent above its own, and
    /// says so), or quota was given back (this one takes it if it started short).
    async fn on_nudge(&mut self, nudge: Nudge) -> Vec<BucketAction> {
        let (key, give) = match nudge {
            Nudge::Give(key) => (key, true),
            Nudge::Take(key) => (key, false),
        };
        let domain = self.domain.as_deref().unwrap_or_default();
        let Some(bucket) = self.buckets.get_mut(&key) else {
            return Vec::new();
        };
        if !give && !bucket.grant.short {
            return Vec::new();
        }
        let now_ms = unix_now_ms();
        let (actions, moved) =
            bucket::shift(&self.shared, domain, &key, bucket, give, now_ms).await;
        if give && moved > 0 {
            self.shared
                .nudge(&key, self.id, &Nudge::Take(Arc::clone(&key)));
        }
        actions
    }

    /// The stream ended: what its Envoy will not spend goes back to the windows' counters
    /// and its buckets leave the budget, at once ([`bucket::leave`]).
    fn end(self) {
        let Some(domain) = self.domain else { return };
        self.shared.count_stream(&domain, false);
        for key in self.buckets.keys() {
            self.shared.holds(key, self.id, None);
        }
        let shared = Arc::clone(&self.shared);
        tokio::spawn(bucket::leave(shared, domain, self.buckets));
    }
}
