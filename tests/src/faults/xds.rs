//! The example control plane (`examples/xds-server`) as a real process serving a
//! directory of rules over ADS, which a fault kills and starts again, and the sidecar's
//! settings to subscribe to it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::{binary, free_port, wait_for_port};

/// A running `ratelimit-xds-example` on a port of its own, killed when dropped.
pub struct ControlPlane {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl ControlPlane {
    /// Serves `rules.yaml` holding `yaml`, and waits until it listens.
    pub fn start(yaml: &str) -> ControlPlane {
        let mut plane = ControlPlane {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
        };
        plane.write(yaml);
        plane.run();
        plane
    }

    /// Replaces the rules file (by rename, as a deployment writes it).
    pub fn write(&self, yaml: &str) {
        let staged = self.dir.path().join(".rules.yaml.new");
        std::fs::write(&staged, yaml).unwrap();
        std::fs::rename(staged, self.rules()).unwrap();
    }

    /// What it wrote to standard error: a line per version published.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("xds.log")).unwrap_or_default()
    }

    fn rules(&self) -> PathBuf {
        self.dir.path().join("rules.yaml")
    }

    /// Kills it (as a crash would): every stream drops.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it (again) on its port, serving the directory (it publishes what the
    /// directory holds at start, and each change after).
    pub fn run(&mut self) {
        let log = self.dir.path().join("xds.log");
        let child = Command::new(binary("ratelimit-xds-example"))
            .arg(self.dir.path())
            .arg(format!("127.0.0.1:{}", self.port))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the example control plane starts");
        self.child = Some(child);
        wait_for_port(self.port, "ratelimit-xds-example", &log);
    }

    /// A sidecar's settings to take its rules from this control plane, retrying a lost
    /// stream every 100 ms to 400 ms.
    pub fn sidecar_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
            (
                "CONFIG_GRPC_XDS_SERVER_URL",
                format!("127.0.0.1:{}", self.port),
            ),
            ("CONFIG_GRPC_XDS_NODE_ID", "faults".to_owned()),
            (
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
                "100ms".to_owned(),
            ),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms".to_owned()),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "400ms".to_owned()),
        ]
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.kill();
    }
}
