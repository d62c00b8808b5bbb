//! `ratelimit`: the server.

use std::process::ExitCode;

use ratelimit_service_kit::logging;
use ratelimit_sidecar::runner;
use ratelimit_sidecar::settings::{LoadError, Settings};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let (settings, warnings) = match Settings::load() {
        Ok(loaded) => loaded,
        Err(LoadError::Parse(error)) => error.exit(),
        Err(error @ LoadError::Invalid(_)) => {
            eprintln!("ratelimit: cannot start:\n{error}");
            return ExitCode::FAILURE;
        }
    };
    logging::init(&settings.server.log_level, settings.server.log_format);
    for warning in warnings {
        tracing::warn!("{warning}");
    }
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
