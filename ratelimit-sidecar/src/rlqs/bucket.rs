//! One bucket of a stream: the id Envoy sent, the rule it maps onto, and the assignment
//! it gets from the core's share policy ([`ratelimit_core::grants`]), with the counter
//! work done by [`super::reserve`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::BlanketRule;
use ratelimit_core::grants::{self, Moment, Split, Tokens};
use ratelimit_core::{Entry, QuotaLimit, QuotaRule};
use tonic::Status;

use super::assign::{Assignment, Grant, abandon, actions};
use super::reserve;
use super::{Nudge, Shared};

/// Entries of a bucket id, and bytes of each key or value.
const MAX_BUCKET_ENTRIES: usize = 32;
const MAX_BUCKET_TEXT: usize = 1_024;

/// One bucket of a stream.
pub struct Bucket {
    pub id: BucketId,
    pub entries: Vec<Entry>,
    pub grant: Grant,
    /// Its bytes in the stream's and the process's budget.
    pub cost: usize,
}

/// What a report said about a bucket.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub allowed: u64,
    pub denied: u64,
    pub elapsed: Duration,
}

/// What a bucket's Envoy is told.
pub enum Told {
    /// These actions (none: nothing new).
    Actions(Vec<BucketAction>),
    /// Its rule is gone: the bucket is abandoned and leaves the stream.
    Abandoned(BucketAction),
}

/// The actions for `bucket` (canonical key `key`) of a stream of `domain` at `now_ms`,
/// after `usage` when a report brought one.
pub async fn assign(
    shared: &Shared,
    domain: &str,
    key: &Arc<str>,
    bucket: &mut Bucket,
    usage: Option<Usage>,
    now_ms: u64,
) -> Told {
    let limiter = &shared.service.limiter;
    let rule = match limiter.quota_rule(domain, &bucket.entries, now_ms) {
        Ok(rule) => rule,
        Err(error) => {
            tracing::warn!(%error, "RLQS bucket not assigned");
            return Told::Actions(Vec::new());
        }
    };
    let (allowed, denied) = usage.map_or((0, 0), |u| (u.allowed, u.denied));
    let allow_all = (Assignment::Blanket(BlanketRule::AllowAll), false);
    let (assignment, fresh) = match rule {
        QuotaRule::NotConfigured => {
            let was_limited = matches!(
                bucket.grant.sent,
                Some(Assignment::Tokens(_) | Assignment::Blanket(BlanketRule::DenyAll))
            );
            if was_limited {
                shared.stats.abandoned.add(1);
                return Told::Abandoned(abandon(&bucket.id));
            }
            allow_all
        }
        QuotaRule::Unlimited => allow_all,
        QuotaRule::Denied => (Assignment::Blanket(BlanketRule::DenyAll), false),
        QuotaRule::Limited(limit) if limit.shadow => {
            reserve::count_shadow(shared, key, &limit, (allowed, denied)).await;
            allow_all
        }
        QuotaRule::Limited(limit) => {
            limit.count_usage(allowed, denied, 0);
            let split = Split {
                limit: u64::from(limit.requests_per_unit),
                envoys: shared.envoys(domain),
            };
            limited(shared, key, &mut bucket.grant, &limit, split, usage, now_ms).await
        }
    };
    let changed = bucket.grant.sent != Some(assignment) || fresh;
    if !changed && usage.is_none() {
        return Told::Actions(Vec::new());
    }
    bucket.grant.sent = Some(assignment);
    shared.stats.assignments.add(1);
    Told::Actions(actions(&bucket.id, assignment, fresh, shared.ttl))
}

/// A limited bucket's assignment, and whether Envoy's token bucket starts anew: at a
/// window's start and for a new bucket, after a report (which may reserve more or give
/// some back), or after a reload that lowered the limit; otherwise the same bucket is
/// sent again and Envoy goes on counting it down.
async fn limited(
    shared: &Shared,
    key: &str,
    grant: &mut Grant,
    limit: &QuotaLimit,
    split: Split,
    usage: Option<Usage>,
    now_ms: u64,
) -> (Assignment, bool) {
    let new_window = grant.enter_window(limit.window_end_ms, now_ms);
    let (allowed, denied) = usage.map_or((0, 0), |u| (u.allowed, u.denied));
    let elapsed = usage.map_or(0, |u| {
        u64::try_from(u.elapsed.as_millis()).unwrap_or(u64::MAX)
    });
    if usage.is_some() {
        grant.report(allowed, denied, elapsed, now_ms);
    }
    let lowered = grant
        .requests_per_unit
        .is_some_and(|before| limit.requests_per_unit < before);
    grant.requests_per_unit = Some(limit.requests_per_unit);
    if lowered && !new_window {
        return told(grants::lowered(split, &mut grant.holding), grant.sent);
    }
    let moment = match usage {
        _ if new_window || grant.sent.is_none() => Moment::Start,
        Some(_) => {
            let need = grant.need(allowed.saturating_add(denied), elapsed, now_ms);
            let denied = grants::denials(grant.holding, denied);
            Moment::Report { denied, need }
        }
        None => return told(Tokens::Same, grant.sent),
    };
    let ask = grants::ask(split, grant.holding, moment);
    let ran_dry = matches!(moment, Moment::Report { denied, .. } if denied > 0);
    let done = reserve::run(shared, key, limit, ask, ran_dry).await;
    let tokens = grants::settle(&mut grant.holding, moment, ask, done);
    grant.short = moment == Moment::Start && grant.holding.granted < split.even();
    told(tokens, grant.sent)
}

/// Moves quota of `bucket` for a joiner at `now_ms`, within the window its grant is for:
/// `give` back what its Envoy surely has not spent above the even share
/// ([`Moment::Joined`]), or take up to it ([`Moment::TopUp`]); either counts from what the
/// Envoy is projected to have admitted since its last report. The actions, and how much
/// moved.
pub async fn shift(
    shared: &Shared,
    domain: &str,
    key: &str,
    bucket: &mut Bucket,
    give: bool,
    now_ms: u64,
) -> (Vec<BucketAction>, u64) {
    let rule = shared
        .service
        .limiter
        .quota_rule(domain, &bucket.entries, now_ms);
    let grant = &mut bucket.grant;
    let Ok(QuotaRule::Limited(limit)) = rule else {
        return (Vec::new(), 0);
    };
    if limit.shadow || grant.sent.is_none() || grant.window_end_ms != limit.window_end_ms {
        return (Vec::new(), 0);
    }
    let split = Split {
        limit: u64::from(limit.requests_per_unit),
        envoys: shared.envoys(domain),
    };
    let spent = grant.spent(now_ms);
    let moment = if give {
        Moment::Joined { spent }
    } else {
        Moment::TopUp { spent }
    };
    let ask = grants::ask(split, grant.holding, moment);
    let done = reserve::run(shared, key, &limit, ask, false).await;
    let tokens = grants::settle(&mut grant.holding, moment, ask, done);
    let (assignment, fresh) = told(tokens, grant.sent);
    if !give {
        grant.short = grant.holding.granted < split.even();
    }
    if done == 0 {
        return (Vec::new(), 0);
    }
    grant.sent = Some(assignment);
    shared.stats.assignments.add(1);
    (actions(&bucket.id, assignment, fresh, shared.ttl), done)
}

/// The assignment for `tokens` after `sent`, and whether it starts a new bucket. A resize
/// never grows the bucket: Envoy scales what it has left by the new size over the old, so
/// a larger size would hand out more than it had.
fn told(tokens: Tokens, sent: Option<Assignment>) -> (Assignment, bool) {
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let deny = Assignment::Blanket(BlanketRule::DenyAll);
    match tokens {
        Tokens::Same => (sent.unwrap_or(deny), false),
        Tokens::Fresh(0) | Tokens::Scaled(0) => (deny, false),
        Tokens::Fresh(n) => (Assignment::Tokens(clamp(n)), true),
        Tokens::Scaled(n) => match sent {
            Some(Assignment::Tokens(size)) => (Assignment::Tokens(clamp(n).min(size)), false),
            _ => (Assignment::Tokens(clamp(n)), false),
        },
    }
}

/// An ended stream's buckets leave the process's budget now: each at once, or as soon
/// as what its Envoy surely will not spend in the window has gone back to the window's
/// counter (and a joiner that started short may take it). That is projected from its
/// last report's rate to when its assignment expires in the Envoy (`ttl` later, had it
/// lived on), so nothing is held until then.
pub async fn leave(shared: Arc<Shared>, domain: String, buckets: HashMap<Arc<str>, Bucket>) {
    let now_ms = ratelimit_service_kit::clock::unix_now_ms();
    let ttl_ms = u64::try_from(shared.ttl.as_millis()).unwrap_or(u64::MAX);
    let mut owed = Vec::new();
    for (key, bucket) in buckets {
        match owed_back(&shared, &domain, &bucket, now_ms, ttl_ms) {
            Some((limit, unspent)) => owed.push((key, limit, unspent, bucket.cost)),
            None => shared.budget.give(bucket.cost),
        }
    }
    for (key, limit, unspent, cost) in owed {
        if reserve::give_back(&shared, &key, &limit, unspent).await {
            shared.nudge(&key, u64::MAX, &Nudge::Take(Arc::clone(&key)));
        }
        shared.budget.give(cost);
    }
}

/// What the Envoy of `bucket` (of an ended stream of `domain`) surely will not spend in
/// its window by the time its assignment expires (`ttl_ms` after `now_ms`), and the
/// window's limit it goes back to; `None` when nothing does.
fn owed_back(
    shared: &Shared,
    domain: &str,
    bucket: &Bucket,
    now_ms: u64,
    ttl_ms: u64,
) -> Option<(QuotaLimit, u64)> {
    if !matches!(bucket.grant.sent, Some(Assignment::Tokens(_))) {
        return None;
    }
    let rule = shared
        .service
        .limiter
        .quota_rule(domain, &bucket.entries, now_ms);
    let Ok(QuotaRule::Limited(limit)) = rule else {
        return None;
    };
    if limit.shadow || limit.window_end_ms != bucket.grant.window_end_ms {
        return None;
    }
    let expires_ms = now_ms.saturating_add(ttl_ms).min(limit.window_end_ms);
    let unspent = bucket.grant.unspent(expires_ms);
    (unspent > 0).then_some((*limit, unspent))
}

/// A bucket's canonical key (entries sorted by key, joined) and its entries.
pub type Canonical = (Arc<str>, Vec<Entry>);

/// A bucket id's canonical key (entries sorted by key) and entries; `None` for a bucket
/// id without entries.
pub fn canonical(id: Option<&BucketId>) -> Result<Option<Canonical>, Status> {
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
