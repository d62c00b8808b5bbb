//! Refuses YAML nested deeper than any rule file is, before the full parse.
//!
//! The YAML parser's work per token grows with the nesting depth, and the full parse
//! reads a whole document before anything can look at its depth, so a file of deeply
//! nested collections (`[[[[…`, or block collections) would hold a core for seconds.
//! This pass reads the same parser's events and stops as soon as the depth passes the
//! bound, so its cost is bounded by the depth allowed, not by the depth sent. It sees
//! exactly what the parser sees (quotes, comments, block scalars, document markers, a
//! byte-order mark), so no spelling of a deep file slips past it.

use std::mem::MaybeUninit;

use libyaml_rs as sys;

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

/// One event's kind and where it starts (0-based).
struct Event {
    kind: sys::yaml_event_type_t,
    line: usize,
    column: usize,
}

/// libyaml's event parser over `text`, freed on drop.
struct Parser<'a> {
    // Boxed: libyaml keeps pointers into the parser, so it must not move.
    sys: Box<MaybeUninit<sys::yaml_parser_t>>,
    _text: &'a str,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Option<Parser<'a>> {
        let mut sys = Box::new(MaybeUninit::<sys::yaml_parser_t>::uninit());
        // SAFETY: the parser is initialized in place before any other use, and the
        // input outlives it (`_text` borrows it for the parser's life).
        unsafe {
            if sys::yaml_parser_initialize(sys.as_mut_ptr()).fail {
                return None;
            }
            sys::yaml_parser_set_encoding(sys.as_mut_ptr(), sys::YAML_UTF8_ENCODING);
            sys::yaml_parser_set_input_string(sys.as_mut_ptr(), text.as_ptr(), text.len() as u64);
        }
        Some(Parser { sys, _text: text })
    }

    /// The next event, or `None` on a syntax error.
    fn next(&mut self) -> Option<Event> {
        let mut event = MaybeUninit::<sys::yaml_event_t>::uninit();
        // SAFETY: the parser was initialized; a successful parse initializes `event`,
        // which is read and then freed with `yaml_event_delete`.
        unsafe {
            if sys::yaml_parser_parse(self.sys.as_mut_ptr(), event.as_mut_ptr()).fail {
                return None;
            }
            let event = event.assume_init_mut();
            let read = Event {
                kind: event.type_,
                line: usize::try_from(event.start_mark.line).unwrap_or(usize::MAX),
                column: usize::try_from(event.start_mark.column).unwrap_or(usize::MAX),
            };
            sys::yaml_event_delete(event);
            Some(read)
        }
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: the parser was initialized in `new` and is deleted once.
        unsafe { sys::yaml_parser_delete(self.sys.as_mut_ptr()) }
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
