//! `operations-intake`: see the README's section on the service for every setting.

use clap::Parser;
use operations_intake::run::run;
use operations_intake::settings::Settings;
use ratelimit_sidecar::logging;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let settings = Settings::parse();
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
