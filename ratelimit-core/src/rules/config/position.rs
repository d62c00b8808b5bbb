//! Where a YAML path (`descriptors[0].rate_limit.unit`) stands in a file, for errors
//! found after the parse, on values that no longer carry their position.

use std::collections::HashMap;

use libyaml_rs as sys;

use super::events::{Event, Parser};

/// One open collection, and what is being read in it.
enum Frame {
    /// A map at `prefix`: whether its next scalar is a key, and the path of the entry
    /// whose value comes next.
    Map {
        prefix: String,
        key_next: bool,
        entry: String,
    },
    /// A list at `prefix`, and the index of its next item.
    List { prefix: String, next: usize },
}

/// The 1-based line and column of the node at `path` in the first document (of its key,
/// for a map entry); `None` when the path is not there or the text is not YAML.
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let mut found = None;
    walk(text, |node, event, _| {
        if node == path {
            found = Some((event.line + 1, event.column + 1));
        }
        found.is_none()
    });
    found
}

/// The text of every scalar value written without quotes in the first document, by
/// path (`descriptors[0].value`): what envoyproxy/ratelimit's YAML decoder reads into a
/// string field as written (`0x10`, `True`), and what decides whether a `yes` is a
/// boolean. Map keys are left out.
pub fn plain_scalars(text: &str) -> HashMap<String, String> {
    let mut plain = HashMap::new();
    walk(text, |node, event, key| {
        if !key && event.plain {
            plain.insert(node.to_owned(), event.scalar.clone().unwrap_or_default());
        }
        true
    });
    plain
}

/// Calls `visit(path, event, is_key)` for each node of the first document in order (a map
/// entry's key with the entry's path), until it returns false, the document ends or the
/// text stops being YAML.
fn walk(text: &str, mut visit: impl FnMut(&str, &Event, bool) -> bool) {
    let Some(mut parser) = Parser::new(text) else {
        return;
    };
    let mut stack: Vec<Frame> = Vec::new();
    while let Some(event) = parser.next() {
        let ends = matches!(
            event.kind,
            sys::YAML_MAPPING_END_EVENT | sys::YAML_SEQUENCE_END_EVENT
        );
        // The path of the value this event starts (a map's keys are handled here).
        let node = match stack.last_mut() {
            _ if ends => {
                stack.pop();
                value_read(&mut stack);
                continue;
            }
            Some(Frame::Map {
                prefix,
                key_next: key_next @ true,
                entry,
            }) => {
                let key = event.scalar.clone().unwrap_or_default();
                *entry = if prefix.is_empty() {
                    key
                } else {
                    format!("{prefix}.{key}")
                };
                *key_next = false;
                if !visit(entry, &event, true) {
                    return;
                }
                continue;
            }
            Some(Frame::Map { entry, .. }) => entry.clone(),
            Some(Frame::List { prefix, next }) => {
                *next += 1;
                format!("{prefix}[{}]", *next - 1)
            }
            None => String::new(),
        };
        if !node.is_empty() && !visit(&node, &event, false) {
            return;
        }
        match event.kind {
            sys::YAML_MAPPING_START_EVENT => stack.push(Frame::Map {
                prefix: node,
                key_next: true,
                entry: String::new(),
            }),
            sys::YAML_SEQUENCE_START_EVENT => stack.push(Frame::List {
                prefix: node,
                next: 0,
            }),
            sys::YAML_SCALAR_EVENT | sys::YAML_ALIAS_EVENT => value_read(&mut stack),
            sys::YAML_DOCUMENT_END_EVENT | sys::YAML_STREAM_END_EVENT => return,
            _ => {}
        }
    }
}

/// After a map entry's value: the next scalar is a key again.
fn value_read(stack: &mut [Frame]) {
    if let Some(Frame::Map { key_next, .. }) = stack.last_mut() {
        *key_next = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keys_values_and_list_items() {
        let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minutes\n  - key: b\n    descriptors:\n      - {key: c, value: x}\n";
        assert_eq!(locate(text, "domain"), Some((1, 1)));
        assert_eq!(locate(text, "descriptors[0]"), Some((3, 5)));
        assert_eq!(locate(text, "descriptors[0].rate_limit.unit"), Some((5, 7)));
        assert_eq!(locate(text, "descriptors[1].key"), Some((6, 5)));
        assert_eq!(
            locate(text, "descriptors[1].descriptors[0].value"),
            Some((8, 18))
        );
        assert_eq!(locate(text, "descriptors[2]"), None);
        assert_eq!(locate(text, "nothing"), None);
        assert_eq!(locate("a: [\n", "a"), Some((1, 1)));
    }

    #[test]
    fn plain_scalars_are_kept_as_written_and_quoted_ones_left_out() {
        let text = "domain: d\ndescriptors:\n  - {key: 0x1F, value: \"yes\", shadow_mode: on}\n  - key: k\n    value: True\n";
        let plain = plain_scalars(text);
        assert_eq!(plain["descriptors[0].key"], "0x1F");
        assert_eq!(plain["descriptors[0].shadow_mode"], "on");
        assert_eq!(plain["descriptors[1].value"], "True");
        assert!(!plain.contains_key("descriptors[0].value"), "quoted");
        assert!(!plain.contains_key("descriptors"), "keys are left out");
    }
}
