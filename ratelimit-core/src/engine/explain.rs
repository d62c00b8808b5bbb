//! Why a request would get its answer, without counting it: which rule each descriptor
//! meets and how, its counter, and the answer the current counts would give.

use std::sync::Arc;

use super::{Item, Limited, Plan, PlanBuffers, Source};
use crate::engine::Engine;
use crate::model::request::{Descriptor, Request};
use crate::model::response::{CurrentLimit, Response};
use crate::rules::{MatchKind, NodeId};

/// What a request would meet, per descriptor; [`Explanation::answer`] decides it from
/// the counters' current values without counting anything.
#[derive(Debug)]
pub struct Explanation {
    plan: Plan,
    descriptors: Vec<DescriptorExplanation>,
}

/// What one descriptor meets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorExplanation {
    /// Where the deepest matching rule is in its domain's YAML
    /// (`descriptors[0].descriptors[1]`); `None` when no rule matched.
    pub rule: Option<String>,
    /// Each entry and how it matched, as far as rules matched.
    pub matched: Vec<MatchedEntry>,
    /// What applies.
    pub outcome: Outcome,
    /// The rule is in shadow mode: over its limit still answers `OK`.
    pub shadow: bool,
    /// The limit that applies.
    pub limit: Option<CurrentLimit>,
    /// Its counter's key, byte for byte what the store holds.
    pub cache_key: Option<String>,
    /// The hits the request would add.
    pub hits: u64,
}

/// One entry of a descriptor and how a rule matched it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchedEntry {
    /// The entry's key.
    pub key: String,
    /// The entry's value.
    pub value: String,
    /// How it matched.
    pub how: MatchKind,
}

/// What applies to a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The domain is not configured.
    UnknownDomain,
    /// No rule matches every entry.
    NoRule,
    /// The rule has no `rate_limit`: whitelisted.
    Whitelisted,
    /// `unlimited: true`.
    Unlimited,
    /// Another matched rule's `replaces` names this rule's limit.
    Replaced,
    /// The request's own `limit` override.
    Override,
    /// The rule's limit.
    Limited,
}

impl Outcome {
    /// A short lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::UnknownDomain => "unknown_domain",
            Outcome::NoRule => "no_rule",
            Outcome::Whitelisted => "whitelisted",
            Outcome::Unlimited => "unlimited",
            Outcome::Replaced => "replaced",
            Outcome::Override => "override",
            Outcome::Limited => "limited",
        }
    }
}

impl MatchKind {
    /// `exact`, `wildcard` or `default`.
    pub fn as_str(self) -> &'static str {
        match self {
            MatchKind::Exact => "exact",
            MatchKind::Wildcard => "wildcard",
            MatchKind::Default => "default",
        }
    }
}

impl Explanation {
    pub(crate) fn new(engine: Arc<Engine>, request: &Request, now_ms: u64) -> Explanation {
        let body = engine.plan_body(request, now_ms, true, PlanBuffers::default());
        // One per descriptor: with several limits, the first one's.
        let descriptors = body
            .items
            .iter()
            .filter(|item| !matches!(item, Item::Limited(limited) if limited.follows))
            .zip(&request.descriptors)
            .map(|(item, descriptor)| engine.explain(item, descriptor, request, &body.increments))
            .collect();
        Explanation {
            plan: Plan { engine, body },
            descriptors,
        }
    }

    /// Per descriptor, in request order.
    pub fn descriptors(&self) -> &[DescriptorExplanation] {
        &self.descriptors
    }

    /// The counters to read, in order; `hits` is what the request would add.
    pub fn increments(&self) -> &[super::Increment] {
        self.plan.increments()
    }

    /// The answer the request would get with the counters at `current` (same order as
    /// [`Explanation::increments`]). Nothing is counted: no counter, no statistic.
    pub fn answer(&self, current: &[u64]) -> Response {
        let after: Vec<u64> = self
            .increments()
            .iter()
            .zip(current)
            .map(|(increment, &now)| increment.after(now))
            .collect();
        self.plan.body.decide(&self.plan.engine, &after)
    }
}

impl Engine {
    fn explain(
        &self,
        item: &Item,
        descriptor: &Descriptor,
        request: &Request,
        increments: &[super::Increment],
    ) -> DescriptorExplanation {
        let mut matched = Vec::new();
        let root = self.rules.domain(&request.domain);
        let found: Option<NodeId> = root.and_then(|root| {
            self.rules.find(root, &descriptor.entries, |entry, _, how| {
                matched.push(MatchedEntry {
                    key: entry.key.clone(),
                    value: entry.value.clone(),
                    how,
                });
            })
        });
        let node = found.map(|id| self.rules.node(id));
        let outcome = match (root, node, item) {
            (None, ..) => Outcome::UnknownDomain,
            (
                _,
                _,
                Item::Limited(Limited {
                    source: Source::Override(_),
                    ..
                }),
            ) => Outcome::Override,
            (_, _, Item::Limited(_) | Item::Direct(_)) => Outcome::Limited,
            (_, _, Item::Unlimited { .. }) => Outcome::Unlimited,
            (_, None, _) => Outcome::NoRule,
            (_, Some(node), _) if node.limits.is_empty() => Outcome::Whitelisted,
            (_, Some(_), _) => Outcome::Replaced,
        };
        let (limit, cache_key, hits) = match item {
            Item::Limited(limited) => {
                let applied = self.applied(limited);
                let limit = CurrentLimit {
                    requests_per_unit: applied.requests_per_unit,
                    unit: applied.window.unit(),
                    name: applied.name.cloned(),
                };
                let key = increments.get(limited.increment).map(|i| i.key.clone());
                (Some(limit), key, limited.addend)
            }
            _ => (None, None, 0),
        };
        DescriptorExplanation {
            rule: node.map(|node| node.yaml_path.to_string()),
            matched,
            outcome,
            shadow: node.is_some_and(|node| node.shadow_mode) && outcome == Outcome::Limited,
            limit,
            cache_key,
            hits,
        }
    }
}
