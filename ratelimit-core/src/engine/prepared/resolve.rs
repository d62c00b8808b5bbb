//! What a prepared check's keys resolve to in one configuration: the rule they match
//! whatever their values, and what a call needs of its limits.

use smallvec::SmallVec;

use super::{Kind, One, PrepareError};
use crate::engine::Engine;
use crate::engine::status::near_limit;
use crate::rules::NodeId;
use crate::rules::config::Limit;

impl One {
    pub(super) fn of(engine: &Engine, node: NodeId, which: u16) -> One {
        let rule = engine.rules.node(node);
        let limit = &rule.limits[usize::from(which)];
        let stats = limit.stats.clone().expect("counted limits have statistics");
        let applied = engine.applied_node(rule, which, &stats);
        let near = near_limit(applied.bound, engine.settings.near_limit_ratio);
        One {
            node,
            which,
            counting: applied.counting,
            requests_per_unit: applied.requests_per_unit,
            bounds: (applied.bound, near),
            shadow: applied.shadow,
            stats,
        }
    }
}

/// The rule descriptors of `keys` match in `domain`, whatever their values.
pub(super) fn find(
    engine: &Engine,
    domain: &str,
    keys: &[Box<str>],
) -> Result<NodeId, PrepareError> {
    let rules = &engine.rules;
    let mut level = rules
        .domain(domain)
        .ok_or_else(|| PrepareError::UnknownDomain(domain.to_owned()))?;
    let no_rule = || PrepareError::NoRule {
        domain: domain.to_owned(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
    };
    let mut found = None;
    for key in keys {
        if let Some(id) = found {
            level = rules.children(id).ok_or_else(no_rule)?;
        }
        match rules.key_only(level, key) {
            Ok(Some(id)) => found = Some(id),
            Ok(None) => return Err(no_rule()),
            Err(valued) => {
                return Err(PrepareError::DependsOnValues {
                    domain: domain.to_owned(),
                    key: key.to_string(),
                    path: rules.node(valued).yaml_path.to_string(),
                });
            }
        }
    }
    found.ok_or_else(no_rule)
}

impl Kind {
    /// What the rule `id` does to a descriptor that matches it alone.
    pub(super) fn of(engine: &Engine, domain: &str, id: NodeId) -> Result<Kind, PrepareError> {
        let node = engine.rules.node(id);
        let replaced: SmallVec<[&str; 4]> = node
            .limits
            .iter()
            .flat_map(|limit| limit.replaces.iter().map(|name| &**name))
            .collect();
        let kept: SmallVec<[u16; 2]> = (0u16..)
            .zip(node.limits.iter())
            .filter(|(_, limit)| !limit.name.as_deref().is_some_and(|n| replaced.contains(&n)))
            .map(|(which, _)| which)
            .collect();
        let Some(&first) = kept.first() else {
            return Ok(Kind::NoLimit);
        };
        if node.limits[usize::from(first)].limit == Limit::Unlimited {
            return Ok(Kind::Unlimited);
        }
        if node.leased {
            return Err(PrepareError::Concurrency {
                domain: domain.to_owned(),
                path: node.yaml_path.to_string(),
            });
        }
        if node.per_level_stats_key || node.per_level_cache_key {
            return Err(PrepareError::PerValueStatistics {
                domain: domain.to_owned(),
                path: node.yaml_path.to_string(),
            });
        }
        if let [which] = *kept {
            return Ok(Kind::One(One::of(engine, id, which)));
        }
        Ok(Kind::Limited(id, kept))
    }
}
