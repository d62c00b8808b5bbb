//! Apache Kafka, one KRaft node on free loopback ports, run by `scripts/kafka.sh` from the
//! jars `scripts/test.sh` resolves (`KAFKA_JARS`). Unlike tansu 0.6 it times
//! transactions out and hides aborted records from `read_committed` consumers, so the
//! faults that kill an intake replica inside a transaction run against it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::intake::{create_topic_once, required_env};
use crate::{free_port, wait_for_port};

/// A running broker, killed when dropped.
pub struct Kafka {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

/// A second listener of the broker's, behind a proxy: clients that bootstrap from the
/// proxy are told the broker is there, so all they send and receive goes through it.
#[derive(Clone, Copy, Debug)]
pub struct Proxied {
    /// Where the broker listens (the proxy's upstream).
    pub listener: u16,
    /// The proxy's port.
    pub proxy: u16,
}

impl Kafka {
    /// Starts a broker and waits until it listens.
    pub fn start() -> Kafka {
        Kafka::start_with(None)
    }

    /// Starts a broker with a second listener behind a proxy, if any.
    pub fn start_with(proxied: Option<Proxied>) -> Kafka {
        let dir = tempfile::tempdir().unwrap();
        let (port, controller) = (free_port(), free_port());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka.sh");
        let log = dir.path().join("kafka.log");
        let second = proxied.map_or_else(Vec::new, |p| {
            vec![p.listener.to_string(), p.proxy.to_string()]
        });
        let child = Command::new("bash")
            .arg(script)
            .arg("start")
            .arg(required_env("KAFKA_JARS"))
            .arg(dir.path().join("broker"))
            .args([port.to_string(), controller.to_string()])
            .args(second)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("scripts/kafka.sh starts");
        wait_for_port(port, "kafka", &log);
        Kafka { child, port, dir }
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Creates `topic` with `partitions` partitions, once the broker's controller is
    /// ready for it (a few seconds after the port opens).
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match create_topic_once(&self.bootstrap(), topic, partitions).await {
                Ok(()) => return,
                Err(error) if Instant::now() < deadline => {
                    eprintln!("kafka: cannot create {topic} yet: {error}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => panic!("kafka: cannot create {topic}: {error}\n{}", self.log()),
            }
        }
    }

    /// What the broker logged (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kafka.log")).unwrap_or_default()
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("kafka log:\n{}", self.log());
        }
    }
}
