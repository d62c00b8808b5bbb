//! memcached's text protocol, as far as counters need it: `incr`, `add`, `get` and
//! `version`, pipelined on one connection (every command written, then every reply
//! read in order).

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::tls::Tls;

/// The longest key memcached takes.
pub const MAX_KEY_BYTES: usize = 250;

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

/// A reply to `incr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incremented {
    /// The counter's value after the addition.
    To(u64),
    /// No such counter.
    Missing,
}

/// A reply to `add`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    /// Created.
    Stored,
    /// Another client created it first.
    Exists,
}

/// A byte stream: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One connection.
pub struct Connection {
    stream: BufReader<Box<dyn Stream>>,
    line: String,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

impl Connection {
    /// Connects to `address`, over TLS to the node named `name` (`host:port`) when
    /// `tls` is given.
    pub async fn open(address: &str, tls: Option<&Tls>, name: &str) -> io::Result<Connection> {
        let tcp = TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Stream> = match tls {
            Some(tls) => Box::new(tls.wrap(name, tcp).await?),
            None => Box::new(tcp),
        };
        Ok(Connection {
            stream: BufReader::new(stream),
            line: String::new(),
        })
    }

    /// `incr key by` for each pair.
    pub async fn incr(&mut self, items: &[(&str, u64)]) -> io::Result<Vec<Incremented>> {
        self.change("incr", items).await
    }

    /// `decr key by` for each pair: memcached stops a counter at 0 by itself.
    pub async fn decr(&mut self, items: &[(&str, u64)]) -> io::Result<Vec<Incremented>> {
        self.change("decr", items).await
    }

    /// `verb key by` for each pair, `incr` or `decr`.
    async fn change(
        &mut self,
        verb: &'static str,
        items: &[(&str, u64)],
    ) -> io::Result<Vec<Incremented>> {
        let mut commands = Vec::new();
        for (key, by) in items {
            commands.extend_from_slice(format!("{verb} {key} {by}\r\n").as_bytes());
        }
        self.stream.get_mut().write_all(&commands).await?;
        let mut replies = Vec::with_capacity(items.len());
        for _ in items {
            let line = self.reply_line().await?;
            let reply = match line {
                "NOT_FOUND" => Incremented::Missing,
                number => Incremented::To(number.parse().map_err(|_| unexpected(verb, number))?),
            };
            replies.push(reply);
        }
        Ok(replies)
    }

    /// `add key 0 expiry` with `value`, for each triple.
    pub async fn add(&mut self, items: &[(&str, u64, u64)]) -> io::Result<Vec<Added>> {
        let mut commands = Vec::new();
        for (key, value, expiry) in items {
            let value = value.to_string();
            let command = format!("add {key} 0 {expiry} {}\r\n{value}\r\n", value.len());
            commands.extend_from_slice(command.as_bytes());
        }
        self.stream.get_mut().write_all(&commands).await?;
        let mut replies = Vec::with_capacity(items.len());
        for _ in items {
            let reply = match self.reply_line().await? {
                "STORED" => Added::Stored,
                "NOT_STORED" => Added::Exists,
                other => return Err(unexpected("add", other)),
            };
            replies.push(reply);
        }
        Ok(replies)
    }

    /// The values of `keys` (0 for a missing or non-numeric one), in order.
    pub async fn get(&mut self, keys: &[&str]) -> io::Result<Vec<u64>> {
        let command = format!("get {}\r\n", keys.join(" "));
        self.stream.get_mut().write_all(command.as_bytes()).await?;
        let mut values = vec![0; keys.len()];
        loop {
            let line = self.reply_line().await?.to_owned();
            if line == "END" {
                return Ok(values);
            }
            let mut fields = line.split(' ');
            let (Some("VALUE"), Some(key), Some(_flags), Some(length)) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(unexpected("get", &line));
            };
            let length: usize = length.parse().map_err(|_| unexpected("get", &line))?;
            let value = self.value(length).await?;
            for (slot, _) in keys.iter().enumerate().filter(|(_, k)| **k == key) {
                values[slot] = value;
            }
        }
    }

    /// A `VALUE` line's data block of `length` bytes (and its line end), as a number: 0
    /// when it is not one.
    async fn value(&mut self, length: usize) -> io::Result<u64> {
        let mut data = vec![0; length + 2];
        self.stream.read_exact(&mut data).await?;
        Ok(std::str::from_utf8(&data[..length])
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0))
    }

    /// `gets key`: its value and compare-and-swap token, `None` when missing.
    pub async fn gets(&mut self, key: &str) -> io::Result<Option<(u64, u64)>> {
        self.stream
            .get_mut()
            .write_all(format!("gets {key}\r\n").as_bytes())
            .await?;
        let mut found = None;
        loop {
            let line = self.reply_line().await?.to_owned();
            if line == "END" {
                return Ok(found);
            }
            let fields: Vec<&str> = line.split(' ').collect();
            let (["VALUE", _, _, length, token] | ["VALUE", _, _, length, token, ..]) =
                fields.as_slice()
            else {
                return Err(unexpected("gets", &line));
            };
            let length: usize = length.parse().map_err(|_| unexpected("gets", &line))?;
            let token: u64 = token.parse().map_err(|_| unexpected("gets", &line))?;
            found = Some((self.value(length).await?, token));
        }
    }

    /// `cas key 0 expiry` with `value` if the token is still `token`: whether it was
    /// stored.
    pub async fn cas(
        &mut self,
        key: &str,
        value: u64,
        expiry: u64,
        token: u64,
    ) -> io::Result<bool> {
        let value = value.to_string();
        let command = format!(
            "cas {key} 0 {expiry} {} {token}\r\n{value}\r\n",
            value.len()
        );
        self.stream.get_mut().write_all(command.as_bytes()).await?;
        match self.reply_line().await? {
            "STORED" => Ok(true),
            "EXISTS" | "NOT_FOUND" => Ok(false),
            other => Err(unexpected("cas", other)),
        }
    }

    /// Whether the server answers `version`.
    pub async fn version(&mut self) -> io::Result<()> {
        self.stream.get_mut().write_all(b"version\r\n").await?;
        match self.reply_line().await? {
            line if line.starts_with("VERSION ") => Ok(()),
            other => Err(unexpected("version", other)),
        }
    }

    /// The next reply line, without its line end; an error reply is an error.
    async fn reply_line(&mut self) -> io::Result<&str> {
        self.line.clear();
        let read = self.stream.read_line(&mut self.line).await?;
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "memcached closed the connection",
            ));
        }
        let line = self.line.trim_end_matches(['\r', '\n']);
        if line == "ERROR" || line.starts_with("CLIENT_ERROR") || line.starts_with("SERVER_ERROR") {
            return Err(io::Error::other(format!("memcached answered {line}")));
        }
        Ok(line)
    }
}

fn unexpected(command: &str, line: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected memcached reply to {command}: {line:?}"),
    )
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
}
