//! Settings that apply to every request.

use crate::model::request::RequestBounds;

/// Settings that apply to every request (envoyproxy/ratelimit's environment variables of
/// the same names).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `NEAR_LIMIT_RATIO`: share of the limit above which hits count as `near_limit`.
    pub near_limit_ratio: f32,
    /// `CACHE_KEY_PREFIX`: prepended to every counter key.
    pub cache_key_prefix: String,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when some descriptor of a request would
    /// go over its limit, leave the counters of the others alone.
    pub stop_cache_key_increment_when_overlimit: bool,
    /// `SHADOW_MODE`: answer `OK` overall even when over limit (statuses keep the truth).
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is a quota; the request is over limit only when
    /// all of them are.
    pub quota_mode: bool,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: with a remote store ([`crate::Limiter::plan`]), remember
    /// counters that went over their limit and answer them without the store until their
    /// window ends. 0 turns it off.
    pub local_cache_size_in_bytes: usize,
    /// `MAX_STAT_KEYS`: distinct statistic names built from request data (unknown
    /// domains, `detailed_metric`, `value_to_metric`, limit overrides) that are kept;
    /// later ones fold into one `_overflow` name per rule.
    pub max_stat_keys: usize,
    /// Bounds on request names and addends; a request past one is refused.
    pub bounds: RequestBounds,
    /// Fill [`crate::Response::policies`] with every limit that applied (what
    /// [`crate::HeaderFormat::IetfDraft11`] needs); off, responses skip that work.
    pub report_policies: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            near_limit_ratio: 0.8,
            cache_key_prefix: String::new(),
            stop_cache_key_increment_when_overlimit: false,
            shadow_mode: false,
            quota_mode: false,
            local_cache_size_in_bytes: 0,
            max_stat_keys: crate::stats::DEFAULT_MAX_STAT_KEYS,
            bounds: RequestBounds::default(),
            report_policies: false,
        }
    }
}
