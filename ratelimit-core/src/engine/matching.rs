//! Which rule applies to each descriptor of a request, and which counters it needs.

use smallvec::SmallVec;

use super::keys::override_stats_key;
use super::{Applied, Increment, Item, Limited, PlanBody, PlanBuffers, Source};
use crate::engine::Engine;
use crate::model::request::Request;
use crate::rules::Node;
use crate::rules::config::Limit;
use crate::stats::{RuleStats, names};

/// Where an explanation's decision counts: nobody reads it.
static DISCARDED: RuleStats = RuleStats::new();
use crate::counting::Counting;
use crate::rules::unit::Window;

impl Engine {
    /// Matches `request`: what applies to each descriptor, and which counters it needs.
    /// A `dry` match (an explanation) counts no statistic and creates no statistic name.
    /// Inlined, so that its plan is built where the caller keeps it, not copied there.
    #[inline]
    pub(crate) fn match_request(&self, request: &Request, now_ms: u64, dry: bool) -> PlanBody {
        let root = self.rules.domain(&request.domain);
        if root.is_none() && !dry {
            self.stats
                .request_counter(
                    &names::domain_not_found(&request.domain),
                    &names::domain_not_found_overflow(),
                )
                .add(1);
        }
        let mut replaces = false;
        let mut items: SmallVec<[Item; 4]> = SmallVec::new();
        for (index, (descriptor, addend)) in request.descriptor_hits().enumerate() {
            let limited = |source, stats| Limited {
                source,
                descriptor: index,
                follows: false,
                divisor: 1,
                addend,
                refund: descriptor.negative_hits,
                stats,
                increment: 0,
                counters: 0,
                cached: false,
                dry,
            };
            let Some(root) = root else {
                items.push(self.no_limit());
                continue;
            };
            if let Some(limit) = descriptor.limit {
                let key = override_stats_key(&request.domain, descriptor);
                let stats = (!dry).then(|| self.stats.request_rule(&key, &request.domain));
                items.push(Item::Limited(limited(Source::Override(limit), stats)));
                continue;
            }
            let Some(id) = self.rules.find(root, &descriptor.entries, |_, _, _| {}) else {
                items.push(self.no_limit());
                continue;
            };
            let node = self.rules.node(id);
            if node.limits.is_empty() {
                items.push(self.no_limit());
                continue;
            }
            let runtime_key = (node.per_level_stats_key && !dry)
                .then(|| self.runtime_stats_key(&request.domain, root, descriptor, node));
            for (which, limit) in node.limits.iter().enumerate() {
                replaces |= !limit.replaces.is_empty();
                let item = match limit.limit {
                    Limit::Unlimited => Item::Unlimited { node: id },
                    Limit::Counted { .. } => {
                        let stats = runtime_key.as_ref().map(|key| {
                            // A single `rate_limit` (no suffix) builds no more strings.
                            if limit.stats_suffix.is_empty() {
                                return self.stats.request_rule(key, &node.full_key);
                            }
                            let key = format!("{key}{}", limit.stats_suffix);
                            let static_key = format!("{}{}", node.full_key, limit.stats_suffix);
                            self.stats.request_rule(&key, &static_key)
                        });
                        let source = Source::Node(id, u16::try_from(which).unwrap_or(u16::MAX));
                        Item::Limited(Limited {
                            follows: which > 0,
                            ..limited(source, stats)
                        })
                    }
                };
                items.push(item);
            }
        }
        if replaces {
            self.apply_replaces(&mut items);
        }
        let mut counters = 0;
        for item in items.iter_mut() {
            if let Item::Limited(limited) = item {
                limited.increment = counters;
                limited.counters = self.applied(limited).counting.counter_count();
                counters += limited.counters;
            }
        }
        PlanBody {
            dry,
            now_ms,
            items,
            increments: Vec::new(),
        }
    }

    /// Matches `request` and lists its counters with their keys, leaving out those the
    /// local over-limit cache already knows about; written over `buffers`'s counters, whose
    /// key strings are reused (the ones this plan does not need are dropped).
    pub(crate) fn plan_body(
        &self,
        request: &Request,
        now_ms: u64,
        dry: bool,
        buffers: PlanBuffers,
    ) -> PlanBody {
        let mut increments = buffers.increments;
        // Without a local cache, whose lookups need a limit's plan, most requests are
        // planned in one pass.
        if !dry
            && self.local_cache.is_none()
            && let Some(items) = self.plan_direct(request, now_ms, &mut increments)
        {
            return PlanBody {
                dry,
                now_ms,
                items,
                increments,
            };
        }
        let mut body = self.match_request(request, now_ms, dry);
        let mut used = 0;
        self.for_each_counter(&body, request, |key, hits, span, _| {
            Increment::put(&mut increments, used, (key, hits, span, now_ms));
            used += 1;
        });
        increments.truncate(used);
        body.increments = increments;
        if let Some(cache) = self.local_cache.as_ref().filter(|_| !dry) {
            body.skip_cached(cache, self.settings.stop_cache_key_increment_when_overlimit);
        }
        body
    }

    pub(super) fn no_limit(&self) -> Item {
        Item::NoLimit {
            quota: self.settings.quota_mode,
        }
    }

    /// Drops every matched limit whose name another matched limit replaces; a dropped
    /// limit is neither counted nor reported.
    pub(super) fn apply_replaces(&self, items: &mut SmallVec<[Item; 4]>) {
        let limit_of = |item: &Item| match item {
            Item::Unlimited { node } => self.rules.node(*node).limits.first(),
            Item::Limited(Limited {
                source: Source::Node(node, which),
                ..
            }) => self.rules.node(*node).limits.get(usize::from(*which)),
            _ => None,
        };
        let replaced: Vec<&str> = items
            .iter()
            .filter_map(limit_of)
            .flat_map(|limit| limit.replaces.iter().map(AsRef::as_ref))
            .collect();
        if replaced.is_empty() {
            return;
        }
        let is_replaced = |item: &Item| {
            limit_of(item)
                .and_then(|limit| limit.name.as_deref())
                .is_some_and(|name| replaced.contains(&name))
        };
        // A descriptor keeps its place: it loses the limits that are replaced, and is
        // left with no limit when that was all of them.
        let mut kept: SmallVec<[Item; 4]> = SmallVec::with_capacity(items.len());
        let mut group_start = None;
        for item in items.drain(..) {
            let follows = matches!(&item, Item::Limited(l) if l.follows);
            if !follows {
                if let Some(start) = group_start {
                    self.close_group(&mut kept, start);
                }
                group_start = Some(kept.len());
            }
            if !is_replaced(&item) {
                kept.push(item);
            }
        }
        if let Some(start) = group_start {
            self.close_group(&mut kept, start);
        }
        *items = kept;
    }

    /// Ends the items of one descriptor that start at `start`: its first item does not
    /// follow another, and a descriptor left with no item gets "no limit".
    fn close_group(&self, kept: &mut SmallVec<[Item; 4]>, start: usize) {
        match kept.get_mut(start) {
            Some(Item::Limited(first)) => first.follows = false,
            Some(_) => {}
            None => kept.push(self.no_limit()),
        }
    }

    // Inlined so that each caller computes only the fields it reads.
    #[inline(always)]
    pub(super) fn applied<'a>(&'a self, limited: &'a Limited) -> Applied<'a> {
        let applied = self.applied_whole(limited);
        match limited.divisor {
            1 => applied,
            n => applied.divided(n),
        }
    }

    #[inline(always)]
    fn applied_whole<'a>(&'a self, limited: &'a Limited) -> Applied<'a> {
        let global_quota = self.settings.quota_mode;
        match limited.source {
            Source::Override(limit) => Applied {
                requests_per_unit: limit.requests_per_unit,
                bound: u64::from(limit.requests_per_unit),
                window: Window::of(limit.unit),
                counting: Counting::FixedWindow(Window::of(limit.unit)),
                name: None,
                shadow: false,
                quota: global_quota,
                stats: match limited.dry {
                    true => &DISCARDED,
                    false => limited
                        .stats
                        .as_deref()
                        .expect("override limits carry their statistics"),
                },
            },
            Source::Node(id, which) => {
                let node = self.rules.node(id);
                let limit = &node.limits[usize::from(which)];
                let stats = match limited.dry {
                    true => &DISCARDED,
                    false => limited
                        .stats
                        .as_deref()
                        .or(limit.stats.as_deref())
                        .expect("counted limits have statistics"),
                };
                self.applied_node(node, which, stats)
            }
        }
    }

    /// The limit `which` of `node`, counting in `stats`.
    #[inline(always)]
    pub(super) fn applied_node<'a>(
        &'a self,
        node: &'a Node,
        which: u16,
        stats: &'a RuleStats,
    ) -> Applied<'a> {
        let limit = &node.limits[usize::from(which)];
        let Limit::Counted {
            window,
            requests_per_unit,
            ..
        } = limit.limit
        else {
            unreachable!("unlimited rules are never planned as limited")
        };
        Applied {
            requests_per_unit,
            bound: limit.counting.bound(requests_per_unit),
            window,
            counting: limit.counting,
            name: limit.name.as_ref(),
            shadow: node.shadow_mode,
            quota: node.quota_mode || self.settings.quota_mode,
            stats,
        }
    }
}
