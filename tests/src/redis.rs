//! Real `redis-server` processes for the tests (Debian's), single or as a cluster, on
//! free loopback ports.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// A real `redis-server` (Debian's) on a free loopback port, killed when dropped.
pub struct Redis {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    args: Vec<String>,
}

impl Redis {
    /// Starts `redis-server` with extra arguments (`--requirepass x`, ...).
    pub fn start(extra: &[&str]) -> Redis {
        Redis::on_a_free_port(|port| vec!["--port".to_owned(), port.to_string()], extra)
    }

    /// Starts `redis-server` answering only TLS on its port, with extra arguments (the
    /// certificate files).
    pub fn start_tls(extra: &[&str]) -> Redis {
        let listen = |port: u16| {
            let port = port.to_string();
            vec![
                "--port".to_owned(),
                "0".to_owned(),
                "--tls-port".to_owned(),
                port,
            ]
        };
        Redis::on_a_free_port(listen, extra)
    }

    /// A port found free can be taken before redis-server binds it (and a cluster node
    /// needs the port 10 000 above too): a server that exits at start is started again
    /// on another port.
    fn on_a_free_port(listen: impl Fn(u16) -> Vec<String>, extra: &[&str]) -> Redis {
        for _ in 0..3 {
            let port = free_port();
            if let Some(redis) = Redis::start_with(port, &listen(port), extra) {
                return redis;
            }
        }
        panic!("redis-server exited at start on three free ports");
    }

    /// The server, once it answers; None if it exits first.
    fn start_with(port: u16, listen: &[String], extra: &[&str]) -> Option<Redis> {
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<String> = listen
            .iter()
            .cloned()
            .chain(extra.iter().map(|a| (*a).to_owned()))
            .collect();
        let child = Redis::spawn(dir.path(), &args);
        let mut redis = Redis {
            child,
            port,
            dir,
            args,
        };
        redis.answers_or_exits().then_some(redis)
    }

    /// Waits until it accepts connections (true) or exits (false); panics after 10 s.
    fn answers_or_exits(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            if self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start on {}", self.port);
    }

    fn spawn(dir: &std::path::Path, args: &[String]) -> Child {
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test.sh installs it)")
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start on {}", self.port);
    }

    /// Kills the server (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// A frozen server cannot be killed until it runs again.
    fn signal_quietly(&self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} redis-server");
    }

    /// Starts it again on the same port with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Redis::spawn(self.dir.path(), &self.args);
        self.wait_ready();
    }

    /// Runs a command with `redis-cli` and returns its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.cli(&["--scan"]).lines().map(str::to_owned).collect();
        keys.sort();
        keys
    }
}

/// A cluster of `masters` real redis-servers (no replicas), slots spread by `redis-cli
/// --cluster create`, ready (`cluster_state:ok`) when returned. `extra` goes to every
/// server.
pub fn redis_cluster(masters: usize, extra: &[&str]) -> Vec<Redis> {
    let nodes: Vec<Redis> = (0..masters)
        .map(|i| {
            let conf = format!("nodes-{i}.conf");
            let mut args = vec!["--cluster-enabled", "yes", "--cluster-config-file", &conf];
            args.extend(extra);
            Redis::start(&args)
        })
        .collect();
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(redis_addresses(&nodes))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while nodes[0].cli(&["CLUSTER", "INFO"]).lines().next() != Some("cluster_state:ok") {
        assert!(Instant::now() < deadline, "cluster never became ok");
        std::thread::sleep(Duration::from_millis(100));
    }
    nodes
}

/// `127.0.0.1:<port>` of each server.
pub fn redis_addresses(nodes: &[Redis]) -> Vec<String> {
    nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect()
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.signal_quietly();
        self.kill();
    }
}

/// Environment for a sidecar on the Redis at `port`.
pub fn redis_env(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{port}")),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0".into()),
    ]
}
