//! The one clock of the services: unix time from the system's wall clock. The engine
//! reads no clock: every decision is given its time, from here.

use std::time::{SystemTime, UNIX_EPOCH};

/// The current unix time in seconds.
pub fn unix_now() -> u64 {
    unix_now_ms() / 1_000
}

/// The current unix time in milliseconds (what sliding windows and buckets count in).
pub fn unix_now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// `time` in unix milliseconds (0 before the epoch).
#[inline]
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
