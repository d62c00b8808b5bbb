//! The fault-schedule harness: a bounded load against a sidecar ([`load`]), faults made
//! while it runs, and a checker that reads the history of every call ([`check`]).
//! `tests/tests/faults.rs` runs each fault in a short form; `bench/faults/run.sh` runs
//! the same schedule longer (`FAULTS_SCALE`) and writes the report's table.

pub mod check;
pub mod intake;
pub mod load;
pub mod proxy;
pub mod run;
pub mod setup;
pub mod xds;

use std::io::Write as _;
use std::time::Duration;

/// How long each phase lasts: the load before the fault, the fault, the load after the
/// heal. `FAULTS_SCALE` (1 by default) multiplies them, and the callers.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// Load before the fault.
    pub before: Duration,
    /// The fault.
    pub fault: Duration,
    /// Load after the heal.
    pub after: Duration,
    /// The scale: 1 in the test suite, more in the long form.
    pub scale: u32,
}

impl Schedule {
    /// 2 s before, 3 s of fault, 5 s after, times `FAULTS_SCALE`.
    pub fn from_env() -> Schedule {
        let scale: u32 = std::env::var("FAULTS_SCALE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1)
            .max(1);
        Schedule {
            before: Duration::from_secs(2) * scale,
            fault: Duration::from_secs(3) * scale,
            after: Duration::from_secs(5) * scale,
            scale,
        }
    }
}

/// Resident memory of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// Prints one row of the report, and appends it to `$FAULTS_REPORT` when set.
pub fn report(row: &str) {
    println!("{row}");
    if let Ok(path) = std::env::var("FAULTS_REPORT") {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(file, "{row}").unwrap();
    }
}
