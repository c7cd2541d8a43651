//! `tak-os-worker`: flags in, worker out.

use std::process::ExitCode;

use clap::Parser as _;
use tak_os_worker::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    observe::init_logging(cli.log_format.into());
    match cli.settings().and_then(tak_os_worker::serve) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "tak-os-worker failed");
            ExitCode::FAILURE
        }
    }
}
