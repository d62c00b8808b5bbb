//! `ratelimit-xds-example DIRECTORY [ADDRESS]`: serves the envoyproxy/ratelimit YAML
//! files in DIRECTORY (default address 127.0.0.1:18000) as RateLimitConfig resources
//! over ADS, one per domain, and publishes a new version whenever the files change.
//! Files that do not load are reported and the previous version stays published.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use ratelimit_core::Config;
use ratelimit_proto::xds::from_domain;
use ratelimit_xds_example::{ControlPlane, Snapshot};
use tokio::sync::mpsc;

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: ratelimit-xds-example DIRECTORY [ADDRESS (default 127.0.0.1:18000)]";
    let directory = PathBuf::from(args.next().ok_or(usage)?);
    let address = args.next().unwrap_or_else(|| "127.0.0.1:18000".into());
    let address = address
        .parse()
        .map_err(|e| format!("{address}: {e}\n{usage}"))?;
    let plane = ControlPlane::default();
    let mut published = Published::default();
    publish(&plane, &directory, &mut published)?;

    let (changes_tx, mut changes) = mpsc::channel(16);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Only what changes files: reading them to publish (an open, an access) is an
        // event too, which would publish again, for ever.
        if event.is_ok_and(|event| changes_files(&event.kind)) {
            let _ = changes_tx.try_send(());
        }
    })
    .map_err(|e| e.to_string())?;
    watcher
        .watch(&directory, RecursiveMode::Recursive)
        .map_err(|e| format!("{}: {e}", directory.display()))?;
    let reloading = plane.clone();
    let watched = directory.clone();
    tokio::spawn(async move {
        while changes.recv().await.is_some() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            while changes.try_recv().is_ok() {}
            if let Err(error) = publish(&reloading, &watched, &mut published) {
                let version = published.version;
                eprintln!("{error}; version {version} stays published");
            }
        }
    });

    eprintln!("serving {} over ADS on {address}", directory.display());
    tonic::transport::Server::builder()
        .add_service(plane.service())
        .serve_with_shutdown(address, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| format!("{address}: {e}"))
}

/// Whether an event is a change of the directory's files.
fn changes_files(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
    )
}

/// The version published last, and the files it was made from.
#[derive(Default)]
struct Published {
    version: u64,
    files: Vec<(String, String)>,
}

/// Loads the directory's rules and publishes them as the next version, unless they are
/// the files published last.
fn publish(
    plane: &ControlPlane,
    directory: &Path,
    published: &mut Published,
) -> Result<(), String> {
    let mut files = Vec::new();
    let entries =
        std::fs::read_dir(directory).map_err(|e| format!("{}: {e}", directory.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        if yaml {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            files.push((path.display().to_string(), text));
        }
    }
    files.sort();
    if published.version > 0 && files == published.files {
        return Ok(());
    }
    let config = Config::from_files(files.clone(), false).map_err(|e| e.to_string())?;
    let mut resources = Vec::new();
    for domain in config.domains() {
        let (resource, warnings) = from_domain(&domain.domain, domain);
        for warning in warnings {
            eprintln!("{warning}");
        }
        resources.push(resource);
    }
    published.version += 1;
    published.files = files;
    let (version, domains) = (
        published.version,
        resources.iter().map(|r| r.domain.as_str()),
    );
    eprintln!(
        "publishing version {version}: {:?}",
        domains.collect::<Vec<_>>()
    );
    plane.publish(Snapshot::of(&version.to_string(), &resources));
    Ok(())
}
