//! `operations-intake`: the service; docs/intake.md describes it and every setting, and
//! docs/intake-kafka.md how it produces to Kafka.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use clap::Parser;
use operations_intake::auth::keys::generate;
use operations_intake::run::run;
use operations_intake::settings::{Command, Settings};
use ratelimit_service_kit::logging;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let settings = Settings::parse();
    if let Some(Command::Keygen {
        client_id,
        scopes,
        append_to,
    }) = &settings.command
    {
        return match keygen(client_id, scopes.as_deref(), append_to.as_deref()) {
            Ok(text) => {
                print!("{text}");
                std::process::ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("operations-intake keygen: {error}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    // The sidecar's log format and level names. The service kit logs the file watcher,
    // TLS reloads and the rules' load announcements (`loaded rate limit configuration`).
    logging::init_for(
        &settings.log_level,
        settings.log_format,
        &[
            "operations_intake",
            "ratelimit_core",
            "ratelimit_service_kit",
        ],
    );
    match run(settings).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            eprintln!("operations-intake: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A new key: the text to print (the key, with its entry unless it was appended to a file).
fn keygen(
    client_id: &str,
    scopes: Option<&[String]>,
    append_to: Option<&Path>,
) -> Result<String, String> {
    let (key, entry) = generate(client_id, scopes)?;
    let Some(path) = append_to else {
        return Ok(format!(
            "# The key: give it to the client, once. It is not stored anywhere.\n# {key}\n# Its entry for API_KEYS_FILE:\n{entry}"
        ));
    };
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(format!("{}: {error}", path.display())),
    };
    let separator = if existing.is_empty() || existing.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    // Hashes only, but nobody else's business: a new file is the owner's alone.
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(format!("{separator}{entry}").as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!("{key}\n"))
}
