//! Counter keys (byte for byte envoyproxy/ratelimit's) and per-request statistic keys.

use super::{Item, PlanBody, Source};
use crate::counting::counter_key::{CounterKey, Values, limit_identity};
use crate::counting::lease::lease_id;
use crate::counting::{CounterOp, Counting, Span};
use crate::engine::Engine;
use crate::model::request::{Descriptor, Entry, Request};
use crate::rules::{Level, MatchKind, Node};
use crate::stats::names::push_key_part;

impl Engine {
    /// Calls `f(counter, hits, span, bound)` for each counter of `body`, in counter order.
    /// A counter's text is written only when a store asks for it.
    pub(crate) fn for_each_counter(
        &self,
        body: &PlanBody,
        request: &Request,
        mut f: impl FnMut(&CounterKey<'_>, u64, Span, u64),
    ) {
        for item in &body.items {
            if let Item::Limited(limited) = item {
                let descriptor = &request.descriptors[limited.descriptor];
                let applied = self.applied(limited);
                let (domain, source, now_ms) = (&request.domain, limited.source, body.now_ms);
                let parts = self.counter_parts(domain, descriptor, source);
                let at = (applied.counting, now_ms);
                self.for_each_counter_of(domain, descriptor, source, parts, at, {
                    |key, span| f(key, limited.addend, span, applied.bound)
                });
            }
        }
    }

    /// Calls `f(counter, span)` for each counter that a limit of `source`, counting as
    /// `counting`, needs at `now_ms` ([`Counting::counters`]), keyed by `parts`
    /// ([`Engine::counter_parts`]) for `descriptor`, in counter order.
    #[inline(always)]
    pub(super) fn for_each_counter_of(
        &self,
        domain: &str,
        descriptor: &Descriptor,
        source: Source,
        (identity, values): (u64, Values<'_>),
        (counting, now_ms): (Counting, u64),
        mut f: impl FnMut(&CounterKey<'_>, Span),
    ) {
        for mut span in counting.counters(now_ms) {
            if let CounterOp::Acquire(lease) = &mut span.op {
                let last = descriptor.entries.last().map_or("", |e| e.value.as_str());
                lease.id = lease_id(last);
            }
            if descriptor.negative_hits {
                span.op = span.op.refunding();
            }
            // A bucket and a lease set have no window: the key ends with the entries' `_`.
            let start = (!span.op.is_windowless()).then_some(span.start);
            let write = |out: &mut String| {
                self.write_key(out, domain, descriptor, &values, source, start);
            };
            let key = CounterKey::new(identity, start.unwrap_or(0), values.clone(), &write);
            f(&key, span);
        }
    }

    /// What identifies the counters of `source` for `descriptor`, besides their window:
    /// the limit's identity and the values it counts under.
    #[inline(always)]
    pub(super) fn counter_parts<'a>(
        &'a self,
        domain: &str,
        descriptor: &'a Descriptor,
        source: Source,
    ) -> (u64, Values<'a>) {
        match source {
            Source::Override(_) => {
                let keys = descriptor.entries.iter().map(|e| e.key.as_str());
                let identity = limit_identity(&self.settings.cache_key_prefix, domain, keys, "");
                (identity, Values::Of(&descriptor.entries))
            }
            Source::Node(id, which) => {
                let node = self.rules.node(id);
                let limit = &node.limits[usize::from(which)];
                let identity = limit.identity;
                let leased = matches!(limit.counting, Counting::Concurrency { .. });
                // A rule that shares a counter across a wildcard counts under its
                // pattern at that level; a concurrency limit's own value names the
                // request, not the counter.
                let root = match node.per_level_cache_key {
                    true => self.rules.domain(domain),
                    false => None,
                };
                match root {
                    Some(root) => {
                        let mut values = Vec::with_capacity(descriptor.entries.len());
                        self.rules
                            .find(root, &descriptor.entries, |entry, node, kind| {
                                values.push(shared_value(entry, node, kind));
                            });
                        if leased && let Some(last) = values.last_mut() {
                            *last = "";
                        }
                        (identity, Values::Listed(values))
                    }
                    None => (identity, Values::Of(&descriptor.entries)),
                }
            }
        }
    }

    /// The text of a counter's key, byte for byte envoyproxy/ratelimit's:
    /// `CACHE_KEY_PREFIX` + domain + `_` + (`key_value_` per entry) + window start, then
    /// `_` and the limit's suffix when it has one; a bucket's has no window start.
    pub(super) fn write_key(
        &self,
        key: &mut String,
        domain: &str,
        descriptor: &Descriptor,
        values: &Values<'_>,
        source: Source,
        start: Option<u64>,
    ) {
        let suffix = match source {
            Source::Node(id, which) => &*self.rules.node(id).limits[usize::from(which)].key_suffix,
            Source::Override(_) => "",
        };
        // Room for the whole key at once (a value a pattern replaces may differ in
        // length: the room is a hint). `_`, a window start of up to 20 digits and `_`.
        let entries: usize = descriptor
            .entries
            .iter()
            .map(|e| e.key.len() + e.value.len() + 2)
            .sum();
        let prefix = &self.settings.cache_key_prefix;
        key.reserve(prefix.len() + domain.len() + 1 + entries + 22 + suffix.len());
        self.write_entries(key, domain, descriptor, values);
        push_window_and_suffix(key, start, suffix);
    }

    /// The start of a counter's key: `CACHE_KEY_PREFIX` + domain + `_` + (`key_value_`
    /// per entry, with the values of [`Engine::counter_parts`]).
    pub(super) fn write_entries(
        &self,
        key: &mut String,
        domain: &str,
        descriptor: &Descriptor,
        values: &Values<'_>,
    ) {
        let keys = descriptor.entries.iter().map(|e| e.key.as_str());
        let prefix = &self.settings.cache_key_prefix;
        match values {
            Values::Listed(values) => {
                push_entries(key, prefix, domain, keys.zip(values.iter().copied()));
            }
            _ => push_entries(
                key,
                prefix,
                domain,
                descriptor.entries.iter().map(|e| (&*e.key, &*e.value)),
            ),
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

/// The start of a counter's key: `prefix` + domain + `_` + (`key_value_` per entry).
pub(super) fn push_entries<'a>(
    key: &mut String,
    prefix: &str,
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    key.push_str(prefix);
    key.push_str(domain);
    key.push('_');
    for (entry_key, value) in entries {
        key.push_str(entry_key);
        key.push('_');
        key.push_str(value);
        key.push('_');
    }
}

/// The end of a counter's key: its window start (a bucket has none), then `_` and the
/// limit's suffix when it has one.
pub(super) fn push_window_and_suffix(key: &mut String, start: Option<u64>, suffix: &str) {
    if let Some(start) = start {
        key.push_str(itoa::Buffer::new().format(start));
        if !suffix.is_empty() {
            key.push('_');
        }
    }
    key.push_str(suffix);
}

/// The value a counter's key holds for `entry`: a rule that shares its counter across a
/// wildcard holds its pattern.
fn shared_value<'a>(entry: &'a Entry, node: &'a Node, kind: MatchKind) -> &'a str {
    match (&node.value, kind) {
        (Some(pattern), MatchKind::Wildcard) if node.share_threshold => pattern,
        _ => entry.value.as_str(),
    }
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
