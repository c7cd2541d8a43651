//! `tak-os-worker`: flags in, worker out.

use std::process::ExitCode;

use clap::Parser as _;
use tak_os_worker::{Cli, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
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
    runtime.block_on(tak_os_worker::run(settings, shutdown_signal()))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
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
