//! The rules: the YAML configuration ([`config`]) compiled into per-domain lookup
//! trees, with the units of time ([`unit`]) and wildcard values ([`wildcard`]) they
//! use.
//!
//! Each level maps a descriptor key to its rules; inside a key, an exact value is tried
//! first, then the wildcard values in file order, then the key-only rule. Lookups borrow
//! the request's strings and allocate nothing.

pub mod config;
pub(crate) mod unit;
pub(crate) mod wildcard;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use crate::counting::Counting;
use crate::counting::counter_key::limit_identity;
use crate::counting::gcra::Bucket;
use crate::counting::keymap::KeyMap;
use crate::model::request::Entry;
use crate::rules::config::{Algorithm, Config, DescriptorRule, Limit, Metadata, RateLimitRule};
use crate::rules::unit::{Unit, Window};
use crate::rules::wildcard::Pattern;
use crate::stats::names::push_key_part;
use crate::stats::{RuleStats, StatsRegistry};

/// Index of a node in [`RuleSet::nodes`].
pub(crate) type NodeId = u32;

/// How an entry matched its rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchKind {
    /// `key` and `value` both equal.
    Exact,
    /// `value` matched a `*` pattern.
    Wildcard,
    /// The key-only rule.
    Default,
}

/// The rules of one configuration, compiled.
#[derive(Debug, Default)]
pub(crate) struct RuleSet {
    domains: KeyMap<Level>,
    nodes: Vec<Node>,
    /// Each domain and the id of its first node: nodes are in file order, depth first.
    domain_starts: Vec<(Box<str>, NodeId)>,
}

/// One loaded rule, for display: the rules of a domain in file order, depth first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleView {
    /// Its domain.
    pub domain: String,
    /// 0 for a top-level rule, 1 for its children, ...
    pub depth: usize,
    /// Where it is in the domain's YAML.
    pub yaml_path: String,
    /// `key`.
    pub key: String,
    /// `value`, when it has one.
    pub value: Option<String>,
    /// `5/MINUTE`, `unlimited`, or empty when the rule has no `rate_limit`.
    pub limit: String,
    /// `shadow_mode`.
    pub shadow: bool,
    /// Its statistics key (`domain.key_value`).
    pub stats_key: String,
}

#[derive(Debug, Default)]
pub(crate) struct Level {
    keys: KeyMap<KeyRules>,
}

#[derive(Default)]
struct KeyRulesBuilder {
    exact: Vec<(Box<str>, NodeId)>,
    wildcards: Vec<(Pattern, NodeId)>,
    default: Option<NodeId>,
}

#[derive(Debug)]
struct KeyRules {
    exact: KeyMap<NodeId>,
    wildcards: Vec<(Pattern, NodeId)>,
    default: Option<NodeId>,
}

/// One compiled descriptor rule.
#[derive(Debug)]
pub(crate) struct Node {
    /// The configured key.
    pub key: Box<str>,
    /// The configured value or pattern.
    pub value: Option<Box<str>>,
    /// Its `rate_limit`, or each limit of its `rate_limits`; empty for a whitelist.
    pub limits: Box<[NodeLimit]>,
    children: Option<Level>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub metadata: Option<Arc<Metadata>>,
    /// The static statistics key (`domain.key_value.key`).
    pub full_key: Box<str>,
    /// Where the rule is in its domain's YAML (`descriptors[0].descriptors[2]`).
    pub yaml_path: Box<str>,
    /// Some level on the path to this node shares a counter across a wildcard, so the
    /// cache key depends on which rule matched at each level.
    pub per_level_cache_key: bool,
    /// A limit here is a concurrency limit: the request's value at this entry names its
    /// lease and is left out of the counter's key (which so depends on the level).
    pub leased: bool,
    /// The statistics key depends on the runtime values (`value_to_metric` on the path or
    /// `detailed_metric` here).
    pub per_level_stats_key: bool,
}

/// A compiled `rate_limit` block.
#[derive(Debug)]
pub(crate) struct NodeLimit {
    pub limit: Limit,
    /// How it counts; a fixed window for `unlimited` (never used).
    pub counting: Counting,
    pub name: Option<Arc<str>>,
    pub replaces: Box<[Box<str>]>,
    /// Statistics under the node's static key; `None` for `unlimited`.
    pub stats: Option<Arc<RuleStats>>,
    /// Ends the cache key (after an `_`): empty for a plain `rate_limit`
    /// (envoyproxy/ratelimit's keys, byte for byte), else the limit's algorithm and
    /// window (`sw60`) and its place in `rate_limits`, so that two limits never share a
    /// counter.
    pub key_suffix: Box<str>,
    /// Appended to statistics keys: empty for a `rate_limit`, `.<name or index>` for an
    /// entry of `rate_limits`.
    pub stats_suffix: Box<str>,
    /// What its counters are keyed by besides their window and values
    /// ([`limit_identity`]): the same after a reload.
    pub identity: u64,
}

impl NodeLimit {
    fn compile(
        rule: &RateLimitRule,
        listed: Option<usize>,
        path: &Path,
        stats: &StatsRegistry,
    ) -> NodeLimit {
        let full_key = &path.full_key;
        let (counting, key_suffix) = match rule.limit {
            Limit::Unlimited => (
                Counting::FixedWindow(Window::of(Unit::Second)),
                String::new(),
            ),
            Limit::Counted {
                window,
                requests_per_unit,
                algorithm,
            } => {
                let counting = match algorithm {
                    Algorithm::FixedWindow => Counting::FixedWindow(window),
                    Algorithm::SlidingWindow => Counting::SlidingWindow(window),
                    Algorithm::TokenBucket { burst } => {
                        Counting::TokenBucket(Bucket::new(window, requests_per_unit, burst), window)
                    }
                    Algorithm::Concurrency => Counting::Concurrency {
                        window,
                        places: requests_per_unit,
                    },
                };
                let plain = algorithm == Algorithm::FixedWindow
                    && window.multiplier() == 1
                    && listed.is_none();
                let mut suffix = String::new();
                if !plain {
                    let tag = match algorithm {
                        Algorithm::FixedWindow => "fw",
                        Algorithm::SlidingWindow => "sw",
                        Algorithm::TokenBucket { .. } => "tb",
                        Algorithm::Concurrency => "cc",
                    };
                    let _ = write!(suffix, "{tag}{}", window.seconds());
                }
                if let Some(index) = listed {
                    if !suffix.is_empty() {
                        suffix.push('_');
                    }
                    let _ = write!(suffix, "{index}");
                }
                (counting, suffix)
            }
        };
        let stats_suffix = match listed {
            None => String::new(),
            Some(index) => match &rule.name {
                Some(name) => format!(".{name}"),
                None => format!(".{index}"),
            },
        };
        NodeLimit {
            limit: rule.limit,
            counting,
            name: rule.name.as_deref().map(Arc::from),
            replaces: rule.replaces.iter().map(|n| n.as_str().into()).collect(),
            stats: matches!(rule.limit, Limit::Counted { .. })
                .then(|| stats.rule(&format!("{full_key}{stats_suffix}"))),
            identity: limit_identity(
                &path.prefix,
                &path.domain,
                path.keys.iter().map(String::as_str),
                &key_suffix,
            ),
            key_suffix: key_suffix.into(),
            stats_suffix: stats_suffix.into(),
        }
    }

    /// `5/MINUTE`, `5/10 MINUTE sliding_window`, `unlimited`.
    fn describe(&self) -> String {
        match self.limit {
            Limit::Unlimited => "unlimited".into(),
            Limit::Counted {
                window,
                requests_per_unit,
                algorithm,
            } => {
                let mut out = format!("{requests_per_unit}/");
                if window.multiplier() != 1 {
                    let _ = write!(out, "{} ", window.multiplier());
                }
                let _ = write!(out, "{}", window.unit());
                match algorithm {
                    Algorithm::FixedWindow => {}
                    Algorithm::SlidingWindow => out.push_str(" sliding_window"),
                    Algorithm::TokenBucket { burst } => {
                        let _ = write!(out, " token_bucket burst={burst}");
                    }
                    Algorithm::Concurrency => out.push_str(" concurrency"),
                }
                out
            }
        }
    }
}

impl RuleSet {
    /// Compiles `config`, taking statistics counters from `stats`; counter keys start
    /// with `prefix` (`CACHE_KEY_PREFIX`).
    pub fn compile(config: &Config, stats: &StatsRegistry, prefix: &str) -> RuleSet {
        let mut set = RuleSet::default();
        let mut domains = Vec::with_capacity(config.domains().len());
        for domain in config.domains() {
            let mut path = Path {
                prefix: prefix.to_owned(),
                domain: domain.domain.clone(),
                keys: Vec::new(),
                full_key: domain.domain.clone(),
                yaml: String::new(),
                share_threshold: false,
                value_to_metric: false,
            };
            let first = NodeId::try_from(set.nodes.len()).expect("fewer than 2^32 rules");
            set.domain_starts
                .push((domain.domain.as_str().into(), first));
            let level = set.compile_level(&domain.descriptors, &mut path, stats);
            domains.push((domain.domain.as_str().into(), level));
        }
        set.domains = KeyMap::from_pairs(domains);
        set
    }

    /// Every counted limit by its statistics key: `(key, requests_per_unit, window
    /// seconds)`.
    pub(crate) fn configured_limits(&self) -> Vec<(String, u32, u64)> {
        let mut limits = Vec::new();
        for node in &self.nodes {
            for limit in &node.limits {
                if let Limit::Counted {
                    window,
                    requests_per_unit,
                    ..
                } = limit.limit
                {
                    let key = format!("{}{}", node.full_key, limit.stats_suffix);
                    limits.push((key, requests_per_unit, window.seconds()));
                }
            }
        }
        limits
    }

    fn compile_level(
        &mut self,
        rules: &[DescriptorRule],
        path: &mut Path,
        stats: &StatsRegistry,
    ) -> Level {
        let mut keys: Vec<(Box<str>, KeyRulesBuilder)> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (position, rule) in rules.iter().enumerate() {
            let id = self.compile_node(rule, position, path, stats);
            let at = *index.entry(rule.key.as_str()).or_insert_with(|| {
                keys.push((rule.key.as_str().into(), KeyRulesBuilder::default()));
                keys.len() - 1
            });
            let building = &mut keys[at].1;
            match rule.value.as_deref() {
                None => building.default = Some(id),
                Some(value) => match Pattern::new(value) {
                    Some(pattern) => building.wildcards.push((pattern, id)),
                    None => building.exact.push((value.into(), id)),
                },
            }
        }
        let keys = keys
            .into_iter()
            .map(|(key, b)| {
                let rules = KeyRules {
                    exact: KeyMap::from_pairs(b.exact),
                    wildcards: b.wildcards,
                    default: b.default,
                };
                (key, rules)
            })
            .collect();
        Level {
            keys: KeyMap::from_pairs(keys),
        }
    }

    fn compile_node(
        &mut self,
        rule: &DescriptorRule,
        position: usize,
        path: &mut Path,
        stats: &StatsRegistry,
    ) -> NodeId {
        let saved = path.clone();
        push_key_part(&mut path.full_key, &rule.key, rule.value.as_deref());
        if !path.yaml.is_empty() {
            path.yaml.push('.');
        }
        path.yaml.push_str(&format!("descriptors[{position}]"));
        path.share_threshold |= rule.share_threshold;
        path.value_to_metric |= rule.value_to_metric;
        path.keys.push(rule.key.clone());
        let limits: Box<[NodeLimit]> = match &rule.rate_limit {
            Some(one) => Box::new([NodeLimit::compile(one, None, path, stats)]),
            None => rule
                .rate_limits
                .iter()
                .enumerate()
                .map(|(i, r)| NodeLimit::compile(r, Some(i), path, stats))
                .collect(),
        };
        let leased = limits
            .iter()
            .any(|l| matches!(l.counting, Counting::Concurrency { .. }));
        let node = Node {
            key: rule.key.as_str().into(),
            value: rule.value.as_deref().map(Into::into),
            limits,
            children: None,
            shadow_mode: rule.shadow_mode,
            quota_mode: rule.quota_mode,
            detailed_metric: rule.detailed_metric,
            value_to_metric: rule.value_to_metric,
            share_threshold: rule.share_threshold,
            metadata: rule.metadata.clone().map(Arc::new),
            full_key: path.full_key.as_str().into(),
            yaml_path: path.yaml.as_str().into(),
            per_level_cache_key: path.share_threshold || leased,
            leased,
            per_level_stats_key: path.value_to_metric || rule.detailed_metric,
        };
        let id = NodeId::try_from(self.nodes.len()).expect("fewer than 2^32 rules");
        self.nodes.push(node);
        if !rule.descriptors.is_empty() {
            let children = self.compile_level(&rule.descriptors, path, stats);
            self.nodes[id as usize].children = Some(children);
        }
        *path = saved;
        id
    }

    /// The root level of `domain`, if it is configured.
    pub fn domain(&self, domain: &str) -> Option<&Level> {
        self.domains.get(domain)
    }

    /// The node with id `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    /// The rules under `id`, for the next entry of a descriptor.
    pub fn children(&self, id: NodeId) -> Option<&Level> {
        self.node(id).children.as_ref()
    }

    /// The rule an entry with key `key` matches in `level` whatever its value: `Ok` of
    /// the key-only rule, or of `None` when no rule has the key; `Err` with a rule of a
    /// value of its own when the value decides.
    pub fn key_only(&self, level: &Level, key: &str) -> Result<Option<NodeId>, NodeId> {
        let Some(rules) = level.keys.get(key) else {
            return Ok(None);
        };
        let valued = rules.exact.any_value().copied();
        match valued.or(rules.wildcards.first().map(|(_, id)| *id)) {
            Some(id) => Err(id),
            None => Ok(rules.default),
        }
    }

    /// Walks `entries` down from `level`, calling `visit` for each level's match, and
    /// returns the node matched at exactly the depth of the descriptor. There is no
    /// backtracking: once an entry matched a rule, deeper entries are looked up only under
    /// that rule.
    pub fn find<'s, 'e>(
        &'s self,
        level: &'s Level,
        entries: &'e [Entry],
        mut visit: impl FnMut(&'e Entry, &'s Node, MatchKind),
    ) -> Option<NodeId> {
        let mut level = level;
        let mut found = None;
        for (depth, entry) in entries.iter().enumerate() {
            if depth > 0 {
                level = self.node(found?).children.as_ref()?;
            }
            let (id, kind) = level.lookup(entry)?;
            visit(entry, self.node(id), kind);
            found = Some(id);
        }
        found
    }

    /// The entries of `bucket` (key, value pairs in any order) as a descriptor of
    /// `level`'s rules: at each level, the first entry (by key) that a rule there matches,
    /// then the same under that rule, until no rule matches or there is no deeper level.
    pub fn bucket_entries(&self, level: &Level, bucket: &[Entry]) -> Vec<Entry> {
        let mut sorted: Vec<&Entry> = bucket.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        let mut entries = Vec::new();
        let mut level = Some(level);
        while let Some(at) = level {
            let Some((entry, id)) = sorted
                .iter()
                .enumerate()
                .find_map(|(i, entry)| at.lookup(entry).map(|(id, _)| (i, id)))
                .map(|(i, id)| (sorted.remove(i), id))
            else {
                break;
            };
            entries.push(entry.clone());
            level = self.node(id).children.as_ref();
        }
        entries
    }

    /// Every rule, domain by domain, in file order, depth first.
    pub fn views(&self) -> Vec<RuleView> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for (i, (domain, first)) in self.domain_starts.iter().enumerate() {
            let end = self
                .domain_starts
                .get(i + 1)
                .map_or(self.nodes.len(), |(_, next)| *next as usize);
            for node in &self.nodes[*first as usize..end] {
                let limit = node
                    .limits
                    .iter()
                    .map(NodeLimit::describe)
                    .collect::<Vec<_>>()
                    .join(", ");
                out.push(RuleView {
                    domain: domain.to_string(),
                    depth: node
                        .yaml_path
                        .matches("descriptors[")
                        .count()
                        .saturating_sub(1),
                    yaml_path: node.yaml_path.to_string(),
                    key: node.key.to_string(),
                    value: node.value.as_deref().map(str::to_owned),
                    limit,
                    shadow: node.shadow_mode,
                    stats_key: node.full_key.to_string(),
                });
            }
        }
        out
    }

    /// One line per rule with a limit, as envoyproxy/ratelimit's `/rlconfig` prints them,
    /// sorted.
    pub fn describe(&self) -> String {
        let mut lines: Vec<String> = self
            .nodes
            .iter()
            .flat_map(|node| {
                node.limits.iter().map(move |limit| {
                    let (unit, requests) = match limit.limit {
                        Limit::Unlimited => ("UNKNOWN", 0),
                        Limit::Counted {
                            window,
                            requests_per_unit,
                            ..
                        } => (window.unit().as_upper_str(), requests_per_unit),
                    };
                    format!(
                        "{}{}: unit={unit} requests_per_unit={requests}, shadow_mode: {}, quota_mode: {}",
                        node.full_key, limit.stats_suffix, node.shadow_mode, node.quota_mode
                    )
                })
            })
            .collect();
        lines.sort();
        lines.iter().fold(String::new(), |mut out, line| {
            let _ = writeln!(out, "{line}");
            out
        })
    }
}

impl Level {
    #[inline]
    fn lookup(&self, entry: &Entry) -> Option<(NodeId, MatchKind)> {
        let rules = self.keys.get(entry.key.as_str())?;
        if let Some(&id) = rules.exact.get(entry.value.as_str()) {
            return Some((id, MatchKind::Exact));
        }
        if let Some((_, id)) = rules
            .wildcards
            .iter()
            .find(|(p, _)| p.matches(&entry.value))
        {
            return Some((*id, MatchKind::Wildcard));
        }
        rules.default.map(|id| (id, MatchKind::Default))
    }
}

#[derive(Clone)]
struct Path {
    /// `CACHE_KEY_PREFIX`.
    prefix: String,
    domain: String,
    /// The keys of the rules from the domain down to this one.
    keys: Vec<String>,
    full_key: String,
    /// Where the rule is in its domain's YAML: `descriptors[0].descriptors[2]`.
    yaml: String,
    share_threshold: bool,
    value_to_metric: bool,
}
