//! memcached's text protocol, as far as counters need it: `incr`, `decr`, `add`, `cas`,
//! `get`, `gets` and `version`, encoded straight into a connection's write buffer, and
//! their replies parsed from its read buffer. A reply says nothing of the command it
//! answers, so each command leaves its [`Kind`] for the parser, in order.
//!
//! Replies are bounded: a line longer than [`MAX_LINE`] or a value longer than
//! [`MAX_VALUE`] is not one the counters ask for, and the connection is failed.

use std::collections::VecDeque;

/// The longest key memcached takes.
pub const MAX_KEY_BYTES: usize = 250;
/// The longest reply line (a `VALUE` line: a key and three numbers).
const MAX_LINE: usize = 1024;
/// The longest value read (counters and bucket times are numbers).
const MAX_VALUE: usize = 64 * 1024;

/// Why a key cannot be sent: it would be refused, or break the command line.
pub fn key_problem(key: &str) -> Option<String> {
    if key.len() > MAX_KEY_BYTES {
        return Some(format!(
            "{} bytes long; memcached takes at most {MAX_KEY_BYTES}",
            key.len()
        ));
    }
    key.bytes().position(|b| b <= b' ' || b == 0x7f).map(|at| {
        format!("byte {at} is a space or a control character, which memcached keys cannot hold")
    })
}

/// What a command's reply looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `incr`, `decr`: the new value or `NOT_FOUND`.
    Change,
    /// `add`, `cas`: `STORED`, `NOT_STORED`, `EXISTS` or `NOT_FOUND`.
    Store,
    /// `get`, `gets` of one key: a `VALUE` block or none, then `END`.
    Retrieve,
    /// `version`.
    Version,
}

/// One reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `incr`/`decr`: the counter's value after the change.
    Number(u64),
    /// `incr`/`decr`/`cas`: no such key; `get`/`gets`: no value.
    NotFound,
    /// `add`/`cas`: stored.
    Stored,
    /// `add`: another client created it first.
    NotStored,
    /// `cas`: another client changed it since `gets`.
    Exists,
    /// `get`/`gets`: the value as a number and its compare-and-swap token (0 for
    /// `get`).
    Found { value: u64, token: u64 },
    /// `get`/`gets`: a value that is not a number (a concurrency limit's lease set), and
    /// its token.
    Text { data: Box<[u8]>, token: u64 },
    /// `version`.
    Version,
    /// An error reply that leaves the connection in step (`SERVER_ERROR ...`, or a
    /// client error to a one-line command such as `incr` of a value that is not a
    /// number).
    Error(String),
}

/// Commands going into a connection's write buffer.
pub struct Commands<'a> {
    out: &'a mut Vec<u8>,
    kinds: &'a mut VecDeque<Kind>,
    count: usize,
}

impl<'a> Commands<'a> {
    /// Commands appended to `out`, each leaving its reply's kind in `kinds`.
    pub fn new(out: &'a mut Vec<u8>, kinds: &'a mut VecDeque<Kind>) -> Commands<'a> {
        Commands {
            out,
            kinds,
            count: 0,
        }
    }

    /// How many commands were written.
    pub fn count(&self) -> usize {
        self.count
    }

    /// `incr key by`.
    pub fn incr(&mut self, key: &str, by: u64) {
        self.change(b"incr ", key, by);
    }

    /// `decr key by`: memcached stops a counter at 0 by itself.
    pub fn decr(&mut self, key: &str, by: u64) {
        self.change(b"decr ", key, by);
    }

    fn change(&mut self, verb: &[u8], key: &str, by: u64) {
        self.head(verb, key);
        self.number(by);
        self.end(Kind::Change);
    }

    /// `add key 0 expiry` with `value`.
    pub fn add(&mut self, key: &str, value: u64, expiry: u64) {
        self.store(b"add ", key, value, expiry, None);
    }

    /// `cas key 0 expiry` with `value`, if the key's token is still `token`.
    pub fn cas(&mut self, key: &str, value: u64, expiry: u64, token: u64) {
        self.store(b"cas ", key, value, expiry, Some(token));
    }

    /// `add key 0 expiry` with the bytes `value`.
    pub fn add_text(&mut self, key: &str, value: &[u8], expiry: u64) {
        self.store_bytes(b"add ", key, value, expiry, None);
    }

    /// `cas key 0 expiry` with the bytes `value`, if the key's token is still `token`.
    pub fn cas_text(&mut self, key: &str, value: &[u8], expiry: u64, token: u64) {
        self.store_bytes(b"cas ", key, value, expiry, Some(token));
    }

    fn store(&mut self, verb: &[u8], key: &str, value: u64, expiry: u64, token: Option<u64>) {
        let mut digits = itoa::Buffer::new();
        self.store_bytes(verb, key, digits.format(value).as_bytes(), expiry, token);
    }

    fn store_bytes(
        &mut self,
        verb: &[u8],
        key: &str,
        value: &[u8],
        expiry: u64,
        token: Option<u64>,
    ) {
        self.head(verb, key);
        self.out.extend_from_slice(b"0 ");
        self.number(expiry);
        self.out.push(b' ');
        self.number(value.len() as u64);
        if let Some(token) = token {
            self.out.push(b' ');
            self.number(token);
        }
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(value);
        self.end(Kind::Store);
    }

    /// `get key`.
    pub fn get(&mut self, key: &str) {
        self.retrieve(b"get ", key);
    }

    /// `gets key`: with its compare-and-swap token.
    pub fn gets(&mut self, key: &str) {
        self.retrieve(b"gets ", key);
    }

    fn retrieve(&mut self, verb: &[u8], key: &str) {
        self.out.extend_from_slice(verb);
        self.out.extend_from_slice(key.as_bytes());
        self.end(Kind::Retrieve);
    }

    /// `version`.
    pub fn version(&mut self) {
        self.out.extend_from_slice(b"version");
        self.end(Kind::Version);
    }

    fn head(&mut self, verb: &[u8], key: &str) {
        self.out.extend_from_slice(verb);
        self.out.extend_from_slice(key.as_bytes());
        self.out.push(b' ');
    }

    fn number(&mut self, number: u64) {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(number).as_bytes());
    }

    fn end(&mut self, kind: Kind) {
        self.out.extend_from_slice(b"\r\n");
        self.kinds.push_back(kind);
        self.count += 1;
    }
}

/// The reply of `kind` at the start of `input` and the bytes it takes, `None` while it
/// is incomplete; an error when it is not a reply to that kind of command (the
/// connection is out of step and must be failed).
pub fn parse(input: &[u8], kind: Kind) -> Result<Option<(Reply, usize)>, String> {
    let Some((line, mut used)) = line(input)? else {
        return Ok(None);
    };
    let reply = match (kind, line) {
        (_, line) if in_step_error(kind, line) => Reply::Error(text(line)),
        (Kind::Change, b"NOT_FOUND") => Reply::NotFound,
        (Kind::Change, digits) => Reply::Number(number(digits).ok_or_else(|| wrong(kind, line))?),
        (Kind::Store, b"STORED") => Reply::Stored,
        (Kind::Store, b"NOT_STORED") => Reply::NotStored,
        (Kind::Store, b"EXISTS") => Reply::Exists,
        (Kind::Store, b"NOT_FOUND") => Reply::NotFound,
        (Kind::Retrieve, b"END") => Reply::NotFound,
        (Kind::Retrieve, line) if line.starts_with(b"VALUE ") => {
            let Some((found, rest)) = value(line, &input[used..])? else {
                return Ok(None);
            };
            used += rest;
            found
        }
        (Kind::Version, line) if line.starts_with(b"VERSION ") => Reply::Version,
        _ => return Err(wrong(kind, line)),
    };
    Ok(Some((reply, used)))
}

/// Whether `line` is an error reply after which the connection is still in step: a
/// server error to anything, and any error to a one-line command. (A client error to a
/// storage command may leave its data line to be read as a command.)
fn in_step_error(kind: Kind, line: &[u8]) -> bool {
    line.starts_with(b"SERVER_ERROR")
        || (kind != Kind::Store && (line == b"ERROR" || line.starts_with(b"CLIENT_ERROR")))
}

/// A `VALUE <key> <flags> <bytes> [<cas>]` line's data block in `rest`, and the `END`
/// after it (one key is asked at a time): the value and the bytes they take.
fn value(header: &[u8], rest: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    let bad = || wrong(Kind::Retrieve, header);
    let mut fields = header.split(|&b| b == b' ').skip(3);
    let length = fields.next().and_then(number).ok_or_else(bad)?;
    let token = fields.next().map_or(Some(0), number).ok_or_else(bad)?;
    let length = usize::try_from(length)
        .ok()
        .filter(|&l| l <= MAX_VALUE)
        .ok_or_else(|| format!("a memcached value of {length} bytes"))?;
    let Some(data) = rest.get(..length + 2) else {
        return Ok(None);
    };
    if !data.ends_with(b"\r\n") {
        return Err(bad());
    }
    match line(&rest[length + 2..])? {
        None => Ok(None),
        Some((b"END", end)) => {
            let data = &data[..length];
            let found = match std::str::from_utf8(data)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                Some(value) => Reply::Found { value, token },
                None => Reply::Text {
                    data: data.into(),
                    token,
                },
            };
            Ok(Some((found, length + 2 + end)))
        }
        Some((other, _)) => Err(wrong(Kind::Retrieve, other)),
    }
}

/// The first line of `input`, without its line end, and its length with it.
fn line(input: &[u8]) -> Result<Option<(&[u8], usize)>, String> {
    match input.iter().take(MAX_LINE).position(|&b| b == b'\n') {
        Some(end) if end > 0 && input[end - 1] == b'\r' => Ok(Some((&input[..end - 1], end + 1))),
        Some(_) => Err(format!(
            "a memcached reply line without \\r: {:?}",
            text(&input[..input.len().min(80)])
        )),
        None if input.len() >= MAX_LINE => Err(format!(
            "a memcached reply line longer than {MAX_LINE} bytes"
        )),
        None => Ok(None),
    }
}

/// A decimal number that fits in 64 bits.
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |number, &digit| {
        let digit = digit.is_ascii_digit().then(|| u64::from(digit - b'0'))?;
        number.checked_mul(10)?.checked_add(digit)
    })
}

fn text(line: &[u8]) -> String {
    String::from_utf8_lossy(line).into_owned()
}

fn wrong(kind: Kind, line: &[u8]) -> String {
    format!("unexpected memcached reply to {kind:?}: {:?}", text(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_memcached_would_refuse_are_named() {
        assert_eq!(key_problem("edge_user_alice_1700000000"), None);
        assert!(key_problem(&"k".repeat(251)).unwrap().contains("251 bytes"));
        assert_eq!(key_problem(&"k".repeat(250)), None);
        for bad in ["a b", "a\tb", "a\r\nget x", "a\u{7f}"] {
            assert!(key_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn commands_are_written_with_their_reply_kinds() {
        let (mut out, mut kinds) = (Vec::new(), VecDeque::new());
        let mut commands = Commands::new(&mut out, &mut kinds);
        commands.incr("a", 3);
        commands.add("a", 12, 3601);
        commands.cas("b", 7, 60, 99);
        commands.gets("b");
        commands.version();
        assert_eq!(commands.count(), 5);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "incr a 3\r\nadd a 0 3601 2\r\n12\r\ncas b 0 60 1 99\r\n7\r\ngets b\r\nversion\r\n"
        );
        assert_eq!(
            Vec::from(kinds),
            [
                Kind::Change,
                Kind::Store,
                Kind::Store,
                Kind::Retrieve,
                Kind::Version
            ]
        );
    }

    #[test]
    fn replies_are_parsed_by_the_kind_asked_for() {
        let whole = |input: &[u8], kind| parse(input, kind).unwrap().unwrap();
        assert_eq!(whole(b"42\r\nrest", Kind::Change), (Reply::Number(42), 4));
        assert_eq!(whole(b"NOT_FOUND\r\n", Kind::Change), (Reply::NotFound, 11));
        assert_eq!(
            whole(b"NOT_STORED\r\n", Kind::Store),
            (Reply::NotStored, 12)
        );
        assert_eq!(whole(b"EXISTS\r\n", Kind::Store).0, Reply::Exists);
        assert_eq!(whole(b"END\r\n", Kind::Retrieve), (Reply::NotFound, 5));
        let block = b"VALUE k 0 2 77\r\n12\r\nEND\r\n";
        let found = Reply::Found {
            value: 12,
            token: 77,
        };
        assert_eq!(whole(block, Kind::Retrieve), (found, block.len()));
        assert_eq!(
            whole(b"VALUE k 0 3\r\nabc\r\nEND\r\n", Kind::Retrieve).0,
            Reply::Text {
                data: (*b"abc").into(),
                token: 0
            }
        );
        assert_eq!(
            whole(b"VERSION 1.6.18\r\n", Kind::Version).0,
            Reply::Version
        );
        let refused = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
        assert!(matches!(whole(refused, Kind::Change).0, Reply::Error(_)));
        assert!(matches!(
            whole(b"SERVER_ERROR out of memory\r\n", Kind::Store).0,
            Reply::Error(_)
        ));
    }

    #[test]
    fn incomplete_replies_wait_for_more() {
        let block = b"VALUE k 0 2 77\r\n12\r\nEND\r\n";
        for end in 0..block.len() {
            assert_eq!(parse(&block[..end], Kind::Retrieve), Ok(None), "{end}");
        }
        assert_eq!(parse(b"12", Kind::Change), Ok(None));
    }

    #[test]
    fn replies_out_of_step_fail_the_connection() {
        for (input, kind) in [
            (&b"STORED\r\n"[..], Kind::Change),
            (b"12\r\n", Kind::Store),
            (b"CLIENT_ERROR bad data chunk\r\n", Kind::Store),
            (b"ERROR\r\n", Kind::Store),
            (b"VALUE k 0 2\r\n12\r\nVALUE k 0 2\r\n", Kind::Retrieve),
            (b"VALUE k 0 2\r\n123\r\nEND\r\n", Kind::Retrieve),
            (b"VALUE k 0 99999999\r\n", Kind::Retrieve),
            (b"-1\r\n", Kind::Change),
            (b"99999999999999999999\r\n", Kind::Change),
            (b"bare\n", Kind::Change),
        ] {
            assert!(parse(input, kind).is_err(), "{:?}", text(input));
        }
        assert!(parse(&[b'1'; MAX_LINE], Kind::Change).is_err());
    }
}
