//! `tak-os-worker`: flags in, worker out.

use std::process::ExitCode;

use clap::Parser as _;
use tak_os_worker::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    observe::init_logging(cli.log_format.into());
    match execute(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "tak-os-worker failed");
            ExitCode::FAILURE
        }
    }
}

fn execute(cli: &Cli) -> anyhow::Result<()> {
    let settings = cli.settings()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(tak_os_worker::run(settings, async {
        let signal = observe::shutdown_signal().await;
        tracing::info!(signal, "shutting down");
    }))
}
