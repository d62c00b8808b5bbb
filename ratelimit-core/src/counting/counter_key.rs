//! Which counter a limit counts in, as a store sees it.
//!
//! A counter is its limit (the cache-key prefix, the domain, the entries' keys and the
//! limit's algorithm and window, hashed once when the rules are compiled), the start of
//! its window, and the request's values. The in-process stores key counters by these
//! parts and never build a string; the remote stores use the text envoyproxy/ratelimit
//! names the counter by, which a key writes on demand.

use std::cell::RefCell;
use std::hash::{BuildHasher, Hasher};

use foldhash::fast::FixedState;
use smallvec::SmallVec;

use crate::counting::keymap::same;
use crate::model::request::Entry;

/// Ends each value of a joined list, and each part of a limit's identity: no UTF-8 string
/// holds this byte, so no two lists join alike.
const SEPARATOR: u8 = 0xff;

/// The fixed seed of limit identities: one limit keeps its identity across reloads.
const IDENTITY_SEED: u64 = 0x5241_5445_4c49_4d54;

thread_local! {
    /// Where [`CounterKey::with_text`] writes a key that is not already text.
    static TEXT: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The identity of a limit: a hash of the parts of its counters' keys that the rules fix.
/// An override limit of the same keys and window has the same identity as a configured
/// `rate_limit`, so the two share a counter, as their upstream keys do.
pub(crate) fn limit_identity<'a>(
    prefix: &'a str,
    domain: &'a str,
    keys: impl IntoIterator<Item = &'a str>,
    suffix: &'a str,
) -> u64 {
    let mut hasher = FixedState::with_seed(IDENTITY_SEED).build_hasher();
    for part in [prefix, domain].into_iter().chain(keys).chain([suffix]) {
        hasher.write(part.as_bytes());
        hasher.write_u8(SEPARATOR);
    }
    hasher.finish()
}

/// The request's part of a counter: the values it counts under, in order.
#[derive(Clone, Debug)]
pub(crate) enum Values<'a> {
    /// Each entry's value.
    Of(&'a [Entry]),
    /// Listed (a rule that shares a counter across a wildcard counts under its pattern).
    Listed(Vec<&'a str>),
    /// Given as they are (a prepared check's).
    Strs(&'a [&'a str]),
    /// Joined, each followed by [`SEPARATOR`]: an [`crate::Increment`]'s.
    Joined(&'a [u8]),
}

impl Values<'_> {
    fn for_each(&self, mut f: impl FnMut(&[u8]) -> bool) -> bool {
        match self {
            Values::Of(entries) => entries.iter().all(|e| f(e.value.as_bytes())),
            Values::Listed(values) => values.iter().all(|v| f(v.as_bytes())),
            Values::Strs(values) => values.iter().all(|v| f(v.as_bytes())),
            Values::Joined(joined) => joined
                .split_inclusive(|&b| b == SEPARATOR)
                .all(|value| f(&value[..value.len() - 1])),
        }
    }

    /// The one value, when there is one and it is at hand (not joined): most keys.
    #[inline(always)]
    fn single(&self) -> Option<&[u8]> {
        match self {
            Values::Of([entry]) => Some(entry.value.as_bytes()),
            Values::Strs([value]) => Some(value.as_bytes()),
            _ => None,
        }
    }

    /// Feeds the values to `hasher`, alike whatever their form. (The hashers used here
    /// mix each write's length in, so values need no separator to hash apart.)
    #[inline(always)]
    pub fn hash_into(&self, hasher: &mut impl Hasher) {
        match self.single() {
            Some(value) => hasher.write(value),
            None => self.hash_each(hasher),
        }
    }

    fn hash_each(&self, hasher: &mut impl Hasher) {
        self.for_each(|value| {
            hasher.write(value);
            true
        });
    }

    /// The values, joined.
    pub fn join(&self) -> Box<[u8]> {
        if let Values::Joined(joined) = self {
            return (*joined).into();
        }
        let mut out = SmallVec::new();
        self.join_onto(&mut out);
        out.into_vec().into_boxed_slice()
    }

    /// Appends the values, joined, to `out`: each value in one copy (extending by an
    /// iterator of bytes copies them one at a time).
    fn join_onto(&self, out: &mut SmallVec<[u8; 24]>) {
        self.for_each(|value| {
            out.extend_from_slice(value);
            out.push(SEPARATOR);
            true
        });
    }

    /// The values joined into `out` and their length, or `None`, with `out` in any state,
    /// when they do not fit.
    pub fn join_into(&self, out: &mut [u8]) -> Option<usize> {
        let mut len = 0;
        let fits = self.for_each(|value| {
            let Some(to) = out.get_mut(len..len + value.len() + 1) else {
                return false;
            };
            to[..value.len()].copy_from_slice(value);
            to[value.len()] = SEPARATOR;
            len += value.len() + 1;
            true
        });
        fits.then_some(len)
    }

    /// Whether `joined` holds the same values.
    #[inline]
    pub fn matches(&self, joined: &[u8]) -> bool {
        if let Some(value) = self.single() {
            let n = value.len();
            return joined.len() == n + 1 && joined[n] == SEPARATOR && same(&joined[..n], value);
        }
        let mut rest = joined;
        let mut next = |value: &[u8]| match rest.get(value.len()) {
            Some(&SEPARATOR) if same(&rest[..value.len()], value) => {
                rest = &rest[value.len() + 1..];
                true
            }
            _ => false,
        };
        let all = match self {
            Values::Joined(own) => return *own == joined,
            // The common form, without the closure of `for_each`.
            Values::Of(entries) => entries.iter().all(|e| next(e.value.as_bytes())),
            Values::Listed(values) => values.iter().all(|v| next(v.as_bytes())),
            Values::Strs(values) => values.iter().all(|v| next(v.as_bytes())),
        };
        all && rest.is_empty()
    }
}

/// One counter, as a [`crate::CounterStore`] is asked about it.
pub struct CounterKey<'a> {
    /// The limit's identity ([`limit_identity`]).
    pub(crate) identity: u64,
    /// The start of the counter's window (unix seconds); 0 for a token bucket.
    pub(crate) start: u64,
    pub(crate) values: Values<'a>,
    text: Text<'a>,
}

enum Text<'a> {
    Built(&'a str),
    Lazy(&'a dyn Fn(&mut String)),
}

impl std::fmt::Debug for CounterKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_text(|text| f.debug_tuple("CounterKey").field(&text).finish())
    }
}

impl<'a> CounterKey<'a> {
    /// A key whose text `write` produces when a store asks for it.
    pub(crate) fn new(
        identity: u64,
        start: u64,
        values: Values<'a>,
        write: &'a dyn Fn(&mut String),
    ) -> CounterKey<'a> {
        CounterKey {
            identity,
            start,
            values,
            text: Text::Lazy(write),
        }
    }

    /// Calls `f` with the counter's key as envoyproxy/ratelimit names it, byte for byte:
    /// what a store keyed by strings (the proxy-wasm filter's shared data) keys it by.
    pub fn with_text<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self.text {
            Text::Built(text) => f(text),
            Text::Lazy(write) => TEXT.with(|buffer| match buffer.try_borrow_mut() {
                Ok(mut buffer) => {
                    buffer.clear();
                    write(&mut buffer);
                    f(&buffer)
                }
                Err(_) => {
                    let mut own = String::new();
                    write(&mut own);
                    f(&own)
                }
            }),
        }
    }

    /// The counter's key as text, in `out` (see [`CounterKey::with_text`]).
    pub fn write_text(&self, out: &mut String) {
        match self.text {
            Text::Built(text) => out.push_str(text),
            Text::Lazy(write) => write(out),
        }
    }

    /// A key of no limit whose one value is `text`, and whose text is `text` too.
    #[cfg(test)]
    pub(crate) fn of_text(text: &'a str) -> CounterKey<'a> {
        CounterKey {
            identity: 0,
            start: 0,
            values: Values::Listed(vec![text]),
            text: Text::Built(text),
        }
    }
}

/// A counter's parts, owned: what an [`crate::Increment`] carries so that a
/// [`crate::MemoryStore`] finds the counter the in-process decision counts in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CounterId {
    identity: u64,
    start: u64,
    /// Joined; inline when short (most are: one value), so that planning a remote
    /// store's counter does not allocate for it.
    values: SmallVec<[u8; 24]>,
}

impl CounterId {
    /// The counter of the limit `identity` whose window starts at `start` (0 for a
    /// bucket), for `values`.
    pub fn new(identity: u64, start: u64, values: &Values<'_>) -> CounterId {
        let mut joined = SmallVec::new();
        values.join_onto(&mut joined);
        CounterId {
            identity,
            start,
            values: joined,
        }
    }

    /// This id made the one of `key`'s counter, in place.
    pub fn refill(&mut self, key: &CounterKey<'_>) {
        self.identity = key.identity;
        self.start = key.start;
        self.values.clear();
        key.values.join_onto(&mut self.values);
    }

    /// The key of this counter, whose text is `text`.
    pub fn key<'a>(&'a self, text: &'a str) -> CounterKey<'a> {
        CounterKey {
            identity: self.identity,
            start: self.start,
            values: Values::Joined(&self.values),
            text: Text::Built(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(values: &[&str]) -> Vec<Entry> {
        values
            .iter()
            .map(|v| Entry {
                key: "k".into(),
                value: (*v).into(),
            })
            .collect()
    }

    fn hash(values: &Values<'_>) -> u64 {
        let mut hasher = FixedState::with_seed(1).build_hasher();
        values.hash_into(&mut hasher);
        hasher.finish()
    }

    #[test]
    fn every_form_of_the_same_values_hashes_joins_and_matches_alike() {
        let of = entries(&["/api", "alice", ""]);
        let forms = [Values::Of(&of), Values::Listed(vec!["/api", "alice", ""])];
        let joined = forms[0].join();
        let all = [forms[0].clone(), forms[1].clone(), Values::Joined(&joined)];
        for values in &all {
            assert_eq!(hash(values), hash(&all[0]));
            assert_eq!(values.join(), joined);
            assert!(values.matches(&joined));
        }
    }

    #[test]
    fn values_that_concatenate_alike_are_still_different_counters() {
        let one = entries(&["a_b", "c"]);
        let other = entries(&["a", "b_c"]);
        let (one, other) = (Values::Of(&one), Values::Of(&other));
        assert!(!one.matches(&other.join()));
        assert_ne!(hash(&one), hash(&other));
        let shorter = entries(&["a_b"]);
        assert!(!Values::Of(&shorter).matches(&one.join()));
        assert!(!one.matches(&Values::Of(&shorter).join()));
    }

    #[test]
    fn a_limit_identity_depends_on_every_fixed_part() {
        let base = limit_identity("p", "d", ["k1", "k2"], "");
        assert_eq!(base, limit_identity("p", "d", ["k1", "k2"], ""));
        for other in [
            limit_identity("", "d", ["k1", "k2"], ""),
            limit_identity("p", "e", ["k1", "k2"], ""),
            limit_identity("p", "d", ["k1"], ""),
            limit_identity("p", "d", ["k1", "k2"], "sw60"),
            limit_identity("p", "d", ["k1k2"], ""),
        ] {
            assert_ne!(base, other);
        }
    }
}
