//! A real Envoy on the files of `envoy/`, with placeholders filled in, on free loopback
//! ports. `ENVOY_BIN` names the Envoy binary and `WASM_FILTER` the built filter
//! (scripts/test.sh provides both).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use warp::Filter;

use crate::free_port;

static BASE_ID: AtomicU16 = AtomicU16::new(0);

/// A running Envoy, killed when dropped.
pub struct Envoy {
    child: Child,
    /// Its listener.
    pub port: u16,
    /// Its admin interface.
    pub admin: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn envoy_bin() -> String {
    std::env::var("ENVOY_BIN")
        .expect("ENVOY_BIN must name an Envoy binary: run scripts/test.sh, which installs one")
}

/// Starts Envoy on `envoy/sidecar.yaml` with the placeholders filled in.
pub fn start_envoy(upstream: u16, ratelimit: u16, deny: bool) -> Envoy {
    start_envoy_on("sidecar.yaml", upstream, ratelimit, deny)
}

/// Starts Envoy on `envoy/<file>` with the placeholders filled in (`WASM_FILE` from
/// `WASM_FILTER`, when the file has it).
pub fn start_envoy_on(file: &str, upstream: u16, ratelimit: u16, deny: bool) -> Envoy {
    start_envoy_with(file, upstream, ratelimit, deny, &[])
}

/// [`start_envoy_on`] with more placeholders filled in.
pub fn start_envoy_with(
    file: &str,
    upstream: u16,
    ratelimit: u16,
    deny: bool,
    more: &[(&str, String)],
) -> Envoy {
    start_envoy_workers(file, 1, upstream, ratelimit, deny, more)
}

/// [`start_envoy_with`] with `workers` worker threads. The ports are free when picked
/// but may be taken by a parallel test before Envoy binds them: then Envoy starts again
/// on others.
pub fn start_envoy_workers(
    file: &str,
    workers: usize,
    upstream: u16,
    ratelimit: u16,
    deny: bool,
    more: &[(&str, String)],
) -> Envoy {
    let mut template = std::fs::read_to_string(repo().join("envoy").join(file)).unwrap();
    if template.contains("${WASM_FILE}") {
        let wasm = std::env::var("WASM_FILTER")
            .expect("WASM_FILTER must name the built filter: run scripts/test.sh");
        template = template.replace("${WASM_FILE}", &wasm);
    }
    for (name, value) in more {
        template = template.replace(&format!("${{{name}}}"), value);
    }
    let template = template
        .replace("${UPSTREAM_PORT}", &upstream.to_string())
        .replace("${RATELIMIT_PORT}", &ratelimit.to_string())
        .replace("${FAILURE_MODE_DENY}", &deny.to_string())
        // Optional: empty unless `more` filled it.
        .replace("${GLOBAL_OPTIONS}", "");
    let mut log = String::new();
    for _ in 0..5 {
        match launch(&template, workers) {
            Ok(envoy) => return envoy,
            Err(failed) if failed.contains("Address already in use") => log = failed,
            Err(failed) => panic!("envoy did not become ready:\n{failed}"),
        }
    }
    panic!("envoy found no free ports in 5 tries:\n{log}");
}

/// Starts Envoy with `template` on two fresh ports; its log if it does not become ready.
fn launch(template: &str, workers: usize) -> Result<Envoy, String> {
    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (free_port(), free_port());
    let config = template
        .replace("${LISTEN_PORT}", &port.to_string())
        .replace("${ADMIN_PORT}", &admin.to_string());
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    let base_id =
        40 + BASE_ID.fetch_add(1, Ordering::Relaxed) + (std::process::id() % 1000) as u16 * 8;
    let log = dir.path().join("envoy.log");
    let child = Command::new(envoy_bin())
        .args([
            "-c",
            path.to_str().unwrap(),
            "--concurrency",
            &workers.to_string(),
            "-l",
            "warning",
        ])
        .args(["--base-id", &base_id.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("envoy starts");
    let mut envoy = Envoy {
        child,
        port,
        admin,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if admin_ready(admin) {
            return Ok(envoy);
        }
        if envoy.child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(std::fs::read_to_string(&log).unwrap_or_default())
}

/// Whether Envoy's admin `/ready` answers 200 (Envoy refuses HTTP/1.0 with 426).
fn admin_ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut answer = String::new();
    stream
        .write_all(b"GET /ready HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        .is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

/// A loopback upstream answering every request with 200 `upstream`.
pub async fn upstream() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        warp::serve(warp::any().map(|| "upstream"))
            .incoming(listener)
            .run(),
    );
    port
}
