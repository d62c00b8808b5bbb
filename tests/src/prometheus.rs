//! A real Prometheus (Debian's `prometheus`) on a free loopback port, scraping the
//! given targets every second and evaluating rule files every second, and its HTTP API.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::free_port;
use crate::image::require_tool;

/// A running Prometheus, killed when dropped.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `jobs` (a job name and its `host:port` targets) with
    /// `rules` (YAML text of a rule file, may be empty) and waits until it is ready.
    pub fn start(jobs: &[(&str, Vec<String>)], rules: &str) -> Prometheus {
        require_tool("prometheus", "prometheus");
        let dir = tempfile::tempdir().unwrap();
        let mut config = String::from(
            "global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 900ms}\n",
        );
        if !rules.is_empty() {
            std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
            config.push_str("rule_files: [rules.yaml]\n");
        }
        config.push_str("scrape_configs:\n");
        for (job, targets) in jobs {
            let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs: [{{targets: [{}]}}]\n",
                targets.join(", ")
            ));
        }
        let path = dir.path().join("prometheus.yml");
        std::fs::write(&path, config).unwrap();
        let port = free_port();
        let log = dir.path().join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("prometheus starts");
        let prometheus = Prometheus { child, port, dir };
        prometheus.wait_ready(&log);
        prometheus
    }

    fn wait_ready(&self, log: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://127.0.0.1:{}/-/ready", self.port);
        while Instant::now() < deadline {
            if let Ok(out) = Command::new("curl").args(["-sf", &url]).output()
                && out.status.success()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "prometheus did not become ready:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }

    /// The `data.result` of an instant query.
    pub async fn query(&self, expr: &str) -> Vec<Value> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let answer: Value = reqwest::Client::new()
            .get(url)
            .query(&[("query", expr)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "success", "{expr}: {answer}");
        answer["data"]["result"].as_array().unwrap().clone()
    }

    /// The alerts, as `/api/v1/alerts` lists them.
    pub async fn alerts(&self) -> Vec<Value> {
        let url = format!("http://127.0.0.1:{}/api/v1/alerts", self.port);
        let answer: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        answer["data"]["alerts"].as_array().unwrap().clone()
    }

    /// Prometheus's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
