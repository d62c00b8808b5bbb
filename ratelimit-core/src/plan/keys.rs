//! Counter keys (byte for byte envoyproxy/ratelimit's) and per-request statistic keys.

use super::{Item, PlanBody, Source};
use crate::counting::{CounterOp, Span};
use crate::engine::Engine;
use crate::request::{Descriptor, Request};
use crate::rules::{Level, MatchKind, Node};
use crate::stats::names::push_key_part;

impl Engine {
    /// Calls `f(cache key, hits, span, bound)` for each counter of `body`, in counter order,
    /// building each key in `buffer`: the in-process path reuses one buffer and allocates
    /// no key, a plan takes each key out of it.
    pub(crate) fn for_each_counter(
        &self,
        body: &PlanBody,
        request: &Request,
        buffer: &mut String,
        mut f: impl FnMut(&mut String, u64, Span, u64),
    ) {
        for item in &body.items {
            if let Item::Limited(limited) = item {
                let descriptor = &request.descriptors[limited.descriptor];
                let applied = self.applied(limited);
                let suffix = match limited.source {
                    Source::Node(id, which) => {
                        &*self.rules.node(id).limits[usize::from(which)].key_suffix
                    }
                    Source::Override(_) => "",
                };
                for span in applied.counting.counters(body.now_ms) {
                    buffer.clear();
                    self.cache_key(buffer, &request.domain, descriptor, limited.source);
                    // A bucket has no window: its key ends with the entries' `_`.
                    if !matches!(span.op, CounterOp::Gcra(_)) {
                        buffer.push_str(itoa::Buffer::new().format(span.start));
                        if !suffix.is_empty() {
                            buffer.push('_');
                        }
                    }
                    buffer.push_str(suffix);
                    f(buffer, limited.addend, span, applied.bound);
                }
            }
        }
    }

    pub(super) fn cache_key(
        &self,
        key: &mut String,
        domain: &str,
        descriptor: &Descriptor,
        source: Source,
    ) {
        key.push_str(&self.settings.cache_key_prefix);
        key.push_str(domain);
        key.push('_');
        // Only a rule whose key depends on the levels it matched needs the domain's rules.
        let per_level = match source {
            Source::Node(id, _) if self.rules.node(id).per_level_cache_key => {
                self.rules.domain(domain)
            }
            _ => None,
        };
        match per_level {
            Some(root) => {
                self.rules
                    .find(root, &descriptor.entries, |entry, node, kind| {
                        let value = match (&node.value, kind) {
                            (Some(pattern), MatchKind::Wildcard) if node.share_threshold => pattern,
                            _ => entry.value.as_str(),
                        };
                        push_entry(key, &entry.key, value);
                    });
            }
            None => {
                for entry in &descriptor.entries {
                    push_entry(key, &entry.key, &entry.value);
                }
            }
        }
    }

    /// The statistics key of a rule whose key carries runtime values.
    pub(super) fn runtime_stats_key(
        &self,
        domain: &str,
        root: &Level,
        descriptor: &Descriptor,
        leaf: &Node,
    ) -> String {
        let mut key = domain.to_owned();
        self.rules
            .find(root, &descriptor.entries, |entry, node, kind| {
                let shared = node
                    .share_threshold
                    .then_some(node.value.as_deref())
                    .flatten();
                let runtime = (!entry.value.is_empty()).then_some(entry.value.as_str());
                let value = if leaf.detailed_metric {
                    Some(shared.unwrap_or(&entry.value))
                } else {
                    match kind {
                        MatchKind::Exact => node.value.as_deref(),
                        _ if shared.is_some() => shared,
                        _ if node.value_to_metric => runtime,
                        MatchKind::Wildcard => node.value.as_deref(),
                        MatchKind::Default => None,
                    }
                };
                push_key_part(&mut key, &entry.key, value);
            });
        key
    }
}

pub(super) fn push_entry(key: &mut String, entry_key: &str, value: &str) {
    key.push_str(entry_key);
    key.push('_');
    key.push_str(value);
    key.push('_');
}

pub(super) fn override_stats_key(domain: &str, descriptor: &Descriptor) -> String {
    let mut key = domain.to_owned();
    for entry in &descriptor.entries {
        push_key_part(
            &mut key,
            &entry.key,
            (!entry.value.is_empty()).then_some(entry.value.as_str()),
        );
    }
    key
}
