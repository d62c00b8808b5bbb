//! Refuses YAML nested deeper than any rule file is, before the full parse.
//!
//! The YAML parser's work per token grows with the nesting depth, and the full parse
//! reads a whole document before anything can look at its depth, so a file of deeply
//! nested collections (`[[[[…`, or block collections) would hold a core for seconds.
//! This pass reads the same parser's events and stops as soon as the depth passes the
//! bound, so its cost is bounded by the depth allowed, not by the depth sent. It sees
//! exactly what the parser sees (quotes, comments, block scalars, document markers, a
//! byte-order mark), so no spelling of a deep file slips past it.

use libyaml_rs as sys;

use super::events::Parser;

/// The deepest nesting of collections (block or flow) a rule file may have. Each level
/// of `descriptors` takes two (a list and a map); the YAML deserializer stops at 128.
pub const MAX_DEPTH: usize = 100;

/// The 1-based line and column where the first document's nesting first goes deeper
/// than `max`; `None` when it does not, or when the text is not YAML (the full parse
/// reports that).
pub fn too_deep(text: &str, max: usize) -> Option<(usize, usize)> {
    let mut parser = Parser::new(text)?;
    let mut depth = 0usize;
    loop {
        let event = parser.next()?;
        match event.kind {
            sys::YAML_SEQUENCE_START_EVENT | sys::YAML_MAPPING_START_EVENT => {
                depth += 1;
                if depth > max {
                    return Some((event.line + 1, event.column + 1));
                }
            }
            sys::YAML_SEQUENCE_END_EVENT | sys::YAML_MAPPING_END_EVENT => {
                depth = depth.saturating_sub(1);
            }
            sys::YAML_DOCUMENT_END_EVENT | sys::YAML_STREAM_END_EVENT => return None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_block_and_flow_nesting() {
        assert_eq!(too_deep("a: [[[1]]]\n", 4), None);
        assert_eq!(too_deep("a: [[[[1]]]]\n", 4), Some((1, 7)));
        assert_eq!(too_deep("a:\n  - {b: [{c: [1]}]}\n", 4), Some((2, 10)));
        assert_eq!(too_deep(&"[".repeat(200_000), 64), Some((1, 65)));
        assert_eq!(
            too_deep("a: [\n", 4),
            None,
            "syntax errors are the parse's to report"
        );
    }

    #[test]
    fn no_spelling_of_a_deep_document_slips_past() {
        let deep = format!("{}{}", "[".repeat(70), "]".repeat(70));
        let spellings = [
            format!("--- {deep}"),
            format!("\u{feff}{deep}"),
            format!("descriptors:\n  - key: |\n    value: {deep}\n"),
            format!("a: x - '\nb: {deep}\nc: it's\n"),
            format!("a: '[[' # ]]]]\nb: \"]]\"\nc: {deep}\n"),
        ];
        for text in spellings {
            assert!(too_deep(&text, 64).is_some(), "{text:?}");
        }
        let quoted = format!("a: '{deep}'\nb: |\n  {deep}\n# {deep}\n");
        assert_eq!(too_deep(&quoted, 3), None);
    }
}
