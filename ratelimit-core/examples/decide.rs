//! Loads the YAML files of a directory and decides a few requests in process.
//!
//! `cargo run -p ratelimit-core --example decide -- examples/config edge remote_address=10.0.0.1`
//!
//! Arguments: the config directory, the domain, then one descriptor per argument as
//! comma-separated `key=value` pairs. Each descriptor set is asked three times.

use ratelimit_core::UnixMillis;
use std::error::Error;
use std::time::{SystemTime, UNIX_EPOCH};

use ratelimit_core::{Code, Config, Descriptor, Limiter, MemoryStore, Request, Settings};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "examples/config".into());
    let domain = args.next().unwrap_or_else(|| "edge".into());
    let mut descriptors: Vec<Descriptor> = args
        .map(|arg| parse_descriptor(&arg))
        .collect::<Result<_, _>>()?;
    if descriptors.is_empty() {
        descriptors = vec![
            Descriptor::new([("remote_address", "10.0.0.1")]),
            Descriptor::new([("user", "alice"), ("method", "POST")]),
            Descriptor::new([("path", "/downloads/a.zip")]),
        ];
    }

    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push((path.display().to_string(), std::fs::read_to_string(&path)?));
        }
    }
    files.sort();
    let config = Config::from_files(files, false)?;
    let limiter = Limiter::new(&config, Settings::default());
    println!("loaded rules:\n{}", limiter.describe());

    let store = MemoryStore::default();
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let request = Request::new(domain, descriptors);
    for attempt in 1..=3 {
        let response = limiter.should_rate_limit(&request, &store, UnixMillis::from_secs(now))?;
        let verdict = if response.overall_code == Code::Ok {
            "OK"
        } else {
            "OVER_LIMIT"
        };
        println!("request {attempt}: {verdict}");
        for (descriptor, status) in request.descriptors.iter().zip(&response.statuses) {
            let entries: Vec<String> = descriptor
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            match &status.current_limit {
                Some(limit) => println!(
                    "  {:<40} {:?}: {} of {} per {} left, resets in {}s",
                    entries.join(","),
                    status.code,
                    status.limit_remaining,
                    limit.requests_per_unit,
                    limit.unit,
                    status.duration_until_reset.unwrap_or_default()
                ),
                None if status.limit_remaining == u32::MAX => {
                    println!("  {:<40} unlimited", entries.join(","))
                }
                None => println!("  {:<40} no limit applies", entries.join(",")),
            }
        }
    }
    Ok(())
}

fn parse_descriptor(arg: &str) -> Result<Descriptor, String> {
    let pairs = arg
        .split(',')
        .map(|pair| {
            pair.split_once('=')
                .ok_or_else(|| format!("'{pair}' is not key=value"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Descriptor::new(pairs))
}
