//! Descriptor actions shaped like Envoy's route `rate_limits[].actions`.

use ratelimit_core::{Descriptor, Entry};
use serde::Deserialize;

/// One action: it produces one entry of a descriptor, or nothing.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// `(descriptor_key, <header value>)`; `:path` and `:method` work too.
    RequestHeaders {
        /// The header to read.
        header_name: String,
        /// The entry key.
        descriptor_key: String,
        /// When the header is absent: skip this entry (true) or the whole descriptor (false).
        #[serde(default)]
        skip_if_absent: bool,
    },
    /// `(remote_address, <client address>)` from `x-forwarded-for`'s first hop, else the peer.
    RemoteAddress {},
    /// `(descriptor_key or generic_key, descriptor_value)`.
    GenericKey {
        /// The entry value.
        descriptor_value: String,
        /// The entry key (default `generic_key`).
        #[serde(default)]
        descriptor_key: Option<String>,
    },
    /// `(header_match, descriptor_value)` when the headers match (or, with
    /// `expect_match: false`, when they do not); otherwise no descriptor.
    HeaderValueMatch {
        /// The entry value.
        descriptor_value: String,
        /// Whether a match or a mismatch produces the entry (default true).
        #[serde(default = "yes")]
        expect_match: bool,
        /// Every one must match.
        headers: Vec<HeaderMatcher>,
    },
}

fn yes() -> bool {
    true
}

/// A header condition of `header_value_match`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatcher {
    /// The header.
    pub name: String,
    /// Equal to this.
    #[serde(default)]
    pub exact_match: Option<String>,
    /// Starts with this.
    #[serde(default)]
    pub prefix_match: Option<String>,
    /// Present (true) or absent (false).
    #[serde(default)]
    pub present_match: Option<bool>,
}

impl HeaderMatcher {
    fn matches(&self, value: Option<&str>) -> bool {
        match (
            value,
            &self.exact_match,
            &self.prefix_match,
            self.present_match,
        ) {
            (Some(v), Some(exact), _, _) => v == exact,
            (Some(v), None, Some(prefix), _) => v.starts_with(prefix.as_str()),
            (v, None, None, Some(present)) => v.is_some() == present,
            (Some(_), None, None, None) => true,
            (None, ..) => false,
        }
    }
}

/// Builds the descriptors of a request, as Envoy does: a descriptor whose action finds
/// nothing is left out.
pub fn build(
    descriptors: &[Vec<Action>],
    header: impl Fn(&str) -> Option<String>,
    peer: Option<&str>,
) -> Vec<Descriptor> {
    descriptors
        .iter()
        .filter_map(|actions| {
            let mut entries = Vec::with_capacity(actions.len());
            for action in actions {
                match entry(action, &header, peer) {
                    Produced::Entry(e) => entries.push(e),
                    Produced::Skip => {}
                    Produced::NoDescriptor => return None,
                }
            }
            (!entries.is_empty()).then_some(Descriptor {
                entries,
                limit: None,
                hits_addend: None,
                negative_hits: false,
            })
        })
        .collect()
}

enum Produced {
    Entry(Entry),
    Skip,
    NoDescriptor,
}

fn entry(
    action: &Action,
    header: &impl Fn(&str) -> Option<String>,
    peer: Option<&str>,
) -> Produced {
    let make = |key: &str, value: String| {
        Produced::Entry(Entry {
            key: key.to_owned(),
            value,
        })
    };
    match action {
        Action::RequestHeaders {
            header_name,
            descriptor_key,
            skip_if_absent,
        } => match header(header_name) {
            Some(value) => make(descriptor_key, value),
            None if *skip_if_absent => Produced::Skip,
            None => Produced::NoDescriptor,
        },
        Action::RemoteAddress {} => {
            let forwarded = header("x-forwarded-for")
                .and_then(|v| v.split(',').next().map(|s| s.trim().to_owned()));
            match forwarded.or_else(|| peer.map(str::to_owned)) {
                Some(address) => make("remote_address", address),
                None => Produced::NoDescriptor,
            }
        }
        Action::GenericKey {
            descriptor_value,
            descriptor_key,
        } => make(
            descriptor_key.as_deref().unwrap_or("generic_key"),
            descriptor_value.clone(),
        ),
        Action::HeaderValueMatch {
            descriptor_value,
            expect_match,
            headers,
        } => {
            let matched = headers
                .iter()
                .all(|m| m.matches(header(&m.name).as_deref()));
            if matched == *expect_match {
                make("header_match", descriptor_value.clone())
            } else {
                Produced::NoDescriptor
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actions(json: &str) -> Vec<Vec<Action>> {
        serde_json::from_str(json).unwrap()
    }

    fn pairs(ds: &[Descriptor]) -> Vec<Vec<(String, String)>> {
        ds.iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn envoy_action_semantics() {
        let config = actions(
            r#"[
              [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}],
              [{"generic_key": {"descriptor_value": "all"}}, {"remote_address": {}}],
              [{"request_headers": {"header_name": ":path", "descriptor_key": "path"}},
               {"request_headers": {"header_name": "x-missing", "descriptor_key": "m", "skip_if_absent": true}}],
              [{"header_value_match": {"descriptor_value": "api", "headers": [{"name": ":path", "prefix_match": "/api"}]}}],
              [{"header_value_match": {"descriptor_value": "not-api", "expect_match": false, "headers": [{"name": ":path", "prefix_match": "/api"}]}}]
            ]"#,
        );
        let headers = |name: &str| match name {
            ":path" => Some("/api/x".to_owned()),
            "x-forwarded-for" => Some("10.0.0.9, 10.0.0.1".to_owned()),
            _ => None,
        };
        let got = pairs(&build(&config, headers, Some("127.0.0.1")));
        let p = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            got,
            vec![
                vec![p("generic_key", "all"), p("remote_address", "10.0.0.9")],
                vec![p("path", "/api/x")],
                vec![p("header_match", "api")],
            ],
            "no x-user: no user descriptor; mismatch expectation: no descriptor"
        );
        let with_user = |name: &str| (name == "x-user").then(|| "alice".to_owned());
        let got = pairs(&build(&config, with_user, Some("192.0.2.1")));
        assert_eq!(got[0], vec![p("user", "alice")]);
        assert_eq!(
            got[1],
            vec![p("generic_key", "all"), p("remote_address", "192.0.2.1")]
        );
        assert_eq!(got.last().unwrap(), &vec![p("header_match", "not-api")]);
    }

    #[test]
    fn unknown_actions_are_refused() {
        assert!(
            serde_json::from_str::<Vec<Vec<Action>>>(r#"[[{"destination_cluster": {}}]]"#).is_err()
        );
    }
}
