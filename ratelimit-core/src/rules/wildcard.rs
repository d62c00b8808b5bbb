//! `*` wildcards in descriptor values.

/// A descriptor value pattern in which each `*` matches any run of characters (possibly
/// empty). The pattern is anchored at both ends: `/api/*/action` matches
/// `/api/123/action` but not `/api/123/other` nor `x/api/1/action`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    text: Box<str>,
    prefix_len: usize,
    suffix_start: usize,
}

impl Pattern {
    /// Compiles `text`; returns `None` when it holds no `*` (an exact value).
    pub fn new(text: &str) -> Option<Pattern> {
        let first = text.find('*')?;
        let last = text.rfind('*')?;
        Some(Pattern {
            text: text.into(),
            prefix_len: first,
            suffix_start: last + 1,
        })
    }

    /// The pattern as written in the configuration.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `value` matches the whole pattern.
    pub fn matches(&self, value: &str) -> bool {
        let prefix = &self.text[..self.prefix_len];
        let suffix = &self.text[self.suffix_start..];
        if value.len() < prefix.len() + suffix.len()
            || !value.starts_with(prefix)
            || !value.ends_with(suffix)
        {
            return false;
        }
        // Between the first and the last `*`, each literal segment is searched leftmost
        // in order: with `*` as the only operator, taking the earliest occurrence never
        // loses a match that a later one would find.
        let mut rest = &value[prefix.len()..value.len() - suffix.len()];
        let middle = if self.suffix_start - 1 > self.prefix_len {
            &self.text[self.prefix_len + 1..self.suffix_start - 1]
        } else {
            ""
        };
        for segment in middle.split('*').filter(|s| !s.is_empty()) {
            match rest.find(segment) {
                Some(at) => rest = &rest[at + segment.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(p: &str, v: &str) -> bool {
        Pattern::new(p).expect("pattern has a star").matches(v)
    }

    #[test]
    fn exact_values_are_not_patterns() {
        assert!(Pattern::new("plain").is_none());
    }

    #[test]
    fn trailing_middle_and_several_stars() {
        assert!(m("foo*", "foo"));
        assert!(m("foo*", "foo1"));
        assert!(!m("foo*", "fo"));
        assert!(m("bar*b", "barb"));
        assert!(m("bar*b", "bar123b"));
        assert!(!m("bar*b", "bara"));
        assert!(!m("bar*b", "xbarb"));
        assert!(m("/api/*/action", "/api/123/action"));
        assert!(!m("/api/*/action", "/api/123/other"));
        assert!(m("foo*bar*baz", "foo-bar-baz"));
        assert!(m("foo*bar*baz", "foobarbaz"));
        assert!(!m("foo*bar*baz", "foobazbar"));
        assert!(m("*", ""));
        assert!(m("**", "anything"));
        assert!(m("a*a", "aa"));
        assert!(!m("a*a", "a"));
        assert!(m("*ab*ab", "abab"));
        assert!(m("*ab*ab", "xabyabab"));
    }

    /// A deliberately naive matcher: tries every split for every star.
    fn reference(p: &[u8], v: &[u8]) -> bool {
        match p.split_first() {
            None => v.is_empty(),
            Some((b'*', rest)) => (0..=v.len()).any(|i| reference(rest, &v[i..])),
            Some((c, rest)) => v.first() == Some(c) && reference(rest, &v[1..]),
        }
    }

    proptest! {
        #[test]
        fn agrees_with_a_naive_matcher(p in "[ab*]{0,7}", v in "[ab]{0,9}") {
            prop_assume!(p.contains('*'));
            prop_assert_eq!(m(&p, &v), reference(p.as_bytes(), v.as_bytes()));
        }
    }
}
