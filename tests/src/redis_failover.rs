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

/// What `redis-cli` on `node` answers to `commands` (one a line), sent in one go.
pub fn pipe(node: &Redis, commands: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new("redis-cli")
        .args(["-p", &node.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli is installed");
    // Written from a thread: redis-cli answers while it reads.
    let mut stdin = child.stdin.take().unwrap();
    let commands = commands.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(commands.as_bytes()));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Sends `commands` (one a line) to `node` pipelined (`redis-cli --pipe`: a node that
/// saves its cluster configuration after each `SETSLOT` does so once per read), and
/// asserts that none failed.
fn pipe_all(node: &Redis, commands: &str) {
    let mut protocol = String::new();
    for line in commands.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        protocol.push_str(&format!("*{}\r\n", words.len()));
        for word in words {
            protocol.push_str(&format!("${}\r\n{word}\r\n", word.len()));
        }
    }
    let mut child = Command::new("redis-cli")
        .args(["-p", &node.port.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli is installed");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write as _;
        stdin.write_all(protocol.as_bytes())
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(said.contains("errors: 0,"), "{said}");
}

/// `CLUSTER <verb> <slot> <then>` for each of `slots`, one a line.
fn each_slot(verb: &str, slots: &[u16], then: &str) -> String {
    slots
        .iter()
        .map(|slot| format!("CLUSTER {verb} {slot} {then}\n"))
        .collect()
}

/// Starts migrating `slots` from the master `from` to `to` (importing on `to` first, as
/// `redis-cli --cluster reshard` does): until they are given to `to`, `from` answers a
/// key of those slots that it does not hold `ASK` (ask `to`).
pub fn open_migration(from: &Redis, to: &Redis, slots: &[u16]) {
    let (from_id, to_id) = (from.cli(&["CLUSTER", "MYID"]), to.cli(&["CLUSTER", "MYID"]));
    pipe_all(
        to,
        &each_slot("SETSLOT", slots, &format!("IMPORTING {from_id}")),
    );
    pipe_all(
        from,
        &each_slot("SETSLOT", slots, &format!("MIGRATING {to_id}")),
    );
}

/// The keys `node` holds in `slots` (up to 1 000 a slot).
pub fn keys_in(node: &Redis, slots: &[u16]) -> Vec<String> {
    let listed = pipe(node, &each_slot("GETKEYSINSLOT", slots, "1000"));
    listed
        .lines()
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Moves the keys `from` holds in the migrating `slots` to `to`; how many.
pub fn migrate_keys(from: &Redis, to: &Redis, slots: &[u16]) -> usize {
    let keys = keys_in(from, slots);
    migrate(from, to, &keys);
    keys.len()
}

/// Moves `keys` (of migrating slots) from `from` to `to` with `MIGRATE`, one at a time,
/// their TTLs kept. A key that expired meanwhile is not there to move.
pub fn migrate(from: &Redis, to: &Redis, keys: &[String]) {
    let migrate: String = keys
        .iter()
        .map(|key| format!("MIGRATE 127.0.0.1 {} {key} 0 5000\n", to.port))
        .collect();
    let answers = pipe(from, &migrate);
    for answer in answers.lines() {
        assert!(
            matches!(answer.trim(), "OK" | "NOKEY"),
            "MIGRATE answered {answer}"
        );
    }
}

/// Finishes the migration of `slots` from `from` to `to`: what `from` still holds of
/// them moved, then the slots given to `to` on `to`, `from` and every other master of
/// `masters` (from then on `from` answers them `MOVED`).
pub fn finish_migration(from: &Redis, to: &Redis, masters: &[&Redis], slots: &[u16]) {
    migrate_keys(from, to, slots);
    let to_id = to.cli(&["CLUSTER", "MYID"]);
    let each = each_slot("SETSLOT", slots, &format!("NODE {to_id}"));
    for node in [to, from].into_iter().chain(masters.iter().copied()) {
        pipe_all(node, &each);
    }
}
