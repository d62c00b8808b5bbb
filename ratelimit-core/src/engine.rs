//! One configuration compiled, with what deciding needs next to it; matching, keys and
//! the decision are in [`crate::plan`].

use std::sync::Arc;

use crate::local_cache::OverLimitCache;
use crate::rules::RuleSet;
use crate::settings::Settings;
use crate::stats::{Counter, StatsRegistry};

/// One configuration, compiled, with what deciding needs next to it.
#[derive(Debug)]
pub(crate) struct Engine {
    pub rules: RuleSet,
    pub settings: Settings,
    pub stats: Arc<StatsRegistry>,
    pub global_shadow: Arc<Counter>,
    pub local_cache: Option<Arc<OverLimitCache>>,
}
