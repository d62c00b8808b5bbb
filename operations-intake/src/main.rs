//! `operations-intake`: see the README's section on the service for every setting.

use clap::Parser;
use operations_intake::auth::keys::generate;
use operations_intake::run::run;
use operations_intake::settings::{Command, Settings};
use ratelimit_sidecar::logging;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let settings = Settings::parse();
    if let Some(Command::Keygen { client_id, scopes }) = &settings.command {
        return match generate(client_id, scopes.as_deref()) {
            Ok((key, entry)) => {
                println!(
                    "# The key: give it to the client, once. It is not stored anywhere.\n# {key}\n# Its entry for API_KEYS_FILE:\n{entry}"
                );
                std::process::ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("operations-intake keygen: {error}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    // The sidecar's log format and level names.
    logging::init_for(
        &settings.log_level,
        settings.log_format,
        &["operations_intake", "ratelimit_core", "ratelimit_sidecar"],
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
