//! `tak-os-node`: flags in, mount owner out.

use std::process::ExitCode;

use clap::Parser as _;
use tak_os_node::config::{Cli, ConfigError};

fn main() -> ExitCode {
    let cli = Cli::parse();
    observe::init_logging(cli.log_format.into());
    let result = cli
        .config()
        .map_err(anyhow::Error::from)
        .and_then(tak_os_node::serve);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "tak-os-node failed");
            // 2: bad flags; 1: a failure while running.
            if error.downcast_ref::<ConfigError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
