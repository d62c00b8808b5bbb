//! Deciding in one pass, for the requests most rules produce: each descriptor is matched
//! by at most one plain limit, so each can be counted and answered as soon as it is
//! matched. In process, with no plan in between; for a remote store, as a plan of one
//! item per descriptor, whose counters are listed as it is matched and which
//! [`PlanBody::decide`](super::PlanBody::decide) answers with the same function.
//!
//! Anything that needs the whole request before counting (a limit override, `replaces`,
//! a descriptor with several `rate_limits`, a refund, an unlimited rule, a statistics or counter
//! key that depends on the levels matched, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
//! reported policies, an unknown domain; for a remote store, also the local over-limit
//! cache) goes through the whole plan instead, which decides it alike: the statuses, the
//! statistics and the counters come from the same functions.

use smallvec::SmallVec;

use super::status::{direct_status, overall_code};
use super::{Applied, Direct, Increment, Item};
use crate::counting::counter_key::{CounterKey, Values};
use crate::counting::{CounterOp, Span};
use crate::engine::Engine;
use crate::model::request::{Descriptor, Request};
use crate::model::response::{DescriptorStatus, RateLimitHeaders, Response, Statuses};
use crate::rules::config::Limit;
use crate::rules::{Node, NodeId, NodeLimit};
use crate::stats::Nearest;
use crate::store::CounterStore;

/// Requests with more descriptors than this go through the plan.
const MAX_DESCRIPTORS: usize = 8;

/// A descriptor that no limit applies to.
const NO_LIMIT: NodeId = NodeId::MAX;

impl Engine {
    /// The rule whose one plain limit each descriptor of `request` matches (`NO_LIMIT`
    /// for none), or `None` when the request needs the plan (see the module's
    /// documentation).
    #[inline(always)]
    fn match_direct(&self, request: &Request) -> Option<[NodeId; MAX_DESCRIPTORS]> {
        if self.settings.stop_cache_key_increment_when_overlimit || self.settings.report_policies {
            return None;
        }
        let root = self.rules.domain(&request.domain)?;
        if request.descriptors.len() > MAX_DESCRIPTORS {
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
        Some(matched)
    }

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
        let matched = self.match_direct(request)?;
        let descriptors = request.descriptors.len();
        let mut statuses = Statuses::with_capacity(descriptors);
        let mut quotas = [false; MAX_DESCRIPTORS];
        let each = request.descriptor_hits().zip(&matched).zip(&mut quotas);
        for (((descriptor, addend), &id), quota) in each {
            if id == NO_LIMIT {
                statuses.push(DescriptorStatus::NO_LIMIT);
                *quota = self.settings.quota_mode;
                continue;
            }
            let (node, applied) = self.direct_limit(id);
            let (mut totals, mut counted) = ([0u64; 2], 0);
            self.for_each_direct_counter(request, descriptor, id, now_ms, |key, span| {
                totals[counted] = self.count(store, key, addend, span, applied.bound, now_ms);
                counted += 1;
            });
            let totals = &totals[..counted];
            let (status, _) = direct_status(self, node, &applied, addend, totals, now_ms);
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

    /// The items of `request` planned in one pass for a remote store, with their
    /// counters written over `increments` (whose key strings are reused), or `None`,
    /// having written nothing, when it needs the plan. [`PlanBody::decide`] decides them
    /// as [`Engine::decide_direct`] does.
    pub(super) fn plan_direct(
        &self,
        request: &Request,
        now_ms: u64,
        increments: &mut Vec<Increment>,
    ) -> Option<SmallVec<[Item; 4]>> {
        let matched = self.match_direct(request)?;
        let mut items = SmallVec::new();
        let mut used = 0;
        for ((descriptor, addend), &node) in request.descriptor_hits().zip(&matched) {
            if node == NO_LIMIT {
                items.push(self.no_limit());
                continue;
            }
            let first = used;
            self.for_each_direct_counter(request, descriptor, node, now_ms, |key, span| {
                Increment::put(increments, used, (key, addend, span, now_ms));
                used += 1;
            });
            let counters = u8::try_from(used - first).expect("a limit has at most two counters");
            items.push(Item::Direct(Direct {
                node,
                counters,
                addend,
            }));
        }
        increments.truncate(used);
        Some(items)
    }

    /// Calls `f(counter, span)` for each counter of `descriptor`, which matched `id`'s
    /// one plain limit: counted under the limit's identity and the entries' values as
    /// they are (see `direct`), with no per-level key to work out.
    #[inline(always)]
    fn for_each_direct_counter(
        &self,
        request: &Request,
        descriptor: &Descriptor,
        id: NodeId,
        now_ms: u64,
        f: impl FnMut(&CounterKey<'_>, Span),
    ) {
        let limit = &self.rules.node(id).limits[0];
        let parts = (limit.identity, Values::Of(&descriptor.entries));
        let source = super::Source::Node(id, 0);
        let at = (limit.counting, now_ms);
        self.for_each_counter_of(&request.domain, descriptor, source, parts, at, f);
    }

    /// The rule `id` and its one plain limit, counting in the rule's statistics.
    #[inline(always)]
    pub(super) fn direct_limit(&self, id: NodeId) -> (&Node, Applied<'_>) {
        let node = self.rules.node(id);
        let stats = node.limits[0]
            .stats
            .as_deref()
            .expect("counted limits have statistics");
        (node, self.applied_node(node, 0, stats))
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
            CounterOp::Acquire(lease) => {
                let in_use = store.acquire(key, lease, hits, now_ms);
                (in_use, Some(in_use))
            }
            CounterOp::Release(lease) => (store.release(key, lease, now_ms), None),
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
