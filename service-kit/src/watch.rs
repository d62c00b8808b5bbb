//! Following files on disk, for every reloadable file of both services: the sidecar's
//! rules and TLS certificate, the intake's rules and API keys. One implementation: a
//! watcher turns each relevant change into a signal, and a task runs the reload once per
//! burst of signals, once the files have been quiet for [`SETTLE`] (editors and `cp`
//! write in steps, and a slow rewrite in place can leave a half-written file that is
//! still valid YAML for a moment; a Kubernetes ConfigMap swaps a symbolic link, at once).
//! Writing by rename is always safe; a file rewritten in place is read once it has been
//! still for [`SETTLE`], or after [`LONGEST_WAIT`] of constant writing.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// A reload waits until no change has arrived for this long.
pub const SETTLE: Duration = Duration::from_millis(500);
/// ... but no longer than this after the first change of a burst.
pub const LONGEST_WAIT: Duration = Duration::from_secs(5);

/// What to follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Everything under a directory, recursively. Symbolic links are not followed into:
    /// a chain of links to directories would make a recursive watch visit exponentially
    /// many paths. A link swapped in the directory is still a change.
    Tree(PathBuf),
    /// The entries of a directory, not below: a file in it written, replaced or removed,
    /// or a link in it swapped. Follow a file's directory this way, so that a file
    /// replaced by a rename, or reached through a swapped link, is still seen.
    Directory(PathBuf),
    /// One entry of a directory, itself replaced (`RUNTIME_WATCH_ROOT`'s symlink swap).
    Entry(PathBuf),
}

impl Target {
    /// The directory of `file` (`.` for a bare file name), followed as a
    /// [`Target::Directory`].
    pub fn directory_of(file: &Path) -> Target {
        Target::Directory(match file.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        })
    }

    /// Whether a change to `paths` concerns this target (the watcher only reports
    /// changes under the directories it was asked to watch).
    fn concerns(&self, paths: &[PathBuf]) -> bool {
        match self {
            Target::Tree(_) | Target::Directory(_) => true,
            Target::Entry(entry) => paths.contains(entry),
        }
    }
}

/// A running watch; dropping it stops the watch and its reload task.
#[derive(Debug)]
pub struct Watch {
    _watcher: RecommendedWatcher,
}

/// Follows `targets`, running `reload` once after each burst of changes while the
/// returned [`Watch`] lives. When they cannot be watched, a warning naming `what` says
/// that changes need a restart, and nothing is returned. Must be called within a Tokio
/// runtime.
pub fn follow<F, Fut>(what: &str, targets: Vec<Target>, reload: F) -> Option<Watch>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (changes_tx, changes) = mpsc::channel(16);
    match watcher(targets, changes_tx) {
        Ok(watcher) => {
            tokio::spawn(reload_on_change(changes, reload));
            Some(Watch { _watcher: watcher })
        }
        Err(error) => {
            tracing::warn!(%error, "cannot watch {what}; changes will need a restart");
            None
        }
    }
}

fn watcher(targets: Vec<Target>, changes: mpsc::Sender<()>) -> notify::Result<RecommendedWatcher> {
    let mut directories = Vec::new();
    for target in &targets {
        let (directory, mode) = match target {
            Target::Tree(dir) => (dir.clone(), RecursiveMode::Recursive),
            Target::Directory(dir) => (dir.clone(), RecursiveMode::NonRecursive),
            Target::Entry(entry) => {
                let parent = entry.parent().filter(|p| !p.as_os_str().is_empty());
                (
                    parent.unwrap_or(Path::new(".")).to_path_buf(),
                    RecursiveMode::NonRecursive,
                )
            }
        };
        if !directories.iter().any(|(d, _)| *d == directory) {
            directories.push((directory, mode));
        }
    }
    let config = notify::Config::default().with_follow_symlinks(false);
    let mut watcher = RecommendedWatcher::new(
        move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            let relevant = matches!(
                event.kind,
                EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
            ) && targets.iter().any(|t| t.concerns(&event.paths));
            if relevant {
                let _ = changes.try_send(());
            }
        },
        config,
    )?;
    for (directory, mode) in &directories {
        watcher.watch(directory, *mode)?;
    }
    Ok(watcher)
}

/// Runs `reload` after each burst of changes until the watcher is dropped.
async fn reload_on_change<F, Fut>(mut changes: mpsc::Receiver<()>, mut reload: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    while changes.recv().await.is_some() {
        let first = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(SETTLE).await;
            let mut more = false;
            while changes.try_recv().is_ok() {
                more = true;
            }
            if !more || first.elapsed() >= LONGEST_WAIT {
                break;
            }
        }
        reload().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    async fn eventually(check: impl Fn() -> bool) -> bool {
        for _ in 0..100 {
            if check() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_burst_of_writes_reloads_once_and_a_replaced_file_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.yaml");
        std::fs::write(&file, "a").unwrap();
        let reloads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reloads);
        let watch = follow("the file", vec![Target::directory_of(&file)], move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {}
        });
        assert!(watch.is_some());
        for text in ["b", "c", "d"] {
            std::fs::write(&file, text).unwrap();
        }
        assert!(eventually(|| reloads.load(Ordering::SeqCst) == 1).await);
        tokio::time::sleep(SETTLE * 3).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 1, "one reload per burst");
        // An editor's save: write aside, rename over.
        let aside = dir.path().join(".keys.yaml.tmp");
        std::fs::write(&aside, "e").unwrap();
        std::fs::rename(&aside, &file).unwrap();
        assert!(eventually(|| reloads.load(Ordering::SeqCst) == 2).await);
        drop(watch);
    }

    #[tokio::test]
    async fn a_slow_rewrite_in_place_is_read_once_it_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, "whole: yes\n").unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let reads = Arc::clone(&seen);
        let path = file.clone();
        let _watch = follow("the file", vec![Target::directory_of(&file)], move || {
            reads
                .lock()
                .unwrap()
                .push(std::fs::read_to_string(&path).unwrap());
            async {}
        })
        .unwrap();
        // Two halves 300 ms apart, each a valid YAML file on its own.
        std::fs::write(&file, "first: half\n").unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(&file, "first: half\nsecond: half\n").unwrap();
        assert!(eventually(|| !seen.lock().unwrap().is_empty()).await);
        tokio::time::sleep(SETTLE * 2).await;
        assert_eq!(*seen.lock().unwrap(), ["first: half\nsecond: half\n"]);
    }

    #[tokio::test]
    async fn an_entry_target_ignores_its_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("current");
        let reloads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reloads);
        let _watch = follow("the root", vec![Target::Entry(root.clone())], move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {}
        })
        .unwrap();
        std::fs::write(dir.path().join("neighbour"), "x").unwrap();
        tokio::time::sleep(SETTLE * 3).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 0);
        std::fs::create_dir(&root).unwrap();
        assert!(eventually(|| reloads.load(Ordering::SeqCst) == 1).await);
    }

    #[tokio::test]
    async fn a_missing_directory_is_a_warning_not_a_watch() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert!(follow("nothing", vec![Target::Tree(gone)], || async {}).is_none());
    }
}
