//! The part of RESP, the Redis protocol, that the counters speak: commands as arrays of
//! bulk strings, and the replies they get (integers, strings, nil, errors, arrays).
//! Replies are bounded: a server that sends more than [`MAX_BULK`] bytes in one string,
//! more than [`MAX_ARRAY`] elements or nesting deeper than [`MAX_DEPTH`] is not one the
//! counters talk to, and the connection is dropped.

use redis::Value;

/// The longest string a reply may carry (counters are numbers; scripts return numbers).
pub const MAX_BULK: usize = 1 << 20;
/// The most elements an array reply may have.
pub const MAX_ARRAY: usize = 4096;
/// The deepest an array reply may nest.
pub const MAX_DEPTH: usize = 4;
/// The longest header line (type byte, length or integer or simple string).
const MAX_LINE: usize = 64 * 1024;

/// A request's replies, in order (a request sends a few commands: kept inline).
pub type Replies = smallvec::SmallVec<[Reply; 4]>;

/// One argument of a command.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// A command's name, its bulk string written ahead.
    Verb(Verb),
    Text(&'a str),
    Int(u64),
}

/// A command's name of at most 9 letters, as its bulk string (`$6\r\nINCRBY\r\n`):
/// the size of a text argument, written in one copy.
#[derive(Debug, Clone, Copy)]
pub struct Verb(&'static [u8]);

impl Verb {
    /// The command's name.
    pub fn name(self) -> &'static str {
        std::str::from_utf8(&self.0[4..self.0.len() - 2]).expect("a verb's name is ASCII")
    }
}

/// The names the counters' commands start with.
pub const INCRBY: Verb = Verb(b"$6\r\nINCRBY\r\n");
pub const EXPIRE: Verb = Verb(b"$6\r\nEXPIRE\r\n");
pub const GET: Verb = Verb(b"$3\r\nGET\r\n");
pub const EVALSHA: Verb = Verb(b"$7\r\nEVALSHA\r\n");

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Int(i64),
    /// A bulk or simple string.
    Text(Vec<u8>),
    Nil,
    /// An error reply (`-ERR ...`), message without the dash.
    Error(String),
    Array(Vec<Reply>),
}

impl Reply {
    /// The reply as a number: an integer, a string of digits (`GET`) or nil (a counter
    /// that does not exist). An error reply or anything else is the error's text.
    pub fn number(&self) -> Result<Option<i64>, String> {
        match self {
            Reply::Int(n) => Ok(Some(*n)),
            Reply::Nil => Ok(None),
            Reply::Text(text) => std::str::from_utf8(text)
                .ok()
                .and_then(|text| text.parse().ok())
                .map(Some)
                .ok_or_else(|| format!("not a number: {:?}", String::from_utf8_lossy(text))),
            Reply::Error(message) => Err(message.clone()),
            Reply::Array(_) => Err("an array where a number was expected".into()),
        }
    }

    /// Whether this is a `NOSCRIPT` error: the script is not loaded on that server.
    pub fn is_noscript(&self) -> bool {
        matches!(self, Reply::Error(message) if message.starts_with("NOSCRIPT"))
    }

    /// The reply the `redis` crate's connections (cluster, sentinel, TLS) gave.
    pub fn from_value(value: Value) -> Reply {
        match value {
            Value::Int(n) => Reply::Int(n),
            Value::BulkString(bytes) => Reply::Text(bytes),
            Value::SimpleString(text) => Reply::Text(text.into_bytes()),
            Value::Okay => Reply::Text(b"OK".to_vec()),
            Value::Nil => Reply::Nil,
            Value::ServerError(error) => Reply::Error(
                [error.code(), error.details().unwrap_or_default()]
                    .join(" ")
                    .trim_end()
                    .to_owned(),
            ),
            Value::Array(items) | Value::Set(items) => {
                Reply::Array(items.into_iter().map(Reply::from_value).collect())
            }
            other => Reply::Error(format!("unexpected reply {other:?}")),
        }
    }
}

/// Appends one command to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[Arg<'_>]) {
    let texts: usize = args
        .iter()
        .map(|arg| match arg {
            Arg::Verb(verb) => verb.0.len(),
            Arg::Text(text) => text.len(),
            Arg::Int(_) => 0,
        })
        .sum();
    // Room for every line at once: a length line is at most 1 + 20 + 2 bytes, and a
    // number's 20 digits and CRLF.
    out.reserve(texts + 23 * (args.len() + 1) + 22 * args.len());
    header(out, b'*', args.len());
    for arg in args {
        match *arg {
            Arg::Verb(verb) => out.extend_from_slice(verb.0),
            // The short numbers a counter's commands carry (hits, an expiry in
            // seconds), with their length line, in one copy.
            Arg::Int(n @ 0..10) => {
                out.extend_from_slice(&[b'$', b'1', b'\r', b'\n', digit(n), b'\r', b'\n'])
            }
            Arg::Int(n @ 10..100) => out.extend_from_slice(&[
                b'$',
                b'2',
                b'\r',
                b'\n',
                digit(n / 10),
                digit(n % 10),
                b'\r',
                b'\n',
            ]),
            Arg::Int(n) => bulk(out, itoa::Buffer::new().format(n).as_bytes()),
            Arg::Text(text) => bulk(out, text.as_bytes()),
        }
    }
}

/// Appends one bulk string: its length line, its bytes and CRLF.
#[inline(always)]
fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    header(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Appends a header line: `kind` and `n` in decimal (the short lengths of a command's
/// lines in one copy).
#[inline(always)]
fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    match n {
        0..10 => out.extend_from_slice(&[kind, digit(n as u64), b'\r', b'\n']),
        10..100 => out.extend_from_slice(&[
            kind,
            digit(n as u64 / 10),
            digit(n as u64 % 10),
            b'\r',
            b'\n',
        ]),
        _ => long_header(out, kind, n),
    }
}

#[cold]
fn long_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The ASCII digit of `n`, below 10.
fn digit(n: u64) -> u8 {
    b'0' + n as u8
}

/// Parses one reply from the start of `input`: the reply and the bytes it took, `None`
/// when `input` does not hold a whole reply yet, or an error for bytes that are not RESP
/// (or exceed the bounds).
pub fn parse(input: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    // What a counter's commands get back: a short non-negative integer, read here in one
    // loop; anything else (a sign, a long number, a line not yet whole) as below.
    if let Some((n, used)) = short_integer(input) {
        return Ok(Some((Reply::Int(n), used)));
    }
    parse_at(input, 0)
}

/// An integer reply of 1 to 18 digits and no sign, whole (`:17\r\n`), and the bytes it
/// takes; `None` for anything else, which [`parse_at`] reads the same way.
#[inline(always)]
fn short_integer(input: &[u8]) -> Option<(i64, usize)> {
    let [b':', rest @ ..] = input else {
        return None;
    };
    let mut n = 0i64;
    for (at, &byte) in rest.iter().enumerate().take(19) {
        match byte {
            b'0'..=b'9' if at < 18 => n = n * 10 + i64::from(byte - b'0'),
            b'\r' if at > 0 && rest.get(at + 1) == Some(&b'\n') => return Some((n, at + 3)),
            _ => return None,
        }
    }
    None
}

fn parse_at(input: &[u8], depth: usize) -> Result<Option<(Reply, usize)>, String> {
    let Some(end) = line_end(input)? else {
        return Ok(None);
    };
    let line = &input[1..end];
    let after = end + 2;
    let reply = match input[0] {
        b':' => Reply::Int(integer(line)?),
        b'+' => Reply::Text(line.to_vec()),
        b'-' => Reply::Error(String::from_utf8_lossy(line).into_owned()),
        b'$' => match integer(line)? {
            -1 => Reply::Nil,
            length => {
                let length = at_most(length, MAX_BULK, "bytes in a string")?;
                let Some(body) = input.get(after..after + length + 2) else {
                    return Ok(None);
                };
                if &body[length..] != b"\r\n" {
                    return Err("a string not ended by CRLF".into());
                }
                return Ok(Some((
                    Reply::Text(body[..length].to_vec()),
                    after + length + 2,
                )));
            }
        },
        b'*' => match integer(line)? {
            -1 => Reply::Nil,
            count => {
                let count = at_most(count, MAX_ARRAY, "elements in an array")?;
                if depth >= MAX_DEPTH {
                    return Err("arrays nested too deep".into());
                }
                let mut items = Vec::with_capacity(count);
                let mut at = after;
                for _ in 0..count {
                    let Some((item, used)) = parse_at(&input[at..], depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    at += used;
                }
                return Ok(Some((Reply::Array(items), at)));
            }
        },
        other => return Err(format!("a reply of unknown type {:?}", char::from(other))),
    };
    Ok(Some((reply, after)))
}

/// Where the first line's CR is, once its CRLF has arrived.
fn line_end(input: &[u8]) -> Result<Option<usize>, String> {
    let window = &input[..input.len().min(MAX_LINE)];
    let mut from = 0;
    let end = loop {
        // A CR, then the byte after it: most lines have no other CR.
        let Some(cr) = window[from..].iter().position(|&byte| byte == b'\r') else {
            break None;
        };
        let at = from + cr;
        match window.get(at + 1) {
            Some(b'\n') => break Some(at),
            Some(_) => from = at + 1,
            None => break None,
        }
    };
    match end {
        Some(0) => Err("an empty reply line".into()),
        Some(end) => Ok(Some(end)),
        None if input.len() >= MAX_LINE => Err("a reply line too long".into()),
        None => Ok(None),
    }
}

/// A length from a reply's header, refused when negative or over `max`.
fn at_most(length: i64, max: usize, what: &str) -> Result<usize, String> {
    usize::try_from(length)
        .ok()
        .filter(|&length| length <= max)
        .ok_or_else(|| format!("{length} {what} (at most {max})"))
}

#[inline(always)]
fn integer(line: &[u8]) -> Result<i64, String> {
    // Up to 18 digits cannot overflow: read them without the checks of `str::parse`,
    // which reads everything else (a sign, or a number too long) as before.
    let (negative, digits) = match line {
        [b'-', digits @ ..] => (true, digits),
        digits => (false, digits),
    };
    if (1..=18).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit) {
        let n = digits
            .iter()
            .fold(0i64, |n, digit| n * 10 + i64::from(digit - b'0'));
        return Ok(if negative { -n } else { n });
    }
    parsed_integer(line)
}

#[cold]
fn parsed_integer(line: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| format!("not an integer: {:?}", String::from_utf8_lossy(line)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(
            &mut out,
            &[Arg::Text("INCRBY"), Arg::Text("k_1"), Arg::Int(12)],
        );
        encode(&mut out, &[Arg::Text("GET"), Arg::Text("")]);
        assert_eq!(
            out,
            b"*3\r\n$6\r\nINCRBY\r\n$3\r\nk_1\r\n$2\r\n12\r\n*2\r\n$3\r\nGET\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn a_verb_is_written_as_its_name_is() {
        for verb in [INCRBY, EXPIRE, GET, EVALSHA] {
            let (mut ahead, mut named) = (Vec::new(), Vec::new());
            encode(&mut ahead, &[Arg::Verb(verb), Arg::Text("k")]);
            encode(&mut named, &[Arg::Text(verb.name()), Arg::Text("k")]);
            assert_eq!(ahead, named, "{}", verb.name());
        }
    }

    proptest::proptest! {
        /// Any command reads back as the array of its arguments, whatever the lengths of
        /// its strings and numbers (one digit, two, or more).
        #[test]
        fn a_command_reads_back_as_its_arguments(
            verb in proptest::option::of(0usize..4),
            texts in proptest::collection::vec("[a-z_0-9]{0,150}", 0..5),
            numbers in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..4),
            small in 0u64..200,
        ) {
            let verbs = [INCRBY, EXPIRE, GET, EVALSHA];
            let mut args: Vec<Arg<'_>> = verb.map(|v| Arg::Verb(verbs[v])).into_iter().collect();
            args.extend(texts.iter().map(|t| Arg::Text(t)));
            args.extend(numbers.iter().map(|n| Arg::Int(*n)));
            args.push(Arg::Int(small));
            let mut out = Vec::new();
            encode(&mut out, &args);
            let expected: Vec<Reply> = args
                .iter()
                .map(|arg| match arg {
                    Arg::Verb(verb) => Reply::Text(verb.name().as_bytes().to_vec()),
                    Arg::Text(text) => Reply::Text(text.as_bytes().to_vec()),
                    Arg::Int(n) => Reply::Text(n.to_string().into_bytes()),
                })
                .collect();
            proptest::prop_assert_eq!(parse(&out).unwrap(), Some((Reply::Array(expected), out.len())));
        }
    }

    proptest::proptest! {
        /// A reply's integer reads as `str::parse` reads it: every `i64`, and lines that
        /// are not one (a sign alone, a plus, too many digits, letters) alike.
        #[test]
        fn integers_read_as_rust_reads_them(
            n in proptest::prelude::any::<i64>(),
            line in "[-+]?[0-9a]{0,21}",
        ) {
            proptest::prop_assert_eq!(integer(n.to_string().as_bytes()), Ok(n));
            proptest::prop_assert_eq!(integer(line.as_bytes()).ok(), line.parse::<i64>().ok());
        }
    }

    proptest::proptest! {
        /// The short integers' own path reads every reply as the whole parser does: any
        /// `i64`, cut anywhere or followed by anything, and lines that only start alike.
        #[test]
        fn short_integers_read_as_every_reply_reads(
            n in proptest::prelude::any::<i64>(),
            cut in 0usize..24,
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..6),
            line in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24),
            digits in "[0-9]{15,21}",
        ) {
            let long = format!(":{digits}\r\n");
            proptest::prop_assert_eq!(parse(long.as_bytes()), parse_at(long.as_bytes(), 0));
            let mut reply = format!(":{n}\r\n").into_bytes();
            reply.extend(&tail);
            for input in [&reply[..], &reply[..cut.min(reply.len())], &line[..]] {
                proptest::prop_assert_eq!(parse(input), parse_at(input, 0), "{:?}", input);
            }
            let mut line = line;
            line.insert(0, b':');
            proptest::prop_assert_eq!(parse(&line), parse_at(&line, 0), "{:?}", line);
        }
    }

    #[test]
    fn a_line_ends_at_its_first_crlf_not_at_a_lone_cr() {
        assert_eq!(
            parse(b"+a\rb\r\n:1\r\n"),
            Ok(Some((Reply::Text(b"a\rb".to_vec()), 6)))
        );
        for partial in [&b"+a\r"[..], b"+a\rb", b"+a\rb\r"] {
            assert_eq!(parse(partial), Ok(None), "{partial:?}");
        }
    }

    #[test]
    fn replies_parse_whole_or_wait_for_more() {
        let input =
            b":42\r\n$2\r\n17\r\n$-1\r\n-NOSCRIPT No matching script\r\n*2\r\n+OK\r\n:-3\r\n";
        let mut at = 0;
        let mut replies = Vec::new();
        while let Some((reply, used)) = parse(&input[at..]).unwrap() {
            replies.push(reply);
            at += used;
        }
        assert_eq!(at, input.len());
        assert_eq!(
            replies,
            [
                Reply::Int(42),
                Reply::Text(b"17".to_vec()),
                Reply::Nil,
                Reply::Error("NOSCRIPT No matching script".into()),
                Reply::Array(vec![Reply::Text(b"OK".to_vec()), Reply::Int(-3)]),
            ]
        );
        assert!(replies[3].is_noscript());
        assert_eq!(replies[1].number(), Ok(Some(17)));
        assert_eq!(replies[2].number(), Ok(None));
        // Every proper prefix is incomplete, never an error.
        for cut in 0..input.len() {
            let mut at = 0;
            while let Some((_, used)) = parse(&input[at..cut]).unwrap() {
                at += used;
            }
        }
    }

    #[test]
    fn what_is_not_resp_or_too_big_is_an_error() {
        for bad in [
            &b"?1\r\n"[..],
            b":x\r\n",
            b"$3\r\nabcd\r\n",
            b"$99999999999\r\n",
            b"*99999999\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(parse(&vec![b'+'; MAX_LINE]).is_err());
        assert_eq!(parse(&vec![b'+'; MAX_LINE - 1]), Ok(None));
    }
}
