//! Redis set-ups that fail over, built on [`crate::sidecar::Redis`]: a sentinel
//! watching a master (`mymaster`) that has a replica, and a cluster master given a
//! replica of its own. Both promote the replica when the master dies.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;
use crate::sidecar::Redis;

/// A sentinel process (`redis-server <conf> --sentinel`) watching a master as
/// `mymaster`: it declares it down after 1 s without an answer and fails over to a
/// replica.
pub struct Sentinel {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sentinel {
    /// Starts a sentinel watching the master on `master`, and waits until it listens.
    pub fn start(master: u16) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {master} 1\n\
                 sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test.sh installs it)");
        let sentinel = Sentinel {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "sentinel did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }

    /// A master and a replica of it, and a sentinel watching them that has seen the
    /// replica (it cannot fail over before).
    pub fn with_replica() -> (Redis, Redis, Sentinel) {
        let master = Redis::start(&[]);
        let replica_of = master.port.to_string();
        let replica = Redis::start(&["--replicaof", "127.0.0.1", &replica_of]);
        let sentinel = Sentinel::start(master.port);
        sentinel.wait_for_replica(replica.port);
        (master, replica, sentinel)
    }

    /// Waits up to 15 s until the sentinel knows the replica on `port`.
    pub fn wait_for_replica(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self
            .cli(&["SENTINEL", "replicas", "mymaster"])
            .contains(&port.to_string())
        {
            assert!(Instant::now() < deadline, "sentinel never saw the replica");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The port of the master the sentinel names now.
    pub fn master_port(&self) -> Option<u16> {
        let out = self.cli(&["SENTINEL", "get-master-addr-by-name", "mymaster"]);
        out.lines().nth(1).and_then(|port| port.trim().parse().ok())
    }

    /// `REDIS_URL` for a sidecar with `REDIS_TYPE=sentinel`.
    pub fn url(&self) -> String {
        format!("mymaster,127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Settings every node of a cluster that fails over takes: a node unreachable for 1 s
/// is failed, and the other masters keep serving their slots meanwhile.
pub const FAILOVER_CLUSTER: [&str; 4] = [
    "--cluster-node-timeout",
    "1000",
    "--cluster-require-full-coverage",
    "no",
];

/// Starts a replica of the cluster master `master` (a node started with
/// `FAILOVER_CLUSTER`), joins it to the cluster and waits until it has the master's
/// data.
pub fn cluster_replica(master: &Redis) -> Redis {
    let mut args = vec![
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes-replica.conf",
    ];
    args.extend(FAILOVER_CLUSTER);
    let replica = Redis::start(&args);
    let id = master.cli(&["CLUSTER", "MYID"]);
    let added = Command::new("redis-cli")
        .args(["--cluster", "add-node"])
        .arg(format!("127.0.0.1:{}", replica.port))
        .arg(format!("127.0.0.1:{}", master.port))
        .args(["--cluster-slave", "--cluster-master-id", &id])
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while !replica
        .cli(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "the replica never synced");
        std::thread::sleep(Duration::from_millis(100));
    }
    replica
}

/// Whether `node` serves as a master, as the node `asked` sees it.
pub fn is_master(asked: &Redis, node: &Redis) -> bool {
    let id = node.cli(&["CLUSTER", "MYID"]);
    asked
        .cli(&["CLUSTER", "NODES"])
        .lines()
        .find(|line| line.starts_with(&id))
        .is_some_and(|line| line.split(' ').nth(2).is_some_and(|f| f.contains("master")))
}

/// How many slots `node` serves, as the node `asked` sees it.
pub fn slots_of(asked: &Redis, node: &Redis) -> u32 {
    let id = node.cli(&["CLUSTER", "MYID"]);
    let nodes = asked.cli(&["CLUSTER", "NODES"]);
    let Some(line) = nodes.lines().find(|line| line.starts_with(&id)) else {
        return 0;
    };
    // Fields 9 on: `slot` or `first-last` (or `[slot->-id]` while migrating).
    line.split(' ')
        .skip(8)
        .filter_map(|range| match range.split_once('-') {
            _ if range.starts_with('[') => None,
            Some((first, last)) => Some(last.parse::<u32>().ok()? - first.parse::<u32>().ok()? + 1),
            None => range.parse::<u32>().ok().map(|_| 1),
        })
        .sum()
}
