//! The driver under test, run as a separate process as it is on a node: kubelet and the
//! provisioner only ever talk to it over its socket.
//!
//! By default the demo re-executes its own binary with the hidden `serve-driver` subcommand,
//! which serves the `tak_os_local_csi` library exactly as the `tak-os-local-csi` binary does; so
//! one binary is all the demo needs. `--driver <path>` runs another driver binary instead.

use std::ffi::OsString;
use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser as _;
use rustix::process::{Pid, Signal};
use tak_os_local_csi::config::LogFormat;

use crate::workspace::Workspace;

/// The hidden subcommand that serves the driver in this binary.
pub const SERVE_DRIVER: &str = "serve-driver";
/// The node name the demo gives the driver.
pub const NODE_ID: &str = "demo-node";
/// Environment variables passed through to the driver; every other one is cleared so that the
/// caller's `NODE_NAME` or `TAK_OS_*` cannot change the driver's flags.
const PASSED_ENVIRONMENT: &[&str] = &["RUST_LOG", "RUST_BACKTRACE"];
/// How often a stopping driver is polled.
const POLL: Duration = Duration::from_millis(10);

/// Which program serves the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverProgram {
    /// This executable, with the hidden `serve-driver` subcommand.
    ThisExecutable,
    /// A `tak-os-local-csi` binary at this path.
    Binary(PathBuf),
}

/// The driver's command line for the demo's workspace.
pub fn driver_args(
    workspace: &Workspace,
    metrics: SocketAddr,
    log_format: LogFormat,
) -> Vec<OsString> {
    let mut endpoint = OsString::from("unix://");
    endpoint.push(workspace.socket());
    let log_format = match log_format {
        LogFormat::Json => "json",
        LogFormat::Text => "text",
    };
    vec![
        "--endpoint".into(),
        endpoint,
        "--node-id".into(),
        NODE_ID.into(),
        "--volume-path".into(),
        workspace.store().into(),
        "--kubelet-root".into(),
        workspace.kubelet_root().into(),
        "--metrics-address".into(),
        metrics.to_string().into(),
        "--require-mounted-store".into(),
        "--log-format".into(),
        log_format.into(),
    ]
}

/// How a driver process ended.
#[derive(Debug)]
pub enum Stopped {
    /// It had exited on its own before it was asked to.
    AlreadyExited(ExitStatus),
    /// It exited after SIGTERM.
    Terminated(ExitStatus),
    /// It ignored SIGTERM for the whole grace period and was killed.
    Killed,
}

impl Stopped {
    /// Whether the driver stopped as asked: it exited successfully after SIGTERM, or SIGTERM's
    /// default action ended it.
    pub fn is_clean(&self) -> bool {
        match self {
            Stopped::Terminated(status) => {
                status.success() || status.signal() == Some(Signal::TERM.as_raw())
            }
            Stopped::AlreadyExited(_) | Stopped::Killed => false,
        }
    }
}

/// A running driver process. Dropping it kills the process; [`DriverProcess::detach`] leaves it
/// running.
#[derive(Debug)]
pub struct DriverProcess {
    child: Option<Child>,
    pid: u32,
}

impl DriverProcess {
    /// Starts the driver with `args`, its stdout and stderr appended to `log`. It gets a
    /// process group of its own, so a terminal's Ctrl-C reaches only the demo, which then
    /// stops the driver itself (or, with `--keep`, leaves it running).
    pub fn spawn(
        program: &DriverProgram,
        args: Vec<OsString>,
        log: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let mut command = match program {
            DriverProgram::ThisExecutable => {
                let exe = std::env::current_exe()
                    .context("cannot find the demo's own executable to run the driver")?;
                let mut command = Command::new(exe);
                command.arg(SERVE_DRIVER);
                command
            }
            DriverProgram::Binary(path) => Command::new(path),
        };
        let log_file =
            File::create(log).with_context(|| format!("cannot create the driver log {log:?}"))?;
        let log_err = log_file
            .try_clone()
            .with_context(|| format!("cannot reopen the driver log {log:?}"))?;
        command
            .args(args)
            .env_clear()
            .envs(
                PASSED_ENVIRONMENT
                    .iter()
                    .filter_map(|name| std::env::var_os(name).map(|value| (name, value))),
            )
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .process_group(0);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start the driver {:?}", command.get_program()))?;
        Ok(DriverProcess {
            pid: child.id(),
            child: Some(child),
        })
    }

    /// The driver's process ID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status if the driver has exited, without waiting.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(child) => child.try_wait().context("cannot poll the driver process"),
            None => Ok(None),
        }
    }

    /// Sends SIGTERM, waits up to `grace` for the driver to exit, then kills it.
    pub fn stop(&mut self, grace: Duration) -> anyhow::Result<Stopped> {
        let Some(child) = &mut self.child else {
            anyhow::bail!("the driver was detached");
        };
        if let Some(status) = child.try_wait()? {
            self.child = None;
            return Ok(Stopped::AlreadyExited(status));
        }
        rustix::process::kill_process(Pid::from_child(child), Signal::TERM)
            .with_context(|| format!("cannot send SIGTERM to the driver (pid {})", self.pid))?;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(Stopped::Terminated(status));
            }
            std::thread::sleep(POLL);
        }
        child.kill().context("cannot kill the driver")?;
        child.wait().context("cannot reap the driver")?;
        self.child = None;
        Ok(Stopped::Killed)
    }

    /// Leaves the driver running after the demo exits and returns its PID.
    pub fn detach(mut self) -> u32 {
        self.child = None;
        self.pid
    }
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The hidden `serve-driver` subcommand: serves the driver library with the driver's own flags
/// until SIGTERM or SIGINT, as the `tak-os-local-csi` binary does.
pub fn serve(args: Vec<OsString>) -> anyhow::Result<()> {
    let cli = tak_os_local_csi::Cli::try_parse_from(
        std::iter::once(OsString::from("tak-os-local-csi")).chain(args),
    )?;
    observe::init_logging(cli.log_format.into());
    if cli.command.is_some() {
        anyhow::bail!("{SERVE_DRIVER} only serves; run tak-os-local-csi for its subcommands");
    }
    tak_os_local_csi::serve(cli.config()?)
}
