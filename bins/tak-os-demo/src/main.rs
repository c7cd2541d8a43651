//! `tak-os-demo`: flags in, demo out.

use std::process::ExitCode;

use clap::Parser as _;
use tak_os_demo::config::{Cli, Command};
use tak_os_demo::{Outcome, driver};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::ServeDriver { args }) => serve(driver::SERVE_DRIVER, driver::serve(args)),
        Some(Command::ServeWorker { args }) => serve("serve-worker", driver::serve_worker(args)),
        Some(Command::ServeNode { args }) => serve("serve-node", driver::serve_node(args)),
        None => exit_code(tak_os_demo::demo(&cli.options(), &mut std::io::stdout())),
    }
}

/// The one mapping from the demo's outcome to the exit code.
fn exit_code(outcome: Outcome) -> ExitCode {
    match outcome {
        Outcome::Pass => ExitCode::SUCCESS,
        Outcome::Fail => ExitCode::FAILURE,
    }
}

#[allow(
    clippy::print_stderr,
    reason = "a service's stderr is its log, and logging may not be set up yet"
)]
fn serve(subcommand: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tak-os-demo {subcommand}: {error:#}");
            ExitCode::FAILURE
        }
    }
}
