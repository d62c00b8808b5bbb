//! libyaml's event parser, shared by the passes that read a file before (or beside) the
//! full parse: the nesting bound and error positions.

use std::mem::MaybeUninit;

use libyaml_rs as sys;

/// One event's kind and where it starts (0-based).
pub(super) struct Event {
    pub(super) kind: sys::yaml_event_type_t,
    pub(super) line: usize,
    pub(super) column: usize,
    /// A scalar's text (for scalar events).
    pub(super) scalar: Option<String>,
    /// Whether a scalar was written without quotes, so that YAML resolves its type.
    pub(super) plain: bool,
}

/// libyaml's event parser over `text`, freed on drop.
pub(super) struct Parser<'a> {
    // Boxed: libyaml keeps pointers into the parser, so it must not move.
    sys: Box<MaybeUninit<sys::yaml_parser_t>>,
    _text: &'a str,
}

impl<'a> Parser<'a> {
    pub(super) fn new(text: &'a str) -> Option<Parser<'a>> {
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
    pub(super) fn next(&mut self) -> Option<Event> {
        let mut event = MaybeUninit::<sys::yaml_event_t>::uninit();
        // SAFETY: the parser was initialized; a successful parse initializes `event`,
        // which is read and then freed with `yaml_event_delete`.
        unsafe {
            if sys::yaml_parser_parse(self.sys.as_mut_ptr(), event.as_mut_ptr()).fail {
                return None;
            }
            let event = event.assume_init_mut();
            let scalar = (event.type_ == sys::YAML_SCALAR_EVENT).then(|| {
                let data = event.data.scalar;
                let length = usize::try_from(data.length).unwrap_or(0);
                // SAFETY: a scalar event's value points at `length` bytes it owns.
                let bytes = std::slice::from_raw_parts(data.value, length);
                String::from_utf8_lossy(bytes).into_owned()
            });
            let plain = event.type_ == sys::YAML_SCALAR_EVENT
                && event.data.scalar.style == sys::YAML_PLAIN_SCALAR_STYLE;
            let read = Event {
                kind: event.type_,
                scalar,
                plain,
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
