//! How a window's quota is split between the Envoys that share a Rate Limit Quota
//! Service bucket: in proportion to each one's recent demand, with a floor so that an
//! Envoy that was idle can start again.

/// Splits `quota` among Envoys whose recent demands are `demands`: each gets at least
/// `floor` while `quota` allows it (`quota / n` otherwise), and what is left is split in
/// proportion to demand (evenly when nobody asked for anything). Shares are rounded down,
/// so their sum never exceeds `quota`.
pub fn shares(quota: u64, demands: &[u64], floor: u64) -> Vec<u64> {
    let n = demands.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let base = floor.min(quota / n);
    let rest = quota - base * n;
    let total: u128 = demands.iter().map(|&d| u128::from(d)).sum();
    demands
        .iter()
        .map(|&demand| {
            let part = match total {
                0 => rest / n,
                total => (u128::from(rest) * u128::from(demand) / total) as u64,
            };
            base + part
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shares_follow_demand_above_the_floor() {
        assert_eq!(shares(100, &[300, 100], 10), [70, 30]);
        assert_eq!(
            shares(100, &[0, 100], 10),
            [10, 90],
            "an idle Envoy keeps the floor"
        );
        assert_eq!(shares(100, &[0, 0], 10), [50, 50]);
        assert_eq!(
            shares(5, &[1, 1, 1], 10),
            [1, 1, 1],
            "the floor shrinks to fit"
        );
        assert_eq!(shares(0, &[7], 10), [0]);
        assert!(shares(10, &[], 1).is_empty());
    }

    proptest! {
        #[test]
        fn the_sum_of_shares_never_exceeds_the_quota(
            quota in 0u64..=u64::MAX / 2,
            demands in proptest::collection::vec(0u64..=u64::MAX, 1..16),
            floor in 0u64..1_000_000,
        ) {
            let split = shares(quota, &demands, floor);
            prop_assert_eq!(split.len(), demands.len());
            let sum: u128 = split.iter().map(|&s| u128::from(s)).sum();
            prop_assert!(sum <= u128::from(quota), "{:?} of {}", split, quota);
            let least = floor.min(quota / demands.len() as u64);
            prop_assert!(split.iter().all(|&s| s >= least));
            // More demand never gets less.
            for (a, b) in demands.iter().zip(&split).flat_map(|x| demands.iter().zip(&split).map(move |y| (x, y))) {
                if a.0 > b.0 {
                    prop_assert!(a.1 >= b.1);
                }
            }
        }
    }
}
