//! Which rule applies to each descriptor of a request, and which counters it needs.

use smallvec::SmallVec;

use super::keys::override_stats_key;
use super::{Applied, Increment, Item, Limited, PlanBody, Source};
use crate::config::Limit;
use crate::engine::Engine;
use crate::request::Request;
use crate::stats::{RuleStats, names};

/// Where an explanation's decision counts: nobody reads it.
static DISCARDED: RuleStats = RuleStats::new();
use crate::counting::Counting;
use crate::unit::Window;

impl Engine {
    /// Matches `request`: what applies to each descriptor, and which counters it needs.
    /// A `dry` match (an explanation) counts no statistic and creates no statistic name.
    pub(crate) fn match_request(&self, request: &Request, now: u64, dry: bool) -> PlanBody {
        let root = self.rules.domain(&request.domain);
        if root.is_none() && !dry {
            self.stats
                .request_counter(
                    &names::domain_not_found(&request.domain),
                    &names::domain_not_found_overflow(),
                )
                .add(1);
        }
        let default_addend = u64::from(request.hits_addend.max(1));
        let mut replaces = false;
        let mut items: SmallVec<[Item; 4]> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                let Some(root) = root else {
                    return self.no_limit();
                };
                let addend = descriptor.hits_addend.unwrap_or(default_addend);
                if let Some(limit) = descriptor.limit {
                    let key = override_stats_key(&request.domain, descriptor);
                    return Item::Limited(Limited {
                        source: Source::Override(limit),
                        addend,
                        stats: (!dry).then(|| self.stats.request_rule(&key, &request.domain)),
                        increment: 0,
                        counters: 0,
                        cached: false,
                        dry,
                    });
                }
                let Some(id) = self.rules.find(root, &descriptor.entries, |_, _, _| {}) else {
                    return self.no_limit();
                };
                let node = self.rules.node(id);
                let Some(limit) = &node.limit else {
                    return self.no_limit();
                };
                replaces |= !limit.replaces.is_empty();
                match limit.limit {
                    Limit::Unlimited => Item::Unlimited { node: id },
                    Limit::Fixed { .. } => Item::Limited(Limited {
                        source: Source::Node(id),
                        addend,
                        stats: (node.per_level_stats_key && !dry).then(|| {
                            let key =
                                self.runtime_stats_key(&request.domain, root, descriptor, node);
                            self.stats.request_rule(&key, &node.full_key)
                        }),
                        increment: 0,
                        counters: 0,
                        cached: false,
                        dry,
                    }),
                }
            })
            .collect();
        if replaces {
            self.apply_replaces(&mut items);
        }
        let mut counters = 0;
        for item in items.iter_mut() {
            if let Item::Limited(limited) = item {
                limited.increment = counters;
                limited.counters = self.applied(limited).counting.counters(now).len();
                counters += limited.counters;
            }
        }
        PlanBody {
            dry,
            now,
            items,
            increments: Vec::new(),
        }
    }

    /// Matches `request` and lists its counters with their keys, leaving out those the
    /// local over-limit cache already knows about.
    pub(crate) fn plan_body(&self, request: &Request, now: u64, dry: bool) -> PlanBody {
        let mut body = self.match_request(request, now, dry);
        let mut increments = Vec::with_capacity(body.items.len());
        let mut key = String::new();
        self.for_each_counter(
            &body,
            request,
            &mut key,
            |key, hits, window, window_end, _| {
                increments.push(Increment {
                    key: std::mem::take(key),
                    hits,
                    window,
                    window_end,
                });
            },
        );
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
    pub(super) fn apply_replaces(&self, items: &mut [Item]) {
        let node_of = |item: &Item| match item {
            Item::Unlimited { node }
            | Item::Limited(Limited {
                source: Source::Node(node),
                ..
            }) => Some(*node),
            _ => None,
        };
        let replaced: Vec<&str> = items
            .iter()
            .filter_map(node_of)
            .filter_map(|id| self.rules.node(id).limit.as_ref())
            .flat_map(|limit| limit.replaces.iter().map(AsRef::as_ref))
            .collect();
        for item in items.iter_mut() {
            let name = node_of(item)
                .and_then(|id| self.rules.node(id).limit.as_ref())
                .and_then(|limit| limit.name.as_deref());
            if name.is_some_and(|name| replaced.contains(&name)) {
                *item = self.no_limit();
            }
        }
    }

    pub(super) fn applied<'a>(&'a self, limited: &'a Limited) -> Applied<'a> {
        let global_quota = self.settings.quota_mode;
        match limited.source {
            Source::Override(limit) => Applied {
                requests_per_unit: limit.requests_per_unit,
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
            Source::Node(id) => {
                let node = self.rules.node(id);
                let limit = node
                    .limit
                    .as_ref()
                    .expect("limited items point at nodes with a limit");
                let Limit::Fixed {
                    window,
                    requests_per_unit,
                } = limit.limit
                else {
                    unreachable!("unlimited rules are never planned as limited")
                };
                Applied {
                    requests_per_unit,
                    window,
                    counting: Counting::FixedWindow(window),
                    name: limit.name.as_ref(),
                    shadow: node.shadow_mode,
                    quota: node.quota_mode || global_quota,
                    stats: match limited.dry {
                        true => &DISCARDED,
                        false => limited
                            .stats
                            .as_deref()
                            .or(node.stats.as_deref())
                            .expect("nodes with a fixed limit have statistics"),
                    },
                }
            }
        }
    }
}
