//! `operations-intake`: see the README's section on the service for every setting.

use std::io::IsTerminal;

use clap::Parser;
use operations_intake::run::run;
use operations_intake::settings::{LogFormat, Settings};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let settings = Settings::parse();
    let filter = EnvFilter::new(format!(
        "warn,operations_intake={0},ratelimit_core={0}",
        settings.log_level
    ));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match settings.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    match run(settings).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            eprintln!("operations-intake: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
