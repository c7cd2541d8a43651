//! `tak-os-local-csi`: flags in, driver out.

use std::process::ExitCode;

use clap::Parser as _;
use tak_os_local_csi::audit;
use tak_os_local_csi::config::{Cli, Command, ConfigError};

fn main() -> ExitCode {
    let cli = Cli::parse();
    observe::init_logging(cli.log_format.into());
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "tak-os-local-csi failed");
            ExitCode::from(exit_code(&error))
        }
    }
}

/// Exit codes: 1 a failure while running, 2 bad flags, 3 the store is in use by another
/// driver, 4 the store is unsafe to use or not on its own filesystem.
#[deny(clippy::wildcard_enum_match_arm)]
fn exit_code(error: &anyhow::Error) -> u8 {
    use localstore::ErrorKind;
    if error
        .chain()
        .any(|e| e.downcast_ref::<ConfigError>().is_some())
    {
        return 2;
    }
    match error
        .chain()
        .find_map(|e| e.downcast_ref::<localstore::Error>())
        .map(localstore::Error::kind)
    {
        Some(ErrorKind::StoreInUse) => 3,
        Some(ErrorKind::UnsafeStore) => 4,
        Some(
            ErrorKind::InvalidArgument
            | ErrorKind::NotFound
            | ErrorKind::Incompatible
            | ErrorKind::FailedPrecondition
            | ErrorKind::Busy
            | ErrorKind::CapacityExhausted
            | ErrorKind::Corrupt
            | ErrorKind::Io,
        )
        | None => 1,
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
    tak_os_local_csi::serve(cli.config()?)
}
