//! Real memcached servers for the tests, on free loopback ports.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// A running `memcached`.
pub struct Memcached {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Memcached {
    /// Starts one on a free port.
    pub fn start() -> Memcached {
        let port = free_port();
        let memcached = Memcached {
            child: Memcached::spawn(port),
            port,
        };
        memcached.wait_ready();
        memcached
    }

    fn spawn(port: u16) -> Child {
        Command::new("memcached")
            .args(["-l", "127.0.0.1", "-U", "0", "-m", "64", "-u", "root", "-p"])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("memcached is installed (scripts/test.sh installs it)")
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("memcached did not start on {}", self.port);
    }

    /// `host:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills it (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again, empty, on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Memcached::spawn(self.port);
        self.wait_ready();
    }

    /// The value of `key`, if it is there.
    pub fn get(&self, key: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(stream, "get {key}\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.starts_with("END") {
            return None;
        }
        let mut value = String::new();
        reader.read_line(&mut value).unwrap();
        Some(value.trim_end().to_owned())
    }

    /// The server's `stats` line `name`.
    pub fn stat(&self, name: &str) -> u64 {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.write_all(b"stats\r\n").unwrap();
        let reader = BufReader::new(stream);
        for line in reader.lines() {
            let line = line.unwrap();
            if line == "END" {
                break;
            }
            let mut fields = line.split(' ');
            if let (Some("STAT"), Some(stat), Some(value)) =
                (fields.next(), fields.next(), fields.next())
                && stat == name
            {
                return value.parse().unwrap();
            }
        }
        panic!("memcached has no stat {name}");
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.kill();
    }
}
