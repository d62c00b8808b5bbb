//! Envoy's Rate Limit Quota Service on the same rules: which rule a bucket id means, the
//! counter that reserves quota for its window, and the rule's statistics for the usage
//! Envoy reports.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Increment, Item, Plan, PlanBody, Source};
use crate::counting::counter_key::{CounterId, limit_identity};
use crate::counting::{CounterOp, Counting};
use crate::engine::Engine;
use crate::model::request::{Descriptor, Entry, Request};
use crate::rules::unit::Window;
use crate::stats::RuleStats;

/// What the rules say about one RLQS bucket.
#[derive(Debug)]
pub enum QuotaRule {
    /// No rule of the domain matches any of its entries (or the domain is unknown).
    NotConfigured,
    /// The rule it matches has no limit (`unlimited`, or none at that depth): every
    /// request is allowed.
    Unlimited,
    /// `requests_per_unit: 0`: every request is denied.
    Denied,
    /// A counted limit.
    Limited(Box<QuotaLimit>),
}

/// A bucket's limit in the window that contains the time it was asked at.
#[derive(Debug)]
pub struct QuotaLimit {
    /// The bucket as the descriptor the rules matched.
    pub descriptor: Descriptor,
    /// Requests per window.
    pub requests_per_unit: u32,
    /// The window.
    pub window: Window,
    /// Unix milliseconds at which the window ends.
    pub window_end_ms: u64,
    /// Shadow mode: the limit is counted, never enforced.
    pub shadow: bool,
    /// The window's counter (the rule's own key, as ShouldRateLimit counts it); quota
    /// handed to Envoys is reserved by adding to it.
    pub counter: Increment,
    /// The window's count of reports that showed denials: above 0, the window is skewed
    /// and Envoys give back what their demand does not need ([`crate::grants`]).
    pub skew: Increment,
    stats: Option<Arc<RuleStats>>,
    engine: Arc<Engine>,
}

impl QuotaLimit {
    /// Counts usage an Envoy reported in the rule's statistics: `allowed` within the
    /// limit, `denied` over it. In shadow mode nothing is denied; `over` of the allowed
    /// hits went past the limit and are counted as over limit and as shadow mode.
    pub fn count_usage(&self, allowed: u64, denied: u64, over: u64) {
        let Some(stats) = &self.stats else { return };
        let over = over.min(allowed);
        stats.within_limit.add(allowed - over);
        stats.add_not_within(denied + over);
        stats.over_limit.add(denied + over);
        if self.shadow {
            stats.shadow_mode.add(over);
        }
    }
}

impl QuotaLimit {
    /// `op` of `hits` on the window's counter.
    pub fn quota(&self, op: CounterOp, hits: u64) -> Increment {
        Increment {
            op,
            hits,
            ..self.counter.clone()
        }
    }

    /// Adds `hits` to the window's skew count (reads it with 0).
    pub fn skewed(&self, hits: u64) -> Increment {
        let op = if hits == 0 {
            CounterOp::Read
        } else {
            CounterOp::Add
        };
        Increment {
            op,
            hits,
            ..self.skew.clone()
        }
    }

    /// The plan that runs `increments` (this limit's counters), run as a decision's plan
    /// is (a remote store's deadline, breakers and error statistic); the caller reads the
    /// totals itself instead of [`Plan::decide`].
    pub fn plan(&self, increments: Vec<Increment>) -> Plan {
        Plan {
            engine: Arc::clone(&self.engine),
            body: PlanBody {
                dry: true,
                now_ms: self.counter.now_ms,
                items: SmallVec::new(),
                increments,
            },
        }
    }
}

impl Engine {
    /// The rule of bucket `bucket` (its id's key, value pairs) in `domain` at `now_ms`.
    pub(crate) fn quota_rule(
        self: &Arc<Self>,
        domain: &str,
        bucket: &[Entry],
        now_ms: u64,
    ) -> QuotaRule {
        let Some(root) = self.rules.domain(domain) else {
            return QuotaRule::NotConfigured;
        };
        let entries = self.rules.bucket_entries(root, bucket);
        if entries.is_empty() {
            return QuotaRule::NotConfigured;
        }
        let descriptor = Descriptor {
            entries,
            limit: None,
            hits_addend: None,
            negative_hits: false,
        };
        let request = Request::new(domain, vec![descriptor]);
        let body = self.match_request(&request, now_ms, false);
        // The first limit of the descriptor (a `rate_limits` list is served by its first).
        let Some(Item::Limited(limited)) = body.items.first() else {
            return QuotaRule::Unlimited;
        };
        let Source::Node(id, which) = limited.source else {
            return QuotaRule::Unlimited;
        };
        let applied = self.applied(limited);
        let (requests_per_unit, window) = (applied.requests_per_unit, applied.window);
        if requests_per_unit == 0 && !applied.shadow {
            return QuotaRule::Denied;
        }
        let limit = &self.rules.node(id).limits[usize::from(which)];
        // Whatever the rule's algorithm, quota is handed out per window of its length. A
        // fixed window shares ShouldRateLimit's counter; another algorithm's window gets
        // a counter of its own.
        let start = window.start(now_ms / 1_000);
        let descriptor = &request.descriptors[0];
        let (identity, values) = self.counter_parts(domain, descriptor, limited.source);
        let mut key = String::new();
        let identity = match applied.counting {
            Counting::FixedWindow(_) => {
                self.write_key(
                    &mut key,
                    domain,
                    descriptor,
                    &values,
                    limited.source,
                    Some(start),
                );
                identity
            }
            _ => {
                self.write_entries(&mut key, domain, descriptor, &values);
                key.push_str(itoa::Buffer::new().format(start));
                key.push_str("_rlqs");
                let keys = descriptor.entries.iter().map(|e| e.key.as_str());
                limit_identity(&self.settings.cache_key_prefix, domain, keys, "rlqs")
            }
        };
        let id = CounterId::new(identity, start, &values);
        let window_end = start + window.seconds();
        let keys = descriptor.entries.iter().map(|e| e.key.as_str());
        let skew_identity =
            limit_identity(&self.settings.cache_key_prefix, domain, keys, "rlqs_skew");
        let skew = Increment {
            key: format!("{key}_skew"),
            id: CounterId::new(skew_identity, start, &values),
            hits: 0,
            op: CounterOp::Read,
            window,
            window_end,
            expires: window_end,
            now_ms,
        };
        let counter = Increment {
            key,
            id,
            hits: 0,
            op: CounterOp::Add,
            window,
            window_end,
            expires: window_end,
            now_ms,
        };
        let stats = limited.stats.clone().or_else(|| limit.stats.clone());
        let [descriptor] =
            <[Descriptor; 1]>::try_from(request.descriptors).expect("one descriptor was planned");
        QuotaRule::Limited(Box::new(QuotaLimit {
            descriptor,
            requests_per_unit,
            window,
            window_end_ms: window_end.saturating_mul(1_000),
            shadow: applied.shadow,
            counter,
            skew,
            stats,
            engine: Arc::clone(self),
        }))
    }
}
