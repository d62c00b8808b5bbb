//! The intake's processes: the intake binary, a tansu broker and a Python
//! `confluent-kafka` reader, all on free loopback ports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use serde::Deserialize;

pub use crate::{binary, free_port, wait_for_port};

pub(crate) fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set; run the tests through scripts/test.sh, which installs and points to it")
    })
}

/// A running `operations-intake` process.
pub struct Intake {
    child: Option<Child>,
    pub port: u16,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Intake {
    /// Starts the service with `env` (besides HOST and PORT) and waits until it listens.
    /// Clients are not authenticated (`AUTH=none`) unless `env` sets `AUTH`.
    pub fn start(env: &[(&str, &str)]) -> Intake {
        // A port found free can be taken before the service binds it (by a server another
        // test starts at the same moment): then the service is started on another.
        for _ in 0..3 {
            match Intake::try_start_on(free_port(), env) {
                Ok(intake) => return intake,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("operations-intake did not start; log:\n{log}"),
            }
        }
        panic!("operations-intake found no free port in three tries");
    }

    /// [`Intake::start`] on `port` (a replica started again where it was).
    pub fn start_on(port: u16, env: &[(&str, &str)]) -> Intake {
        Intake::try_start_on(port, env)
            .unwrap_or_else(|log| panic!("operations-intake did not start; log:\n{log}"))
    }

    /// Starts the service on `port` and waits until it says it listens (the port alone
    /// could be another process's); its log when it ends or stays silent for 30 s.
    fn try_start_on(port: u16, env: &[(&str, &str)]) -> Result<Intake, String> {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("intake.log");
        let mut command = Command::new(binary("operations-intake"));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOST", "127.0.0.1")
            .env("PORT", port.to_string())
            .env("LOG_LEVEL", "debug")
            .env("AUTH", "none")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .expect("the operations-intake binary starts");
        let mut intake = Intake {
            child: Some(child),
            port,
            _dir: dir,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !intake.log().contains("operations-intake listening") {
            let ended = intake.child.as_mut().unwrap().try_wait().unwrap().is_some();
            if ended || Instant::now() >= deadline {
                // Dropped, the launcher stops the process if it still runs.
                return Err(intake.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        wait_for_port(port, "operations-intake", &intake.log);
        Ok(intake)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("operations-intake log:\n{}", self.log());
        }
    }
}

/// A tansu broker (a Kafka-compatible server) with in-memory storage.
pub struct Tansu {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Tansu {
    pub fn start() -> Tansu {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = spawn_tansu(port, dir.path());
        Tansu {
            child,
            port,
            _dir: dir,
        }
    }

    /// Kills the broker and starts a new one on the same port: with in-memory storage,
    /// every topic and producer id is gone.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Kills the broker; its port refuses connections until [`Tansu::start_again`].
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a new broker on the port of a stopped one, with no topic.
    pub fn start_again(&mut self) {
        self.child = spawn_tansu(self.port, self._dir.path());
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Creates `topic` with `partitions` partitions.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        create_topic(&self.bootstrap(), topic, partitions).await;
    }

    /// Freezes the broker (SIGSTOP): connections stay open and nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused broker (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid} failed");
    }
}

fn spawn_tansu(port: u16, dir: &Path) -> Child {
    let log = dir.join("tansu.log");
    let url = format!("tcp://127.0.0.1:{port}");
    let child = Command::new(required_env("TANSU_BIN"))
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "memory://tansu/"])
        .env_clear()
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("tansu starts");
    wait_for_port(port, "tansu", &log);
    child
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates `topic` on the broker at `bootstrap`.
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    create_topic_once(bootstrap, topic, partitions)
        .await
        .unwrap();
}

/// Creates `topic` on the broker at `bootstrap`, or says why not.
pub async fn create_topic_once(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| e.to_string())?;
    for result in results {
        result.map_err(|(topic, code)| format!("{topic}: {code}"))?;
    }
    Ok(())
}

/// A message as the independent reader saw it.
#[derive(Debug, Deserialize)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    #[serde(deserialize_with = "hex")]
    pub key: Vec<u8>,
    #[serde(deserialize_with = "hex")]
    pub value: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

impl Record {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn hex<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(serde::de::Error::custom))
        .collect()
}

/// Every message of `topic`, read from the start of each partition by Python's
/// `confluent-kafka` (a client independent of the service's producer code) as a consumer
/// of the intake's topic must read it: committed transactions only.
pub fn read_topic(bootstrap: &str, topic: &str) -> Vec<Record> {
    read_topic_as(bootstrap, topic, Isolation::ReadCommitted).0
}

/// How a reader treats the records of transactions: `read_committed` shows committed
/// ones only, and nothing past the first transaction still open.
#[derive(Clone, Copy, Debug)]
pub enum Isolation {
    ReadCommitted,
    ReadUncommitted,
}

impl Isolation {
    /// The other level: what a failed check compares its reading with.
    pub fn other(self) -> Isolation {
        match self {
            Isolation::ReadCommitted => Isolation::ReadUncommitted,
            Isolation::ReadUncommitted => Isolation::ReadCommitted,
        }
    }

    /// librdkafka's `isolation.level`.
    fn level(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

/// Every message of `topic` read with `isolation`, and what the reader saw of each
/// partition (its watermarks).
pub fn read_topic_as(bootstrap: &str, topic: &str, isolation: Isolation) -> (Vec<Record>, String) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../operations-intake/tests/read_topic.py");
    let output = Command::new(required_env("KAFKA_PYTHON"))
        .arg(script)
        .args([bootstrap, topic, isolation.level()])
        .output()
        .expect("the reader runs");
    let seen = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "reader failed: {seen}");
    let records = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (records, seen)
}

/// An HTTP answer: status, headers and the body as JSON.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: serde_json::Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Posts `body` to `/operations` with `Content-Type: application/json` and `headers`.
pub async fn post(intake: &Intake, body: &str, headers: &[(&str, &str)]) -> Answer {
    let client = reqwest::Client::new();
    let mut request = client
        .post(intake.url("/operations"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    answer(request.send().await.unwrap()).await
}

/// Reads a response into an [`Answer`].
pub async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{status}: body is not JSON ({e}): {bytes:?}"));
    Answer {
        status,
        headers,
        body,
    }
}

/// `GET /health`.
pub async fn health(intake: &Intake) -> Answer {
    get(intake, "/health").await
}

/// `GET path`, answered with a JSON body.
pub async fn get(intake: &Intake, path: &str) -> Answer {
    answer(reqwest::get(intake.url(path)).await.unwrap()).await
}

/// Polls `check` for up to 20 s until it holds; panics naming `what` if it never does.
pub async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    if !crate::eventually(Duration::from_secs(20), check).await {
        panic!("timed out waiting for: {what}");
    }
}

/// One valid operation object.
pub fn operation(kind: &str, cost: &str, quantity: u64) -> String {
    format!(r#"{{"operation":"{kind}","unit-cost":{cost},"quantity":{quantity}}}"#)
}

/// A batch of `n` operations of `kind`.
pub fn batch(kind: &str, n: usize) -> String {
    format!("[{}]", vec![operation(kind, "1.00", 1); n].join(","))
}

/// librdkafka's mock cluster with one broker and `topic` (one partition).
pub fn mock_with_topic(
    topic: &str,
) -> rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
    mock.create_topic(topic, 1, 1).unwrap();
    mock
}

/// A new key for `client_id` from the service's own `keygen` (with `scopes`, comma-
/// separated, if any): the key, and its API_KEYS_FILE entry.
pub fn keygen(client_id: &str, scopes: Option<&str>) -> (String, String) {
    let mut command = Command::new(binary("operations-intake"));
    command
        .env_clear()
        .args(["keygen", "--client-id", client_id]);
    if let Some(scopes) = scopes {
        command.args(["--scopes", scopes]);
    }
    let output = command.output().expect("keygen runs");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let key = text
        .lines()
        .find_map(|line| line.strip_prefix("# oik_"))
        .map(|rest| format!("oik_{rest}"))
        .expect("keygen prints the key");
    let entry: String = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| format!("{line}\n"))
        .collect();
    (key, entry)
}

/// `Authorization: Bearer <key>`.
pub fn bearer(key: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {key}"))
}

/// Writes `text` to `path` as an editor saves: aside, then renamed over.
pub fn replace_file(path: &Path, text: &str) {
    let aside = path.with_extension("tmp");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port another process listens on is not mistaken for the service's: the launcher
    /// waits for the service to say it listens, and hands back its log when it cannot
    /// (which [`Intake::start`] answers by trying another port).
    #[test]
    fn a_port_another_process_holds_is_not_taken_for_the_service() {
        let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = squatter.local_addr().unwrap().port();
        let log = match Intake::try_start_on(port, &[]) {
            Ok(_) => panic!("the launcher took another process's listener for the service"),
            Err(log) => log,
        };
        assert!(log.contains("Address already in use"), "{log}");
    }
}
