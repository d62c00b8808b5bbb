//! A linear pre-scan of YAML text for deep flow nesting (`[[[[…` or `{{{{…`).
//!
//! The YAML parser's time grows with the square of the flow depth, so a 200 KB file of
//! brackets would hold a core for many seconds before the depth is refused. Rules never
//! nest flow collections more than a few levels, so anything past [`MAX_FLOW_DEPTH`] is
//! refused here, before parsing.
//!
//! The scan tells flow indicators from text: brackets inside quoted scalars, comments,
//! block scalars (`|`, `>`) and plain scalars (`a[b`) do not count.

/// The deepest flow nesting a rule file may have.
pub const MAX_FLOW_DEPTH: usize = 64;

/// The 1-based line and column where flow nesting first goes deeper than `max`.
pub fn too_deep(text: &str, max: usize) -> Option<(usize, usize)> {
    Scan {
        bytes: text.as_bytes(),
        i: 0,
        line: 1,
        line_start: 0,
    }
    .run(max)
}

struct Scan<'a> {
    bytes: &'a [u8],
    i: usize,
    line: usize,
    line_start: usize,
}

impl Scan<'_> {
    fn run(&mut self, max: usize) -> Option<(usize, usize)> {
        let mut depth = 0usize;
        // Whether the next significant byte may start a node (where `[`, `{`, quotes,
        // `|` and `>` are indicators rather than text).
        let mut node_start = true;
        // Inside a block scalar: lines more indented than this are its text.
        let mut block_scalar: Option<usize> = None;
        let mut indent = 0;
        while self.i < self.bytes.len() {
            if self.i == self.line_start {
                indent = self.skip_while(|b| b == b' ');
                if let Some(parent) = block_scalar {
                    if self.at_line_end() || indent > parent {
                        self.skip_line();
                        continue;
                    }
                    block_scalar = None;
                }
                node_start |= depth == 0;
                if self.i >= self.bytes.len() {
                    break;
                }
            }
            let b = self.bytes[self.i];
            let spaced =
                self.i == self.line_start || matches!(self.bytes[self.i - 1], b' ' | b'\t');
            match b {
                b'\n' => self.newline(),
                b' ' | b'\t' | b'\r' => self.i += 1,
                b'#' if spaced => self.skip_line(),
                b'\'' | b'"' if node_start => {
                    self.skip_quoted(b);
                    node_start = false;
                }
                b'[' | b'{' if node_start || depth > 0 => {
                    depth += 1;
                    if depth > max {
                        return Some((self.line, self.i - self.line_start + 1));
                    }
                    self.i += 1;
                    node_start = true;
                }
                b']' | b'}' if depth > 0 => {
                    depth -= 1;
                    self.i += 1;
                    node_start = false;
                }
                b',' if depth > 0 => {
                    self.i += 1;
                    node_start = true;
                }
                b'-' | b'?' | b':' if depth > 0 && b == b':' || self.separated(self.i + 1) => {
                    self.i += 1;
                    node_start = true;
                }
                b'|' | b'>' if node_start && depth == 0 => {
                    block_scalar = Some(indent);
                    self.skip_line();
                }
                b'&' | b'!' if node_start => {
                    self.skip_while(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'));
                }
                _ => {
                    self.i += 1;
                    self.skip_plain(depth > 0);
                    node_start = false;
                }
            }
        }
        None
    }

    fn newline(&mut self) {
        self.i += 1;
        self.line += 1;
        self.line_start = self.i;
    }

    fn at_line_end(&self) -> bool {
        matches!(self.bytes.get(self.i), None | Some(b'\n' | b'\r'))
    }

    /// Whether position `i` ends a token: a space, a line end or the end of the text.
    fn separated(&self, i: usize) -> bool {
        matches!(self.bytes.get(i), None | Some(b' ' | b'\t' | b'\r' | b'\n'))
    }

    fn skip_while(&mut self, keep: impl Fn(u8) -> bool) -> usize {
        let start = self.i;
        while self.i < self.bytes.len() && keep(self.bytes[self.i]) {
            self.i += 1;
        }
        self.i - start
    }

    /// Skips the rest of a plain scalar's word: up to a space, a `: ` and, in a flow
    /// collection, a flow indicator.
    fn skip_plain(&mut self, flow: bool) {
        while let Some(&b) = self.bytes.get(self.i) {
            let ends = matches!(b, b' ' | b'\t' | b'\r' | b'\n')
                || (b == b':' && (flow || self.separated(self.i + 1)))
                || (flow && matches!(b, b',' | b'[' | b']' | b'{' | b'}'));
            if ends {
                return;
            }
            self.i += 1;
        }
    }

    fn skip_line(&mut self) {
        self.skip_while(|b| b != b'\n');
        if self.i < self.bytes.len() {
            self.newline();
        }
    }

    /// Skips a quoted scalar, which may span lines: `''` escapes a single quote, `\` any
    /// byte in double quotes.
    fn skip_quoted(&mut self, quote: u8) {
        self.i += 1;
        while self.i < self.bytes.len() {
            match self.bytes[self.i] {
                b'\n' => self.newline(),
                b'\\' if quote == b'"' => self.i += 2,
                b'\'' if quote == b'\'' && self.bytes.get(self.i + 1) == Some(&b'\'') => {
                    self.i += 2;
                }
                b if b == quote => {
                    self.i += 1;
                    return;
                }
                _ => self.i += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_flow_nesting() {
        assert_eq!(too_deep("a: [[[1]]]\n", 3), None);
        assert_eq!(too_deep("a: [[[[1]]]]\n", 3), Some((1, 7)));
        assert_eq!(too_deep("a:\n  - {b: [{c: [1]}]}\n", 3), Some((2, 14)));
        assert_eq!(too_deep(&"[".repeat(200_000), 64), Some((1, 65)));
    }

    #[test]
    fn brackets_in_text_do_not_count() {
        let text = "\
a: '[[[[' # [[[[
b: \"[[\\\"[[\"
c: x[[[[
d: it's [[[[
e: |
  [[[[
  [[[[
f: >-
    {{{{
g: 'multi
  [[[[ line'
h: &anchor [[1]]
";
        assert_eq!(too_deep(text, 2), None);
        assert_eq!(too_deep(&format!("{text}i: [[[1]]]\n"), 2), Some((13, 6)));
    }
}
