//! Files the service follows (`RATELIMIT_CONFIG`, `API_KEYS_FILE`): read at start, where
//! a bad file stops start-up, and again whenever they change, through the sidecar's
//! watcher. A reload is all or nothing: a file that does not load leaves the previous
//! contents in use and says why in the log. The last outcome is kept for `/health` and
//! counted.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use ratelimit_core::stats::Counter;
use ratelimit_service_kit::watch::{self, Target, Watch};
use serde::Serialize;

/// Applies a file's text: `Ok` once in use, `Err` (and nothing changed) when refused.
pub type Apply = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The outcome of the last load, as `/health` shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct LastLoad {
    /// When, RFC 3339 in UTC.
    pub at: String,
    /// `loaded`, or `rejected` (the previous contents stay in use).
    pub outcome: &'static str,
    /// Why it was rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One followed file.
pub struct Followed {
    setting: &'static str,
    path: PathBuf,
    apply: Apply,
    /// The text last applied, so a change elsewhere in the directory is not a reload.
    applied: Mutex<Option<String>>,
    last: Mutex<Option<LastLoad>>,
    success: Arc<Counter>,
    error: Arc<Counter>,
}

impl Followed {
    /// The file at `path` (named by its `setting` in messages), applied by `apply`;
    /// loads count in `success` and `error`.
    pub fn new(
        setting: &'static str,
        path: &Path,
        apply: Apply,
        success: Arc<Counter>,
        error: Arc<Counter>,
    ) -> Followed {
        Followed {
            setting,
            path: path.to_path_buf(),
            apply,
            applied: Mutex::new(None),
            last: Mutex::new(None),
            success,
            error,
        }
    }

    /// Reads and applies the file; the error names the setting and the file.
    pub fn load(&self) -> Result<(), String> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| {
            let error = format!("cannot read {} {}: {e}", self.setting, self.path.display());
            tracing::error!(%error, "the previous contents stay in use");
            error
        });
        let result = text.and_then(|text| {
            (self.apply)(&text)
                .map_err(|e| format!("{} {}: {e}", self.setting, self.path.display()))?;
            *lock(&self.applied) = Some(text);
            Ok(())
        });
        let counter = if result.is_ok() {
            &self.success
        } else {
            &self.error
        };
        counter.add(1);
        *lock(&self.last) = Some(LastLoad {
            at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            outcome: if result.is_ok() { "loaded" } else { "rejected" },
            error: result.as_ref().err().cloned(),
        });
        result
    }

    /// Loads again if the text changed (or cannot be read); a refusal is the caller's
    /// `apply` to log.
    fn reload(&self) {
        let unchanged = std::fs::read_to_string(&self.path)
            .is_ok_and(|text| lock(&self.applied).as_deref() == Some(text.as_str()));
        if !unchanged {
            let _ = self.load();
        }
    }

    /// Whether some version of the file is in use (a rejected reload keeps the previous).
    pub fn loaded(&self) -> bool {
        lock(&self.applied).is_some()
    }

    /// The last load's outcome.
    pub fn last(&self) -> Option<LastLoad> {
        lock(&self.last).clone()
    }

    /// Reloads on every change to the file's directory while the returned watch lives.
    pub fn follow(self: &Arc<Self>) -> Option<Watch> {
        let followed = Arc::clone(self);
        let what = format!("{} {}", self.setting, self.path.display());
        watch::follow(&what, vec![Target::directory_of(&self.path)], move || {
            let followed = Arc::clone(&followed);
            async move {
                let _ = tokio::task::spawn_blocking(move || followed.reload()).await;
            }
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Waits up to 2 s for `check` to hold.
    async fn until(check: impl Fn() -> bool) {
        for _ in 0..100 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_change_is_applied_and_a_bad_one_keeps_the_previous_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.yaml");
        std::fs::write(&path, "one").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let (ok, bad) = (Arc::new(Counter::default()), Arc::new(Counter::default()));
        let followed = Arc::new(Followed::new(
            "SETTING",
            &path,
            Box::new(move |text| {
                if text == "bad" {
                    return Err("refused".into());
                }
                record.lock().unwrap().push(text.to_owned());
                Ok(())
            }),
            Arc::clone(&ok),
            Arc::clone(&bad),
        ));
        followed.load().unwrap();
        let _watch = followed.follow().unwrap();
        std::fs::write(dir.path().join("neighbour"), "x").unwrap();
        std::fs::write(&path, "bad").unwrap();
        until(|| bad.value() == 1).await;
        let last = followed.last().unwrap();
        assert_eq!((last.outcome, bad.value()), ("rejected", 1));
        assert!(last.error.unwrap().contains("SETTING"));
        std::fs::write(&path, "two").unwrap();
        until(|| ok.value() == 2).await;
        assert_eq!(*seen.lock().unwrap(), ["one", "two"]);
        assert_eq!(followed.last().unwrap().outcome, "loaded");
        // A removed file is a refused load: what was applied stays.
        std::fs::remove_file(&path).unwrap();
        until(|| bad.value() == 2).await;
        let last = followed.last().unwrap();
        assert_eq!((last.outcome, bad.value()), ("rejected", 2));
        assert!(last.error.unwrap().contains("cannot read SETTING"));
        assert_eq!(*seen.lock().unwrap(), ["one", "two"]);
    }
}
