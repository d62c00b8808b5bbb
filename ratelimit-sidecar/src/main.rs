//! `ratelimit`: the server.

use std::process::ExitCode;

use clap::Parser;
use ratelimit_sidecar::settings::Settings;
use ratelimit_sidecar::{logging, runner};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let settings = Settings::parse();
    logging::init(&settings.server.log_level, settings.server.log_format);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(runner::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            eprintln!("ratelimit: {error}");
            ExitCode::FAILURE
        }
    }
}
