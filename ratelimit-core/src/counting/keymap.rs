//! A string-keyed map that scans when small and hashes when large.

use std::collections::HashMap;

use foldhash::fast::RandomState;

/// Up to this many keys, comparing strings in order beats hashing the probe.
const SCAN_LIMIT: usize = 8;

/// An immutable map from strings, built once from pairs.
#[derive(Debug)]
pub(crate) enum KeyMap<V> {
    Few(Vec<(Box<str>, V)>),
    Many(HashMap<Box<str>, V, RandomState>),
}

impl<V> KeyMap<V> {
    /// Builds the map; later pairs replace earlier ones with the same key.
    pub fn from_pairs(pairs: Vec<(Box<str>, V)>) -> KeyMap<V> {
        if pairs.len() <= SCAN_LIMIT {
            let mut few: Vec<(Box<str>, V)> = Vec::with_capacity(pairs.len());
            for (key, value) in pairs {
                match few.iter_mut().find(|(k, _)| *k == key) {
                    Some(slot) => slot.1 = value,
                    None => few.push((key, value)),
                }
            }
            KeyMap::Few(few)
        } else {
            KeyMap::Many(pairs.into_iter().collect())
        }
    }

    /// Some value of the map, when it has any.
    pub fn any_value(&self) -> Option<&V> {
        match self {
            KeyMap::Few(pairs) => pairs.first().map(|(_, v)| v),
            KeyMap::Many(map) => map.values().next(),
        }
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &str) -> Option<&V> {
        match self {
            KeyMap::Few(pairs) => pairs
                .iter()
                .find(|(k, _)| same(k.as_bytes(), key.as_bytes()))
                .map(|(_, v)| v),
            KeyMap::Many(map) => map.get(key),
        }
    }
}

/// Whether `a` and `b` are equal: the short strings of rules and descriptors are
/// compared in a few word loads, without calling `memcmp`.
#[inline(always)]
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap_or([0; 8]));
    let half = |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().unwrap_or([0; 4]));
    match n {
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        4..8 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        0..4 => a.iter().zip(b).all(|(x, y)| x == y),
        _ => a == b,
    }
}

impl<V> Default for KeyMap<V> {
    fn default() -> KeyMap<V> {
        KeyMap::Few(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_maps_answer_alike() {
        for n in [0, 3, SCAN_LIMIT, SCAN_LIMIT + 1, 100] {
            let pairs = (0..n)
                .map(|i| (format!("k{i}").into_boxed_str(), i))
                .collect();
            let map = KeyMap::from_pairs(pairs);
            assert_eq!(matches!(map, KeyMap::Few(_)), n <= SCAN_LIMIT);
            for i in 0..n {
                assert_eq!(map.get(&format!("k{i}")), Some(&i));
            }
            assert_eq!(map.get("absent"), None);
        }
        let replaced = KeyMap::from_pairs(vec![("a".into(), 1), ("a".into(), 2)]);
        assert_eq!(replaced.get("a"), Some(&2));
    }

    #[test]
    fn short_strings_compare_like_slices() {
        let text = "abcdefghijklmnopqrstuvwxyz0123456789";
        for n in 0..text.len() {
            let a = &text.as_bytes()[..n];
            assert!(same(a, a));
            for at in 0..n {
                let mut b = a.to_vec();
                b[at] ^= 1;
                assert!(!same(a, &b), "{n} {at}");
            }
            assert!(!same(a, &text.as_bytes()[..n + 1]));
        }
    }
}
