//! One Envoy's `StreamRateLimitQuotas` stream: its usage reports feed the demands and
//! the rules' statistics, and each of its buckets gets an assignment, re-sent with every
//! report (which keeps it from expiring), refilled at every window and whenever more
//! quota is granted, and abandoned when a reload removes the bucket's rule.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::BlanketRule;
use ratelimit_core::{Entry, QuotaLimit, QuotaRule, shares};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::Shared;
use super::assign::{Assignment, Grant, abandon, actions};
use ratelimit_service_kit::clock::unix_now_ms;

/// How often windows are checked for their end, and the rules for a reload.
const TICK: Duration = Duration::from_millis(100);
/// Buckets one stream may hold.
const MAX_BUCKETS_PER_STREAM: usize = 10_000;
/// Entries of a bucket id, and bytes of each key or value.
const MAX_BUCKET_ENTRIES: usize = 32;
const MAX_BUCKET_TEXT: usize = 1_024;
/// A stream that reports nothing for this many assignment TTLs is ended (every
/// assignment it was sent has expired in its Envoy by then): idle streams do not hold
/// places under RLQS_MAX_STREAMS. Envoy opens a new one with its next report.
const IDLE_TTLS: u32 = 4;
/// What Envoy's report interval is taken to be when a report does not say.
const DEFAULT_ELAPSED: Duration = Duration::from_secs(5);

/// One bucket of the stream.
struct Bucket {
    id: BucketId,
    entries: Vec<Entry>,
    grant: Grant,
}

/// One Envoy's stream.
pub struct EnvoyStream {
    id: u64,
    shared: Arc<Shared>,
    domain: Option<String>,
    buckets: HashMap<Arc<str>, Bucket>,
    generation: u64,
}

impl EnvoyStream {
    pub fn new(id: u64, shared: Arc<Shared>) -> EnvoyStream {
        let generation = shared.service.limiter.config_generation();
        EnvoyStream {
            id,
            shared,
            domain: None,
            buckets: HashMap::new(),
            generation,
        }
    }

    /// Serves the stream until Envoy ends it or stops listening.
    pub async fn run(
        mut self,
        mut reports: Streaming<RateLimitQuotaUsageReports>,
        out: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let idle = self.shared.ttl * IDLE_TTLS;
        let mut last_report = tokio::time::Instant::now();
        loop {
            let answer = tokio::select! {
                report = reports.message() => match report {
                    Ok(Some(report)) => {
                        last_report = tokio::time::Instant::now();
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
                () = tokio::time::sleep_until(last_report + idle) => {
                    tracing::debug!(stream = self.id, "RLQS stream ended: no report for {idle:?}");
                    self.shared.stats.streams_idle.add(1);
                    break;
                }
                () = out.closed() => break,
            };
            let sent = match answer {
                Ok(actions) if actions.is_empty() => continue,
                Ok(bucket_action) => out.send(Ok(RateLimitQuotaResponse { bucket_action })).await,
                Err(status) => {
                    tracing::warn!(%status, stream = self.id, "RLQS stream refused");
                    let _ = out.send(Err(status)).await;
                    break;
                }
            };
            if sent.is_err() {
                break;
            }
        }
        self.shared.demands.leave(self.id, self.buckets.keys());
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
            self.domain = Some(report.domain);
        }
        let mut out = Vec::new();
        for usage in report.bucket_quota_usages {
            self.shared.stats.reports.add(1);
            let Some((key, entries)) = canonical(usage.bucket_id.as_ref())? else {
                continue;
            };
            self.check_counts(&usage)?;
            let known = self.buckets.contains_key(&key);
            let requests = usage.num_requests_allowed + usage.num_requests_denied;
            let elapsed = usage
                .time_elapsed
                .and_then(|d| {
                    let seconds = u64::try_from(d.seconds).ok()?;
                    let nanos = u32::try_from(d.nanos).ok()?;
                    Some(Duration::new(seconds, nanos.min(999_999_999)))
                })
                .filter(|d| !d.is_zero())
                .unwrap_or(DEFAULT_ELAPSED);
            if (!known && self.buckets.len() >= MAX_BUCKETS_PER_STREAM)
                || !self.shared.demands.report(&key, self.id, requests, elapsed)
            {
                self.shared.stats.buckets_refused.add(1);
                tracing::warn!(
                    bucket = %key,
                    "RLQS bucket refused: too many buckets; Envoy keeps its no_assignment_behavior"
                );
                continue;
            }
            self.buckets
                .entry(Arc::clone(&key))
                .or_insert_with(|| Bucket {
                    id: usage.bucket_id.clone().unwrap_or_default(),
                    entries,
                    grant: Grant::default(),
                });
            out.extend(self.assign(&key, Some(&usage)).await);
        }
        Ok(out)
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
    async fn assign(
        &mut self,
        key: &Arc<str>,
        usage: Option<&BucketQuotaUsage>,
    ) -> Vec<BucketAction> {
        let now_ms = unix_now_ms();
        let domain = self.domain.as_deref().unwrap_or_default();
        let Some(bucket) = self.buckets.get(key) else {
            return Vec::new();
        };
        let rule = match self
            .shared
            .service
            .limiter
            .quota_rule(domain, &bucket.entries, now_ms)
        {
            Ok(rule) => rule,
            Err(error) => {
                tracing::warn!(%error, "RLQS bucket not assigned");
                return Vec::new();
            }
        };
        let (allowed, denied) =
            usage.map_or((0, 0), |u| (u.num_requests_allowed, u.num_requests_denied));
        let refresh = usage.is_some();
        let ttl = self.shared.ttl;
        let (assignment, fresh) = match rule {
            QuotaRule::NotConfigured => {
                let was_limited = matches!(
                    bucket.grant.sent,
                    Some(Assignment::Tokens(_) | Assignment::Blanket(BlanketRule::DenyAll))
                );
                if was_limited {
                    let bucket = self.buckets.remove(key).expect("looked up above");
                    self.shared.demands.leave(self.id, [key]);
                    self.shared.stats.abandoned.add(1);
                    return vec![abandon(&bucket.id)];
                }
                (Assignment::Blanket(BlanketRule::AllowAll), false)
            }
            QuotaRule::Unlimited => (Assignment::Blanket(BlanketRule::AllowAll), false),
            QuotaRule::Denied => (Assignment::Blanket(BlanketRule::DenyAll), false),
            QuotaRule::Limited(limit) if limit.shadow => {
                self.count_shadow(&limit, allowed, denied).await;
                (Assignment::Blanket(BlanketRule::AllowAll), false)
            }
            QuotaRule::Limited(limit) => {
                limit.count_usage(allowed, denied, 0);
                self.limited(key, &limit, (allowed, denied)).await
            }
        };
        let Some(bucket) = self.buckets.get_mut(key) else {
            return Vec::new();
        };
        let changed = bucket.grant.sent != Some(assignment) || fresh;
        if !changed && !refresh {
            return Vec::new();
        }
        bucket.grant.sent = Some(assignment);
        self.shared.stats.assignments.add(1);
        actions(&bucket.id, assignment, fresh, ttl)
    }

    /// A limited bucket, and whether the Envoy's token bucket must start full:
    /// - at the start of a window (and for a new bucket), the Envoy's share is reserved
    ///   and becomes a full bucket (less what Envoy admitted before its first assignment);
    /// - when a report says the Envoy denied requests (its bucket ran dry) and its share
    ///   grew (demand moved, or a reload raised the limit), what more the counter gives
    ///   becomes a new full bucket (what was left of the old one, none or nearly, is
    ///   dropped);
    /// - when a reload lowered the limit, the bucket shrinks to what the new share leaves
    ///   after the usage reported in the window (Envoy scales what it holds by the same
    ///   ratio), or denies everything;
    /// - otherwise the same bucket is sent again, and Envoy keeps counting it down.
    async fn limited(
        &mut self,
        key: &Arc<str>,
        limit: &QuotaLimit,
        (allowed, denied): (u64, u64),
    ) -> (Assignment, bool) {
        let per_unit = u64::from(limit.requests_per_unit);
        let (demands, me) = self.shared.demands.active(key, self.id);
        // A quarter of the limit is split evenly among the active Envoys, the rest by demand.
        let floor = per_unit / (4 * demands.len() as u64).max(1);
        let share = shares(per_unit, &demands, floor)[me];
        let Some(bucket) = self.buckets.get_mut(key) else {
            return (Assignment::Blanket(BlanketRule::DenyAll), false);
        };
        let grant = &mut bucket.grant;
        let new_window = grant.enter_window(limit.window_end_ms);
        grant.used += allowed;
        let lowered = grant
            .requests_per_unit
            .is_some_and(|before| limit.requests_per_unit < before);
        grant.requests_per_unit = Some(limit.requests_per_unit);
        let sent = grant.sent;
        if lowered && !new_window {
            grant.granted = grant.granted.min(share);
            return match share.saturating_sub(grant.used) {
                0 => (Assignment::Blanket(BlanketRule::DenyAll), false),
                left => (Assignment::Tokens(clamp(left)), false),
            };
        }
        let start = new_window || sent.is_none();
        let ran_dry = denied > 0 && grant.granted < share;
        if !start && !ran_dry {
            return (
                sent.unwrap_or(Assignment::Blanket(BlanketRule::DenyAll)),
                false,
            );
        }
        let want = share - grant.granted.min(share);
        let got = self.reserve(key, limit, want).await;
        let Some(bucket) = self.buckets.get_mut(key) else {
            return (Assignment::Blanket(BlanketRule::DenyAll), false);
        };
        bucket.grant.granted += got;
        // A bucket's first report counts what Envoy admitted before any assignment: it
        // comes out of the first grant.
        let tokens = match sent {
            None => got.saturating_sub(allowed),
            Some(_) => got,
        };
        match (tokens, sent) {
            (0, Some(sent)) if !start => (sent, false),
            (0, _) => (Assignment::Blanket(BlanketRule::DenyAll), false),
            (tokens, _) => (Assignment::Tokens(clamp(tokens)), true),
        }
    }

    /// Reserves up to `want` of the window's quota in the rule's counter; what it gives.
    async fn reserve(&self, key: &str, limit: &QuotaLimit, want: u64) -> u64 {
        if want == 0 {
            return 0;
        }
        let mut counter = limit.counter.clone();
        counter.hits = want;
        match self.shared.service.backend.add(&counter).await {
            Ok(total) => {
                let over = total.saturating_sub(u64::from(limit.requests_per_unit));
                want - want.min(over)
            }
            Err(error) => {
                self.shared.stats.reserve_failed.add(1);
                tracing::warn!(%error, bucket = %key, "RLQS quota could not be reserved");
                0
            }
        }
    }

    /// Shadow mode: usage is counted in the rule's counter, and what went past the limit
    /// in the statistics; nothing is enforced.
    async fn count_shadow(&self, limit: &QuotaLimit, allowed: u64, denied: u64) {
        if allowed == 0 && denied == 0 {
            return;
        }
        let mut counter = limit.counter.clone();
        counter.hits = allowed;
        let over = match self.shared.service.backend.add(&counter).await {
            Ok(total) => {
                let before = total.saturating_sub(allowed);
                allowed - allowed.min(u64::from(limit.requests_per_unit).saturating_sub(before))
            }
            Err(error) => {
                self.shared.stats.reserve_failed.add(1);
                tracing::warn!(%error, "RLQS shadow-mode usage could not be counted");
                0
            }
        };
        limit.count_usage(allowed, denied, over);
    }
}

fn clamp(tokens: u64) -> u32 {
    u32::try_from(tokens).unwrap_or(u32::MAX)
}

/// A bucket's canonical key (entries sorted by key, joined) and its entries.
type Canonical = (Arc<str>, Vec<Entry>);

/// A bucket id's canonical key (entries sorted by key) and entries; `None` for a usage
/// without a bucket id.
fn canonical(id: Option<&BucketId>) -> Result<Option<Canonical>, Status> {
    let Some(id) = id else {
        return Err(Status::invalid_argument("a bucket usage has no bucket_id"));
    };
    if id.bucket.len() > MAX_BUCKET_ENTRIES {
        return Err(Status::invalid_argument(format!(
            "a bucket_id has {} entries; at most {MAX_BUCKET_ENTRIES} are accepted",
            id.bucket.len()
        )));
    }
    let mut entries: Vec<Entry> = Vec::with_capacity(id.bucket.len());
    for (key, value) in &id.bucket {
        if key.len() > MAX_BUCKET_TEXT || value.len() > MAX_BUCKET_TEXT {
            return Err(Status::invalid_argument(format!(
                "a bucket_id entry is longer than {MAX_BUCKET_TEXT} bytes"
            )));
        }
        entries.push(Entry {
            key: key.clone(),
            value: value.clone(),
        });
    }
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    if entries.is_empty() {
        return Ok(None);
    }
    let mut canonical = String::new();
    for entry in &entries {
        canonical.push_str(&entry.key);
        canonical.push('\u{1f}');
        canonical.push_str(&entry.value);
        canonical.push('\u{1e}');
    }
    Ok(Some((canonical.into(), entries)))
}
