//! Flags (each also readable from an environment variable) and the options built from them.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tak_os_local_csi::config::LogFormat;

use crate::driver::DriverProgram;

/// Runs the local CSI driver on this machine and drives it as kubelet and the
/// external-provisioner would: create, publish read-write and read-only, write and read,
/// unpublish, delete. Needs root; everything happens in a private mount namespace and a
/// temporary directory that is removed afterwards.
#[derive(Debug, Parser)]
#[command(name = "tak-os-demo", version, about, long_about = None)]
pub struct Cli {
    /// Internal: what this process is for; without a subcommand it runs the demo.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Leave the driver running afterwards and print its socket, store and metrics addresses.
    #[arg(long, env = "TAK_OS_DEMO_KEEP")]
    pub keep: bool,

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
}

/// What the demo does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Leave the driver running.
    pub keep: bool,
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
}
