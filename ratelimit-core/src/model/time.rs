//! Time as the engine takes it: a moment in unix milliseconds (what sliding windows and
//! token buckets count in; fixed windows read its seconds), and the options a decision or
//! a plan is made with at that moment.

use crate::engine::PlanBuffers;

/// A moment, in milliseconds since the unix epoch. The engine reads no clock: every call
/// is given its moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// The moment `secs` seconds after the epoch.
    pub const fn from_secs(secs: u64) -> UnixMillis {
        UnixMillis(secs.saturating_mul(1_000))
    }

    /// Its milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// A decision at this moment as one of `deciders` that share every limit, each
    /// allowing its share (`requests_per_unit / deciders`, rounded up) against counters of
    /// its own: a server's fallback while the store its fleet shares is unavailable.
    pub const fn shared_by(self, deciders: u32) -> Decide {
        Decide { at: self, deciders }
    }

    /// A plan at this moment made in the buffers an earlier plan left
    /// ([`crate::Plan::decide_keeping_buffers`]): its vector and key strings are reused.
    pub fn reusing(self, buffers: PlanBuffers) -> Planning {
        Planning { at: self, buffers }
    }
}

/// How [`crate::Limiter::should_rate_limit`] decides: at a moment, alone (from a
/// [`UnixMillis`]) or as a share ([`UnixMillis::shared_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decide {
    pub(crate) at: UnixMillis,
    /// Deciders sharing every limit; 1 (or 0) decides alone.
    pub(crate) deciders: u32,
}

impl From<UnixMillis> for Decide {
    fn from(at: UnixMillis) -> Decide {
        at.shared_by(1)
    }
}

/// How [`crate::Limiter::plan`] plans: at a moment, in new buffers (from a
/// [`UnixMillis`]) or in reused ones ([`UnixMillis::reusing`]).
#[derive(Debug)]
pub struct Planning {
    pub(crate) at: UnixMillis,
    pub(crate) buffers: PlanBuffers,
}

impl From<UnixMillis> for Planning {
    fn from(at: UnixMillis) -> Planning {
        at.reusing(PlanBuffers::default())
    }
}
