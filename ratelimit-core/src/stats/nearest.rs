//! The counters nearest their limits: a few entries, updated by decisions that reach
//! three quarters of a limit, never waiting for a lock (a busy moment skips an update).

use std::sync::Mutex;

/// Entries kept.
pub const NEAREST_KEPT: usize = 10;

/// One counter near (or over) its limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Near {
    /// The counter's key.
    pub key: String,
    /// Its count after the decision.
    pub count: u64,
    /// The limit it counts against.
    pub limit: u32,
    /// When its window ends (unix seconds).
    pub window_end: u64,
}

impl Near {
    fn ratio(&self) -> f64 {
        self.count as f64 / f64::from(self.limit.max(1))
    }
}

/// The counters nearest their limits.
#[derive(Debug, Default)]
pub struct Nearest {
    entries: Mutex<Vec<Near>>,
}

impl Nearest {
    /// Whether [`Nearest::observe`] would consider a counter at `count` of `limit`: at
    /// least three quarters of it.
    pub fn is_near(count: u64, limit: u32) -> bool {
        count.saturating_mul(4) >= u64::from(limit).saturating_mul(3)
    }

    /// Records a counter after a decision, if it is at least three quarters of `limit`.
    pub fn observe(&self, key: &str, count: u64, limit: u32, window_end: u64) {
        if !Nearest::is_near(count, limit) {
            return;
        }
        let Ok(mut entries) = self.entries.try_lock() else {
            return;
        };
        let candidate = Near {
            key: key.to_owned(),
            count,
            limit,
            window_end,
        };
        if let Some(same) = entries.iter_mut().find(|e| e.key == key) {
            *same = candidate;
            return;
        }
        if entries.len() < NEAREST_KEPT {
            entries.push(candidate);
            return;
        }
        let lowest = entries
            .iter_mut()
            .min_by(|a, b| {
                (a.window_end, a.ratio())
                    .partial_cmp(&(b.window_end, b.ratio()))
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
            .expect("a full list");
        if lowest.window_end < window_end || lowest.ratio() < candidate.ratio() {
            *lowest = candidate;
        }
    }

    /// The entries whose window has not ended at `now`, nearest first.
    pub fn read(&self, now: u64) -> Vec<Near> {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.retain(|e| e.window_end > now);
        let mut out = entries.clone();
        out.sort_by(|a, b| {
            b.ratio()
                .partial_cmp(&a.ratio())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_counters_are_kept_and_bounded() {
        let nearest = Nearest::default();
        nearest.observe("low", 1, 10, 100);
        assert!(nearest.read(0).is_empty(), "below three quarters");
        for i in 0..30u64 {
            nearest.observe(&format!("k{i}"), 8 + i, 10, 100);
        }
        nearest.observe("k29", 50, 10, 100);
        let read = nearest.read(0);
        assert_eq!(read.len(), NEAREST_KEPT);
        assert_eq!((read[0].key.as_str(), read[0].count), ("k29", 50));
        assert!(read.windows(2).all(|w| w[0].ratio() >= w[1].ratio()));
        assert!(
            nearest.read(100).is_empty(),
            "windows that ended are dropped"
        );
    }
}
