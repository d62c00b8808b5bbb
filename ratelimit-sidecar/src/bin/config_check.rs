//! `ratelimit-config-check`: validates a directory of rate-limit YAML files.
//!
//! `ratelimit-config-check -config_dir examples/config [-merge_domain_configs]`
//! reads the directory as the server does (recursively, following each directory once,
//! skipping dotted entries when `RUNTIME_IGNOREDOTFILES` is true).
//! Exits 0 when every file is valid, 1 (after printing every error found, each with
//! file, YAML path, line and column) otherwise.

use std::path::Path;
use std::process::ExitCode;

use ratelimit_core::{Config, ConfigError, ConfigErrorKind};
use ratelimit_sidecar::rules::files::yaml_files;
use ratelimit_sidecar::settings::cli::Flags;
use ratelimit_sidecar::settings::go_bool;

const USAGE: &str = "usage: ratelimit-config-check -config_dir DIR [-merge_domain_configs]
  -config_dir            the directory of rule files, read as the server reads it
  -merge_domain_configs  let several files define the same domain (MERGE_DOMAIN_CONFIG)
Flags take one dash or two (-config_dir, --config_dir), and their value after a space or '='.
RUNTIME_IGNOREDOTFILES=true skips entries whose name starts with a dot, as the server does.";

fn main() -> ExitCode {
    let flags = Flags::parse(std::env::args().skip(1), &["merge_domain_configs"])
        .map_err(|e| format!("{e}\n{USAGE}"));
    if flags.as_ref().is_ok_and(Flags::wants_help) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match flags.and_then(|flags| check(&flags)) {
        Ok(()) => {
            println!("all rate limit configs ok");
            ExitCode::SUCCESS
        }
        Err(message) => {
            println!("error loading rate limit configs: {message}");
            ExitCode::FAILURE
        }
    }
}

fn check(flags: &Flags) -> Result<(), String> {
    if let Some(flag) = flags.unknown(&["config_dir", "merge_domain_configs"]) {
        return Err(format!("flag provided but not defined: -{flag}\n{USAGE}"));
    }
    let dir = flags
        .get("config_dir")
        .ok_or_else(|| format!("-config_dir is required\n{USAGE}"))?;
    let merge = flags
        .get("merge_domain_configs")
        .is_some_and(|v| v == "true");
    println!("checking rate limit configs...");
    println!("loading config directory: {dir}");
    // As the server reads it: RUNTIME_IGNOREDOTFILES skips dotted entries (a mounted
    // Kubernetes ConfigMap's `..data`).
    let ignore_dotfiles = match std::env::var("RUNTIME_IGNOREDOTFILES") {
        Ok(value) => go_bool(&value).map_err(|e| format!("RUNTIME_IGNOREDOTFILES: {e}"))?,
        Err(_) => false,
    };
    let paths = yaml_files(Path::new(dir), ignore_dotfiles).map_err(|e| e.to_string())?;
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        println!("opening config file: {}", path.display());
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        files.push((path.display().to_string(), text));
    }
    let config = Config::check_files(files, merge).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(describe).collect();
        lines.join("\n")
    })?;
    for warning in config.warnings() {
        println!("warning: {warning}");
    }
    for domain in config.domains() {
        println!(
            "domain {}: {} top-level descriptors",
            domain.domain,
            domain.descriptors.len()
        );
    }
    Ok(())
}

/// An error with its line and column (the YAML parser's own messages already end with
/// the position).
fn describe(error: &ConfigError) -> String {
    match error.location {
        Some((line, column)) if !matches!(error.kind, ConfigErrorKind::Yaml(_)) => {
            format!("{error} (line {line}, column {column})")
        }
        _ => error.to_string(),
    }
}
