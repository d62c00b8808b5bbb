//! Real memcached servers for the tests, on free loopback ports.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::free_port;

/// The connections a start makes to see that memcached listens.
const STARTUP_PROBES: u64 = 1;

/// `text` with its `%XX` escapes decoded.
fn url_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A running `memcached`.
pub struct Memcached {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Extra arguments (TLS), kept for restarts.
    extra: Vec<String>,
    /// Connections this helper opened since the start (to see that it listens, to read
    /// keys and statistics).
    probes: AtomicU64,
}

impl Memcached {
    /// Starts one on a free port.
    pub fn start() -> Memcached {
        Memcached::start_with(Vec::new())
    }

    /// Starts one that speaks TLS only, with `pki`'s `<cert>.crt` and `<cert>.key`, and
    /// requiring client certificates of `pki`'s CA when `clients` is set.
    pub fn start_tls(pki: &std::path::Path, cert: &str, clients: bool) -> Memcached {
        let file = |name: String| pki.join(name).display().to_string();
        let mut options = format!(
            "ssl_chain_cert={},ssl_key={}",
            file(format!("{cert}.crt")),
            file(format!("{cert}.key"))
        );
        if clients {
            options.push_str(&format!(
                ",ssl_ca_cert={},ssl_verify_mode=2",
                file("ca.crt".into())
            ));
        }
        Memcached::start_with(vec!["-Z".into(), "-o".into(), options])
    }

    fn start_with(extra: Vec<String>) -> Memcached {
        let port = free_port();
        Memcached {
            child: Memcached::spawn(port, &extra),
            port,
            extra,
            probes: AtomicU64::new(STARTUP_PROBES),
        }
    }

    /// Starts memcached on `port` and waits until it listens.
    fn spawn(port: u16, extra: &[String]) -> Child {
        let mut command = Command::new("memcached");
        command
            .args(["-l", "127.0.0.1", "-U", "0", "-m", "64", "-u", "root"])
            .args(extra)
            .arg("-p")
            .arg(port.to_string());
        spawn_listening(&mut command, port)
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
        self.child = Memcached::spawn(self.port, &self.extra);
        self.probes.store(STARTUP_PROBES, Ordering::Relaxed);
    }

    /// Freezes it (SIGSTOP): connections stay open and nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets it run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} memcached");
    }

    /// Closes every client's connection to it (`ss -K`, as root), as a network fault
    /// would: the clients' sockets are aborted, the server keeps running.
    pub fn cut_connections(&self) {
        let output = Command::new("ss")
            .args([
                "-K",
                "-t",
                "dst",
                "127.0.0.1",
                "dport",
                "=",
                &self.port.to_string(),
            ])
            .output()
            .expect("ss (iproute2, which scripts/test.sh installs) runs");
        assert!(
            String::from_utf8_lossy(&output.stdout).contains(&format!(":{}", self.port)),
            "ss -K closed a connection to {}: {output:?}",
            self.port
        );
    }

    /// The connections it accepted since it started, besides this helper's own.
    pub fn accepted(&self) -> u64 {
        // memcached counts its listening socket as one.
        self.stat("total_connections") - 1 - self.probes.load(Ordering::Relaxed)
    }

    /// A connection of this helper's.
    fn connect(&self) -> TcpStream {
        self.probes.fetch_add(1, Ordering::Relaxed);
        TcpStream::connect(("127.0.0.1", self.port)).unwrap()
    }

    /// Every live key with its expiry (unix seconds, -1 for none), sorted, as
    /// `lru_crawler metadump hash` lists them (it prints keys URL-encoded: decoded here).
    /// The crawler answers BUSY while an earlier dump still runs: asked again then.
    pub fn keys(&self) -> Vec<(String, i64)> {
        for _ in 0..100 {
            if let Some(mut keys) = self.metadump() {
                keys.sort();
                return keys;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("memcached's LRU crawler stayed busy for 2 s");
    }

    /// One `lru_crawler metadump hash`: None when the crawler is busy.
    fn metadump(&self) -> Option<Vec<(String, i64)>> {
        let mut stream = self.connect();
        stream.write_all(b"lru_crawler metadump hash\r\n").unwrap();
        let mut keys = Vec::new();
        for line in BufReader::new(stream).lines() {
            let line = line.unwrap();
            if line.starts_with("BUSY") {
                return None;
            }
            if line == "END" || line.starts_with("ERROR") {
                break;
            }
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .map(str::to_owned)
            };
            if let (Some(key), Some(exp)) = (field("key="), field("exp=")) {
                keys.push((url_decoded(&key), exp.parse().unwrap_or(-1)));
            }
        }
        Some(keys)
    }

    /// The value of `key` and its seconds to expiry (-1 for none), if it is there
    /// (`mg key v t`).
    pub fn value_and_ttl(&self, key: &str) -> Option<(String, i64)> {
        let mut stream = self.connect();
        write!(stream, "mg {key} v t\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if !line.starts_with("VA ") {
            return None;
        }
        let ttl = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix('t'))
            .and_then(|t| t.parse().ok())
            .unwrap_or(-1);
        let mut value = String::new();
        reader.read_line(&mut value).unwrap();
        Some((value.trim_end().to_owned(), ttl))
    }

    /// The value of `key`, if it is there.
    pub fn get(&self, key: &str) -> Option<String> {
        let mut stream = self.connect();
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
        let mut stream = self.connect();
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

/// A real DNS server (dnsmasq) on a free loopback port, answering SRV and address
/// records for the memcached nodes.
pub struct Dns {
    child: Child,
    dir: tempfile::TempDir,
    /// Its UDP and TCP port on 127.0.0.1.
    pub port: u16,
}

impl Dns {
    /// Serves `name` as an SRV record with one `target` per node (`<target>` resolving
    /// to 127.0.0.1), each on its node's port.
    pub fn start(name: &str, nodes: &[(&str, u16)]) -> Dns {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Dns::spawn(&dir, port, name, nodes);
        Dns { child, dir, port }
    }

    /// Serves a new set of records (dnsmasq reads them at start: it is restarted).
    pub fn serve(&mut self, name: &str, nodes: &[(&str, u16)]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Dns::spawn(&self.dir, self.port, name, nodes);
    }

    fn spawn(dir: &tempfile::TempDir, port: u16, name: &str, nodes: &[(&str, u16)]) -> Child {
        let mut config = String::new();
        for (target, node_port) in nodes {
            config.push_str(&format!("srv-host={name},{target},{node_port}\n"));
            config.push_str(&format!("host-record={target},127.0.0.1\n"));
        }
        let file = dir.path().join("dnsmasq.conf");
        std::fs::write(&file, config).unwrap();
        let mut command = Command::new("dnsmasq");
        command
            .arg("--keep-in-foreground")
            .arg(format!("--port={port}"))
            .args([
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--no-resolv",
            ])
            .args(["--no-hosts", "--user=root", "--pid-file="])
            .arg(format!("--conf-file={}", file.display()));
        spawn_listening(&mut command, port)
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `command` (a program scripts/test.sh installs) with its output discarded, and
/// waits until it accepts connections on `port`.
fn spawn_listening(command: &mut Command, port: u16) -> Child {
    let what = command.get_program().to_string_lossy().into_owned();
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} is installed (scripts/test.sh installs it): {e}"));
    wait_listening(port, &what);
    child
}

/// Waits until `what` accepts connections on `port`.
fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not start on {port}");
}
