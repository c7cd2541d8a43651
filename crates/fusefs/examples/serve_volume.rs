//! Mounts a fresh volume of a throwaway reference worker and runs one command against it.
//!
//! ```text
//! cargo run -p fusefs --example serve_volume -- <MOUNT_POINT> <COMMAND> [ARGS...]
//! ```
//!
//! As root, in a private mount namespace of its own (so nothing is left mounted on the host,
//! whatever happens): starts the reference worker on loopback TLS with a volume in a temporary
//! directory, mounts the volume at `MOUNT_POINT` (an existing empty directory), runs the
//! command there, unmounts, and exits with the command's status. For running external test
//! suites (pjdfstest, fsx, a shell) against fusefs by hand.

#![allow(
    clippy::print_stderr,
    clippy::exit,
    reason = "a command-line tool reports its errors and exits with the command's status"
)]

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use fusefs::FsConfig;
use fusefs::testing::WorkerVolume;
use lease_client::Budgets;
use worker::{AccessMode, Timings};

type Failure = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(mount_point), Some(program)) = (args.next(), args.next()) else {
        eprintln!("usage: serve_volume <MOUNT_POINT> <COMMAND> [ARGS...]");
        return ExitCode::from(2);
    };
    let command_args: Vec<_> = args.collect();
    if let Err(why) = test_support::try_private_mount_namespace() {
        eprintln!("serve_volume: {why}");
        return ExitCode::from(2);
    }
    match serve(PathBuf::from(mount_point), program.as_ref(), &command_args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("serve_volume: {e}");
            ExitCode::from(2)
        }
    }
}

/// Serves the volume while the command runs; returns the command's exit code.
fn serve(
    mount_point: PathBuf,
    program: &std::ffi::OsStr,
    args: &[std::ffi::OsString],
) -> Result<u8, Failure> {
    let state = tempfile::tempdir()?;
    // Threads built after the namespace switch serve the mount from inside it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    let volume = rt.block_on(WorkerVolume::start(
        state.path(),
        "v1.serve-volume",
        AccessMode::Rwx,
        Timings::default(),
    ))?;
    let mut mounted =
        rt.block_on(volume.mount(&mount_point, Budgets::default(), FsConfig::default()))?;

    // Spawned from this thread, the command runs in the private mount namespace.
    let status = Command::new(program).args(args).status();

    let unmounted = rt.block_on(mounted.unmount(Duration::from_secs(15)));
    rt.block_on(volume.stop());
    let status = status?;
    unmounted?;
    Ok(match status.code() {
        Some(code) => u8::try_from(code).unwrap_or(1),
        None => 128,
    })
}
