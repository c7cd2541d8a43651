//! Flags (each also readable from an environment variable) and the options built from them.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tak_os_local_csi::config::LogFormat;

use crate::driver::DriverProgram;

/// Runs the whole TAK-OS storage node on this machine and drives it as kubelet and the
/// external-provisioner would: the local CSI driver (create, publish, use, delete), then a
/// replicated volume whose worker group keeps its state on a local volume (create through the
/// reference controller, stage and publish through the node's frontend and mount owner, write
/// and read, restart the frontend and upgrade the mount owner under a writer, unpublish,
/// unstage, delete). Needs root; everything happens in a private mount namespace and a
/// temporary directory that is removed afterwards.
#[derive(Debug, Parser)]
#[command(name = "tak-os-demo", version, about, long_about = None)]
pub struct Cli {
    /// Internal: what this process is for; without a subcommand it runs the demo.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Leave every process running afterwards and print their sockets, logs and metrics
    /// addresses.
    #[arg(long, env = "TAK_OS_DEMO_KEEP")]
    pub keep: bool,

    /// Only the local CSI driver's part.
    #[arg(
        long,
        env = "TAK_OS_DEMO_LOCAL_ONLY",
        conflicts_with = "replicated_only"
    )]
    pub local_only: bool,

    /// Only the replicated part; the worker group keeps its state in a plain directory instead
    /// of a local volume.
    #[arg(long, env = "TAK_OS_DEMO_REPLICATED_ONLY")]
    pub replicated_only: bool,

    /// A tak-os-local-csi binary to run as the driver; by default this binary serves the
    /// driver library itself.
    #[arg(long, env = "TAK_OS_DEMO_DRIVER")]
    pub driver: Option<PathBuf>,

    /// Format of the driver's log.
    #[arg(long, env = "TAK_OS_DEMO_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Subcommands; only used internally.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serves the local CSI driver with tak-os-local-csi's flags (the demo runs itself so).
    #[command(hide = true, name = "serve-driver")]
    ServeDriver {
        /// The driver's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Serves a reference worker with tak-os-worker's flags.
    #[command(hide = true, name = "serve-worker")]
    ServeWorker {
        /// The worker's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Serves the replicated node (owner, frontend or keeper) with tak-os-node's flags; with
    /// `TAK_OS_DEMO_START_GATE=<path>` (demo-internal) it first waits until that file exists.
    #[command(hide = true, name = "serve-node")]
    ServeNode {
        /// The node's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// Which parts of the system the demo runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parts {
    /// The local driver, then the replicated volume on a local volume.
    Everything,
    /// The local driver only.
    LocalOnly,
    /// The replicated volume only, its workers' state in a plain directory.
    ReplicatedOnly,
}

impl Parts {
    /// Whether the local driver runs.
    pub fn local(self) -> bool {
        self != Parts::ReplicatedOnly
    }

    /// Whether the replicated part runs.
    pub fn replicated(self) -> bool {
        self != Parts::LocalOnly
    }
}

/// What the demo does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Leave every process running.
    pub keep: bool,
    /// Which parts run.
    pub parts: Parts,
    /// Which program serves the driver.
    pub driver: DriverProgram,
    /// The driver's log format.
    pub log_format: LogFormat,
}

impl Cli {
    /// The demo's options.
    pub fn options(&self) -> Options {
        Options {
            keep: self.keep,
            parts: match (self.local_only, self.replicated_only) {
                (true, _) => Parts::LocalOnly,
                (false, true) => Parts::ReplicatedOnly,
                (false, false) => Parts::Everything,
            },
            driver: match &self.driver {
                Some(path) => DriverProgram::Binary(path.clone()),
                None => DriverProgram::ThisExecutable,
            },
            log_format: self.log_format,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_run_this_binary_as_the_driver() {
        let cli = Cli::try_parse_from(["tak-os-demo"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(
            cli.options(),
            Options {
                keep: false,
                parts: Parts::Everything,
                driver: DriverProgram::ThisExecutable,
                log_format: LogFormat::Text,
            }
        );
    }

    #[test]
    fn serve_driver_takes_the_drivers_flags_verbatim() {
        let cli = Cli::try_parse_from([
            "tak-os-demo",
            "serve-driver",
            "--endpoint",
            "unix:///x/csi.sock",
            "--log-format",
            "json",
        ])
        .unwrap();
        let Some(Command::ServeDriver { args }) = cli.command else {
            panic!("not serve-driver: {cli:?}");
        };
        assert_eq!(
            args,
            ["--endpoint", "unix:///x/csi.sock", "--log-format", "json"]
        );
    }

    #[test]
    fn keep_and_driver_flags() {
        let cli = Cli::try_parse_from(["tak-os-demo", "--keep", "--driver", "/bin/drv"]).unwrap();
        let options = cli.options();
        assert!(options.keep);
        assert_eq!(options.driver, DriverProgram::Binary("/bin/drv".into()));
    }

    #[test]
    fn parts_are_chosen_by_two_exclusive_flags() {
        let parts = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("tak-os-demo").chain(args.iter().copied()))
                .map(|cli| cli.options().parts)
        };
        assert_eq!(parts(&[]).unwrap(), Parts::Everything);
        assert_eq!(parts(&["--local-only"]).unwrap(), Parts::LocalOnly);
        assert_eq!(
            parts(&["--replicated-only"]).unwrap(),
            Parts::ReplicatedOnly
        );
        assert!(parts(&["--local-only", "--replicated-only"]).is_err());
        assert!(Parts::Everything.local() && Parts::Everything.replicated());
        assert!(!Parts::LocalOnly.replicated() && !Parts::ReplicatedOnly.local());
    }
}
