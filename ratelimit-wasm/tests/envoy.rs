//! The built filter in a real Envoy (`envoy/wasm.yaml`, V8 runtime, two worker threads).
//! `ENVOY_BIN` names Envoy and `WASM_FILTER` the built `ratelimit_wasm.wasm`;
//! scripts/test.sh provides both.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warp::Filter;

struct Envoy {
    child: Child,
    port: u16,
    admin: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ready(admin: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", admin)) else {
        return false;
    };
    let mut answer = String::new();
    stream
        .write_all(b"GET /ready HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        .is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

fn start_envoy(upstream: u16) -> Envoy {
    let envoy = std::env::var("ENVOY_BIN")
        .expect("ENVOY_BIN must name an Envoy binary: run scripts/test.sh");
    let wasm = std::env::var("WASM_FILTER")
        .expect("WASM_FILTER must name the built filter: run scripts/test.sh");
    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (free_port(), free_port());
    let template =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy/wasm.yaml"))
            .unwrap();
    let config = template
        .replace("${LISTEN_PORT}", &port.to_string())
        .replace("${ADMIN_PORT}", &admin.to_string())
        .replace("${UPSTREAM_PORT}", &upstream.to_string())
        .replace("${WASM_FILE}", &wasm);
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    let log = dir.path().join("envoy.log");
    let base_id = 500 + (std::process::id() % 1000) * 4;
    let child = Command::new(envoy)
        .args([
            "-c",
            path.to_str().unwrap(),
            "--concurrency",
            "2",
            "-l",
            "warning",
        ])
        .args(["--base-id", &base_id.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("envoy starts");
    let envoy = Envoy {
        child,
        port,
        admin,
        log,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if ready(admin) {
            return envoy;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "envoy did not become ready:\n{}",
        std::fs::read_to_string(&envoy.log).unwrap_or_default()
    );
}

#[tokio::test]
async fn the_filter_limits_locally_across_worker_threads() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().port();
    tokio::spawn(
        warp::serve(warp::any().map(|| "upstream"))
            .incoming(listener)
            .run(),
    );
    let envoy = start_envoy(upstream);
    let url = format!("http://127.0.0.1:{}/", envoy.port);
    // A new connection per request spreads requests over Envoy's two workers; the
    // counters live in shared data, so the limit holds across them.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let r = client
            .get(&url)
            .header("x-user", "alice")
            .send()
            .await
            .unwrap();
        let remaining = r
            .headers()
            .get("ratelimit-remaining")
            .map(|v| v.to_str().unwrap().to_owned());
        let limited = r.headers().get("x-envoy-ratelimited").is_some();
        statuses.push((r.status().as_u16(), remaining, limited));
    }
    let log = || std::fs::read_to_string(&envoy.log).unwrap_or_default();
    assert_eq!(
        statuses[0],
        (200, Some("2".into()), false),
        "{statuses:?}\n{}",
        log()
    );
    assert_eq!(statuses[2], (200, Some("0".into()), false), "{statuses:?}");
    assert_eq!(statuses[3], (429, Some("0".into()), true), "{statuses:?}");
    assert_eq!(statuses[4].0, 429);
    let bob = reqwest::get(&url).await.unwrap();
    assert_eq!(
        bob.status(),
        200,
        "no x-user header: only the per-address descriptor applies"
    );
    assert_eq!(bob.headers()["ratelimit-limit"], "100");
    assert_eq!(bob.text().await.unwrap(), "upstream");

    // Each worker exports its counts every second; Envoy sums them.
    let stats_url = format!(
        "http://127.0.0.1:{}/stats?filter=ratelimit_wasm",
        envoy.admin
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = reqwest::get(&stats_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let value = |name: &str| {
            stats
                .lines()
                .find_map(|l| l.trim().split_once(": ").filter(|(n, _)| n.ends_with(name)))
                .and_then(|(_, v)| v.parse::<u64>().ok())
        };
        if value("ratelimit_wasm.edge.user.total_hits") == Some(5) {
            assert_eq!(
                value("ratelimit_wasm.edge.user.over_limit"),
                Some(2),
                "{stats}"
            );
            assert_eq!(
                value("ratelimit_wasm.edge.user.within_limit"),
                Some(3),
                "{stats}"
            );
            assert_eq!(
                value("ratelimit_wasm.edge.generic_key_all.remote_address.total_hits"),
                Some(6),
                "{stats}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never reached 5 hits:\n{stats}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
