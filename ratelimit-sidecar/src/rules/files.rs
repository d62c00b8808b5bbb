//! Rules from YAML files, loaded at start and again whenever they change.
//!
//! With `RUNTIME_WATCH_ROOT=true` a reload happens when `RUNTIME_ROOT` itself is replaced
//! (the usual symlink swap); with `false`, when a file under the application directory
//! is written, created, changed in mode or removed. Every reload reads all files and
//! either replaces the whole configuration or, on any error, keeps the previous one.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::stats::{Gauge, names};
use ratelimit_core::{Config, ConfigError};

use crate::decider::Decider;
use crate::settings::ConfigSettings;
use ratelimit_service_kit::watch::Target;

/// The YAML files of `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`.
#[derive(Clone, Debug)]
pub struct FileSource {
    root: PathBuf,
    base: PathBuf,
    app: PathBuf,
    ignore_dotfiles: bool,
    watch_root: bool,
    merge_domains: bool,
    /// Files the last load read: upstream's runtime loader reports them as
    /// `runtime.num_values`.
    read: Arc<AtomicU64>,
}

/// Why a load failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or directory could not be read.
    #[error("{path}: {error}")]
    Io {
        /// What could not be read.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// A symbolic link leads back to a directory that contains it.
    #[error("{link}: symbolic link loop: it leads back to {target}, which contains it")]
    Loop {
        /// The path through the link.
        link: String,
        /// The directory it leads back to.
        target: String,
    },
    /// A file is not a valid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl FileSource {
    /// The source the settings describe. A relative `RUNTIME_ROOT` is taken from the
    /// working directory at start, once: the watcher sees absolute paths.
    pub fn new(settings: &ConfigSettings) -> FileSource {
        let root = std::path::absolute(&settings.runtime_root)
            .unwrap_or_else(|_| PathBuf::from(&settings.runtime_root));
        let base = root.join(&settings.runtime_subdirectory);
        let app = base.join(&settings.runtime_appdirectory);
        FileSource {
            root,
            base,
            app,
            ignore_dotfiles: settings.runtime_ignoredotfiles,
            watch_root: settings.runtime_watch_root,
            merge_domains: settings.merge_domain_config,
            read: Arc::default(),
        }
    }

    /// How many files the last load read, as a gauge.
    pub fn files_read(&self) -> Gauge {
        let read = Arc::clone(&self.read);
        Arc::new(move || read.load(Ordering::Relaxed))
    }

    /// The directory the files are read from.
    pub fn directory(&self) -> &Path {
        &self.app
    }

    /// Reads and validates every `.yaml`/`.yml` file under the directory (recursively,
    /// in path order). Errors name files by their path under
    /// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY`, such as `config/api.yaml`.
    pub fn load(&self) -> Result<Config, LoadError> {
        let paths = if self.app.exists() {
            yaml_files(&self.app, self.ignore_dotfiles)?
        } else {
            Vec::new()
        };
        self.read.store(paths.len() as u64, Ordering::Relaxed);
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|error| io(&path, error))?;
            let name = path
                .strip_prefix(&self.base)
                .unwrap_or(&path)
                .display()
                .to_string();
            files.push((name, text));
        }
        Ok(Config::from_files(files, self.merge_domains)?)
    }

    /// What to follow for changes: the application directory's tree, or, with
    /// `RUNTIME_WATCH_ROOT=true`, `RUNTIME_ROOT` itself being replaced.
    pub fn targets(&self) -> Vec<Target> {
        if self.watch_root {
            vec![Target::Entry(self.root.clone())]
        } else {
            tracing::warn!(
                settle = ?ratelimit_service_kit::watch::SETTLE,
                "RUNTIME_WATCH_ROOT=false: a rule file is read once it has been still for a moment; write files by rename (a rewrite in place slower than that can be read half-written)"
            );
            vec![Target::Tree(self.app.clone())]
        }
    }
}

/// Every `.yaml`/`.yml` file under `dir`, recursively, sorted by path. Symbolic links are
/// followed, but each directory and each file is read once: a link back to a directory
/// being read (a loop) is an error, and a second way into a directory or a file already
/// found is skipped. A file reached both by a plain path and through a hidden one (a
/// Kubernetes ConfigMap's `rules.yaml -> ..data/rules.yaml`) is named by the plain one.
pub fn yaml_files(dir: &Path, ignore_dotfiles: bool) -> Result<Vec<PathBuf>, LoadError> {
    let mut walk = Walk {
        ignore_dotfiles,
        seen: HashSet::new(),
        ancestors: Vec::new(),
        files: Vec::new(),
    };
    walk.directory(dir)?;
    let hidden = |path: &Path| {
        path.strip_prefix(dir)
            .unwrap_or(path)
            .components()
            .any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
    };
    walk.files
        .sort_by_cached_key(|(path, _)| (hidden(path), path.clone()));
    let mut files_seen = HashSet::new();
    let mut files: Vec<PathBuf> = walk
        .files
        .into_iter()
        .filter(|(_, id)| files_seen.insert(*id))
        .map(|(path, _)| path)
        .collect();
    files.sort();
    Ok(files)
}

struct Walk {
    ignore_dotfiles: bool,
    /// (device, inode) of every directory read.
    seen: HashSet<(u64, u64)>,
    /// The directories being read, outermost first.
    ancestors: Vec<((u64, u64), PathBuf)>,
    /// Each file found, with its (device, inode).
    files: Vec<(PathBuf, (u64, u64))>,
}

impl Walk {
    fn directory(&mut self, dir: &Path) -> Result<(), LoadError> {
        let meta = std::fs::metadata(dir).map_err(|e| io(dir, e))?;
        let id = (meta.dev(), meta.ino());
        if let Some((_, ancestor)) = self.ancestors.iter().find(|(a, _)| *a == id) {
            return Err(LoadError::Loop {
                link: dir.display().to_string(),
                target: ancestor.display().to_string(),
            });
        }
        if !self.seen.insert(id) {
            tracing::warn!(directory = %dir.display(), "a directory reached a second time through a symbolic link is read only once");
            return Ok(());
        }
        self.ancestors.push((id, dir.to_path_buf()));
        for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
            let entry = entry.map_err(|e| io(dir, e))?;
            let path = entry.path();
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if hidden && self.ignore_dotfiles {
                continue;
            }
            if path.is_dir() {
                self.directory(&path)?;
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                let meta = std::fs::metadata(&path).map_err(|e| io(&path, e))?;
                self.files.push((path, (meta.dev(), meta.ino())));
            }
        }
        self.ancestors.pop();
        Ok(())
    }
}

fn io(path: &Path, error: std::io::Error) -> LoadError {
    LoadError::Io {
        path: path.display().to_string(),
        error,
    }
}

/// Applies a load result from the files in `directory`.
pub async fn apply(service: &Decider, directory: &Path, result: Result<Config, LoadError>) {
    let why = if directory.is_dir() {
        "it holds no .yaml or .yml file with a domain"
    } else {
        "it does not exist"
    };
    let source = directory.display().to_string();
    let result = result.map_err(|error| error.to_string());
    let attempts = service
        .limiter
        .stats()
        .counter(names::RUNTIME_LOAD_ATTEMPTS);
    attempts.add(1);
    super::apply_from(service, &source, why, result).await;
}

/// Reads the files again (off the runtime's threads) and applies the result.
pub async fn reload(source: &FileSource, service: &Decider) {
    let loader = source.clone();
    let result = tokio::task::spawn_blocking(move || loader.load())
        .await
        .unwrap_or_else(|e| {
            Err(LoadError::Io {
                path: "reload task".into(),
                error: std::io::Error::other(e),
            })
        });
    apply(service, source.directory(), result).await;
}
