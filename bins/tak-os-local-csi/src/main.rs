//! `tak-os-local-csi`: flags in, driver out.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser as _;
use tak_os_local_csi::config::{Cli, Command};
use tak_os_local_csi::{audit, observe};

fn main() -> ExitCode {
    let cli = Cli::parse();
    observe::init_logging(cli.log_format);
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "tak-os-local-csi failed");
            ExitCode::FAILURE
        }
    }
}

#[allow(
    clippy::print_stdout,
    reason = "the audit report is the command's output"
)]
fn execute(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::Audit { format }) = cli.command {
        print!(
            "{}",
            audit::audit(&cli.volume_path, &cli.node_name()?, format)?
        );
        return Ok(());
    }
    let config = cli.config()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(tak_os_local_csi::run(
        config,
        Arc::new(mounter::LinuxMounter::new()),
        shutdown_signal(),
    ))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
