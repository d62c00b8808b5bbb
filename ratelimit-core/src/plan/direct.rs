//! The in-process decision in one pass, for the requests most rules produce: each
//! descriptor is matched by at most one plain limit, so each can be counted and answered
//! as soon as it is matched, with no plan in between.
//!
//! Anything that needs the whole request before counting (a limit override, `replaces`,
//! a descriptor with several `rate_limits`, a refund, an unlimited rule, a statistics or counter
//! key that depends on the levels matched, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
//! reported policies, an unknown domain) goes through the plan instead, which decides it
//! alike: the statuses, the statistics and the counters come from the same functions.

use super::decision::{count_hits, overall_code};
use crate::config::Limit;
use crate::counter_key::{CounterKey, Values};
use crate::counting::{CounterOp, Span};
use crate::engine::Engine;
use crate::request::Request;
use crate::response::{DescriptorStatus, RateLimitHeaders, Response, Statuses};
use crate::rules::{Node, NodeId, NodeLimit};
use crate::stats::Nearest;
use crate::store::CounterStore;

/// Requests with more descriptors than this go through the plan.
const MAX_DESCRIPTORS: usize = 8;

/// A descriptor that no limit applies to.
const NO_LIMIT: NodeId = NodeId::MAX;

impl Engine {
    /// Decides `request` against `store` at `now_ms` in one pass, or `None`, having
    /// counted nothing, when it needs the plan (see the module's documentation).
    pub(crate) fn decide_direct<S>(
        &self,
        request: &Request,
        store: &S,
        now_ms: u64,
    ) -> Option<Response>
    where
        S: CounterStore + ?Sized,
    {
        if self.settings.stop_cache_key_increment_when_overlimit || self.settings.report_policies {
            return None;
        }
        let root = self.rules.domain(&request.domain)?;
        let descriptors = request.descriptors.len();
        if descriptors > MAX_DESCRIPTORS {
            return None;
        }
        let mut matched = [NO_LIMIT; MAX_DESCRIPTORS];
        for (node, descriptor) in matched.iter_mut().zip(&request.descriptors) {
            if descriptor.limit.is_some() || descriptor.negative_hits {
                return None;
            }
            let Some(id) = self.rules.find(root, &descriptor.entries, |_, _, _| {}) else {
                continue;
            };
            match &*self.rules.node(id).limits {
                [] => {}
                [limit] if direct(self.rules.node(id), limit) => *node = id,
                _ => return None,
            }
        }

        let default_addend = u64::from(request.hits_addend.max(1));
        let ratio = self.settings.near_limit_ratio;
        let mut statuses = Statuses::with_capacity(descriptors);
        let mut quotas = [false; MAX_DESCRIPTORS];
        for ((descriptor, &id), quota) in request.descriptors.iter().zip(&matched).zip(&mut quotas)
        {
            if id == NO_LIMIT {
                statuses.push(DescriptorStatus::NO_LIMIT);
                *quota = self.settings.quota_mode;
                continue;
            }
            let node = self.rules.node(id);
            let limit = &node.limits[0];
            let source = super::Source::Node(id, 0);
            let stats = limit
                .stats
                .as_deref()
                .expect("counted limits have statistics");
            let applied = self.applied_node(node, 0, stats);
            let addend = descriptor.hits_addend.unwrap_or(default_addend);
            // A direct limit counts under its identity and the entries' values as they are
            // (see `direct`): no per-level key to work out.
            let (mut totals, mut counted) = ([0u64; 2], 0);
            let parts = (limit.identity, Values::Of(&descriptor.entries));
            let at = (applied.counting, now_ms);
            self.for_each_counter_of(&request.domain, descriptor, source, parts, at, {
                |key, span| {
                    totals[counted] = self.count(store, key, addend, span, applied.bound, now_ms);
                    counted += 1;
                }
            });
            let totals = &totals[..counted];
            let assessed = applied
                .counting
                .assess(totals, addend, applied.bound, now_ms);
            let mut status = count_hits(&applied, addend, assessed, ratio);
            status.metadata.clone_from(&node.metadata);
            statuses.push(status);
            *quota = applied.quota;
        }
        Some(Response {
            overall_code: overall_code(self, &statuses, &quotas[..descriptors], false),
            headers: RateLimitHeaders::choose(&statuses, |i| quotas[i]),
            statuses,
            policies: Vec::new(),
        })
    }

    /// Runs the op of `span` with `hits` on the counter `key` in `store` and returns what
    /// the store reports; a counter at three quarters of `bound` or more is offered to the
    /// nearest-counters list.
    #[inline(always)]
    pub(crate) fn count<S>(
        &self,
        store: &S,
        key: &CounterKey<'_>,
        hits: u64,
        span: Span,
        bound: u64,
        now_ms: u64,
    ) -> u64
    where
        S: CounterStore + ?Sized,
    {
        let now = now_ms / 1_000;
        let (count, used) = match span.op {
            CounterOp::Add => {
                let count = store.increment(key, hits, span.expires, now);
                (count, Some(count))
            }
            CounterOp::Read => (store.get(key, now), None),
            CounterOp::Refund => (store.decrement(key, hits, span.expires, now), None),
            CounterOp::GcraRefund(bucket) => (store.gcra_refund(key, bucket, hits, now_ms), None),
            CounterOp::Gcra(bucket) => {
                let next = store.gcra(key, bucket, hits, now_ms);
                (next, Some(bucket.used(next, now_ms)))
            }
        };
        if let Some(used) = used {
            let bound = u32::try_from(bound).unwrap_or(u32::MAX);
            if Nearest::is_near(used, bound) {
                let (nearest, end) = (self.stats.nearest(), span.start + span.window.seconds());
                key.with_text(|text| nearest.observe(text, used, bound, end));
            }
        }
        count
    }
}

/// Whether a request matching `node`, whose one limit is `limit`, can be decided in one
/// pass: the limit is counted, replaces nothing, and its keys do not depend on the levels
/// matched.
fn direct(node: &Node, limit: &NodeLimit) -> bool {
    matches!(limit.limit, Limit::Counted { .. })
        && limit.replaces.is_empty()
        && !node.per_level_stats_key
        && !node.per_level_cache_key
}
