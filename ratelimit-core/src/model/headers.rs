//! Rate-limit headers in the two formats a host may send: the `RateLimit-Limit`,
//! `-Remaining` and `-Reset` trio (names configurable), or draft-ietf-httpapi-
//! ratelimit-headers-11's `RateLimit-Policy` and `RateLimit` Structured Field lists.

use std::fmt::Write as _;

use crate::model::response::{HeaderNames, Response};

/// Which headers a host adds (`LIMIT_RESPONSE_HEADERS_FORMAT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderFormat {
    /// `ratelimit`: one limit, the most restrictive, in three headers.
    RateLimit(HeaderNames),
    /// `ietf-draft-11`: every limit that applied in `RateLimit-Policy`, the one that
    /// decided in `RateLimit`. The limiter must be built with
    /// [`crate::Settings::report_policies`].
    IetfDraft11,
}

impl HeaderFormat {
    /// `ratelimit` with the default names, or `ietf-draft-11`; `None` for another name.
    pub fn parse(name: &str) -> Option<HeaderFormat> {
        match name {
            "ratelimit" => Some(HeaderFormat::RateLimit(HeaderNames::default())),
            "ietf-draft-11" => Some(HeaderFormat::IetfDraft11),
            _ => None,
        }
    }
}

impl Response {
    /// The headers for this response in `format`; empty when no limit applied.
    pub fn header_pairs(&self, format: &HeaderFormat) -> Vec<(String, String)> {
        match format {
            HeaderFormat::RateLimit(names) => self
                .headers
                .map(|h| {
                    h.pairs(names)
                        .into_iter()
                        .map(|(name, value)| (name.to_owned(), value))
                        .collect()
                })
                .unwrap_or_default(),
            HeaderFormat::IetfDraft11 => {
                // Over its limit first, then the fewest remaining.
                let Some(decided) = self.policies.iter().min_by_key(|p| (!p.over, p.remaining))
                else {
                    return Vec::new();
                };
                let mut policy = String::new();
                for (i, p) in self.policies.iter().enumerate() {
                    if i > 0 {
                        policy.push_str(", ");
                    }
                    push_sf_string(&mut policy, &p.name);
                    let _ = write!(policy, ";q={};w={}", p.quota, p.window);
                }
                let mut current = String::new();
                push_sf_string(&mut current, &decided.name);
                let _ = write!(current, ";r={};t={}", decided.remaining, decided.reset);
                vec![
                    ("RateLimit-Policy".to_owned(), policy),
                    ("RateLimit".to_owned(), current),
                ]
            }
        }
    }
}

/// `text` as a Structured Field String (RFC 8941 §3.3.3): quoted, `"` and `\` escaped,
/// and every character outside printable ASCII replaced by `_`.
fn push_sf_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::response::{Code, Policy};

    fn policy(name: &str, remaining: u64, over: bool) -> Policy {
        Policy {
            name: name.into(),
            quota: 10,
            window: 60,
            remaining,
            reset: 7,
            over,
        }
    }

    #[test]
    fn draft_11_lists_every_policy_and_the_deciding_one() {
        let mut response = Response {
            overall_code: Code::Ok,
            statuses: crate::Statuses::new(),
            headers: None,
            policies: vec![policy("burst", 4, false), policy("da\"ily\u{e9}", 2, false)],
        };
        let pairs = response.header_pairs(&HeaderFormat::IetfDraft11);
        assert_eq!(pairs[0].1, r#""burst";q=10;w=60, "da\"ily_";q=10;w=60"#);
        assert_eq!(pairs[1].1, r#""da\"ily_";r=2;t=7"#);
        response.policies[0].over = true;
        response.policies[0].remaining = 0;
        let pairs = response.header_pairs(&HeaderFormat::IetfDraft11);
        assert_eq!(pairs[1].1, r#""burst";r=0;t=7"#);
        response.policies.clear();
        assert!(response.header_pairs(&HeaderFormat::IetfDraft11).is_empty());
    }
}
