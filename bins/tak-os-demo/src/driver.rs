//! The driver under test, run as a separate process as it is on a node: kubelet and the
//! provisioner only ever talk to it over its socket.
//!
//! By default the demo re-executes its own binary with the hidden `serve-driver` subcommand,
//! which serves the `tak_os_local_csi` library exactly as the `tak-os-local-csi` binary does; so
//! one binary is all the demo needs. `--driver <path>` runs another driver binary instead.

use std::ffi::OsString;
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
/// Demo-internal: a `serve-node` process whose environment names a file here waits until that
/// file exists before it parses its flags and serves (see [`ServiceProcess::spawn_self_gated`]).
pub const START_GATE: &str = "TAK_OS_DEMO_START_GATE";
/// How often a gated process looks for its gate file.
const GATE_POLL: Duration = Duration::from_millis(2);

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
    let log_format = log_format_name(log_format);
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
        "--consumer-mount-root".into(),
        workspace.consumers().into(),
        "--log-format".into(),
        log_format.into(),
    ]
}

/// This executable with a hidden subcommand.
fn this_executable(subcommand: &str) -> anyhow::Result<Command> {
    let exe = std::env::current_exe()
        .context("cannot find the demo's own executable to run its services")?;
    let mut command = Command::new(exe);
    command.arg(subcommand);
    Ok(command)
}

/// The name of a log format on the command lines of every service.
pub fn log_format_name(format: LogFormat) -> &'static str {
    match format {
        LogFormat::Json => "json",
        LogFormat::Text => "text",
    }
}

/// How a stopped process ended.
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

/// A process the demo started: the driver, a worker, the node's owner, frontend or keeper.
/// Dropping it kills the process; [`ServiceProcess::detach`] leaves it running.
#[derive(Debug)]
pub struct ServiceProcess {
    child: Option<Child>,
    pid: u32,
}

impl ServiceProcess {
    /// Starts the driver with `args`, its stdout and stderr appended to `log`.
    pub fn spawn(
        program: &DriverProgram,
        args: Vec<OsString>,
        log: &std::path::Path,
    ) -> anyhow::Result<Self> {
        match program {
            DriverProgram::ThisExecutable => Self::spawn_self(SERVE_DRIVER, args, log),
            DriverProgram::Binary(path) => Self::start(Command::new(path), args, log, false, None),
        }
    }

    /// Runs this executable's hidden `subcommand` with `args`, its output written to `log`.
    pub fn spawn_self(
        subcommand: &str,
        args: Vec<OsString>,
        log: &std::path::Path,
    ) -> anyhow::Result<Self> {
        Self::start(this_executable(subcommand)?, args, log, false, None)
    }

    /// [`ServiceProcess::spawn_self`], appending to `log` instead of starting it afresh (a
    /// restarted service).
    pub fn spawn_self_appending(
        subcommand: &str,
        args: Vec<OsString>,
        log: &std::path::Path,
    ) -> anyhow::Result<Self> {
        Self::start(this_executable(subcommand)?, args, log, true, None)
    }

    /// [`ServiceProcess::spawn_self_appending`] for a `serve-node` process that waits, before
    /// it parses its flags and serves, until the file `gate` exists ([`START_GATE`]): started
    /// now, let go later by creating the file.
    ///
    /// This is for a process that must be forked before the demo opens files on a FUSE mount
    /// but must not serve yet: a process forked while the demo holds such files closes its
    /// copies at `exec`, and each close sends a FUSE FLUSH that waits for the connection's
    /// server, which may be the very process being started.
    pub fn spawn_self_gated(
        subcommand: &str,
        args: Vec<OsString>,
        log: &std::path::Path,
        gate: &std::path::Path,
    ) -> anyhow::Result<Self> {
        Self::start(
            this_executable(subcommand)?,
            args,
            log,
            true,
            Some((START_GATE, gate.as_os_str())),
        )
    }

    /// Starts `command` with a cleared environment (only [`PASSED_ENVIRONMENT`] passes, and
    /// `extra` if given) and a process group of its own, so a terminal's Ctrl-C reaches only
    /// the demo, which then stops its services itself (or, with `--keep`, leaves them running).
    fn start(
        mut command: Command,
        args: Vec<OsString>,
        log: &std::path::Path,
        append: bool,
        extra: Option<(&str, &std::ffi::OsStr)>,
    ) -> anyhow::Result<Self> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(log)
            .with_context(|| format!("cannot create the log {log:?}"))?;
        let log_err = log_file
            .try_clone()
            .with_context(|| format!("cannot reopen the log {log:?}"))?;
        command
            .args(args)
            .env_clear()
            .envs(
                PASSED_ENVIRONMENT
                    .iter()
                    .filter_map(|name| std::env::var_os(name).map(|value| (name, value))),
            )
            .envs(extra)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .process_group(0);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {:?}", command.get_program()))?;
        Ok(ServiceProcess {
            pid: child.id(),
            child: Some(child),
        })
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status if the process has exited, without waiting.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(child) => child.try_wait().context("cannot poll the process"),
            None => Ok(None),
        }
    }

    /// Sends SIGTERM, waits up to `grace` for the process to exit, then kills it.
    pub fn stop(&mut self, grace: Duration) -> anyhow::Result<Stopped> {
        if let Some(already) = self.terminate()? {
            return Ok(already);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(stopped) = self.reap()? {
                return Ok(stopped);
            }
            std::thread::sleep(POLL);
        }
        self.kill_after_grace()
    }

    /// [`ServiceProcess::stop`] without blocking the async runtime, whose connections to the
    /// process must stay served meanwhile (a server's graceful shutdown waits for its clients
    /// to answer).
    pub async fn stop_async(&mut self, grace: Duration) -> anyhow::Result<Stopped> {
        if let Some(already) = self.terminate()? {
            return Ok(already);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(stopped) = self.reap()? {
                return Ok(stopped);
            }
            tokio::time::sleep(POLL).await;
        }
        self.kill_after_grace()
    }

    /// Sends SIGTERM, unless the process has already exited (which is returned).
    fn terminate(&mut self) -> anyhow::Result<Option<Stopped>> {
        let Some(child) = &mut self.child else {
            anyhow::bail!("the process was detached");
        };
        if let Some(status) = child.try_wait()? {
            self.child = None;
            return Ok(Some(Stopped::AlreadyExited(status)));
        }
        rustix::process::kill_process(Pid::from_child(child), Signal::TERM)
            .with_context(|| format!("cannot send SIGTERM to pid {}", self.pid))?;
        Ok(None)
    }

    /// How the process ended after SIGTERM, if it has.
    fn reap(&mut self) -> anyhow::Result<Option<Stopped>> {
        let Some(child) = &mut self.child else {
            anyhow::bail!("the process was detached");
        };
        let status = child.try_wait()?;
        if status.is_some() {
            self.child = None;
        }
        Ok(status.map(Stopped::Terminated))
    }

    fn kill_after_grace(&mut self) -> anyhow::Result<Stopped> {
        self.kill()?;
        Ok(Stopped::Killed)
    }

    /// Leaves the process running after the demo exits and returns its PID.
    pub fn detach(mut self) -> u32 {
        self.child = None;
        self.pid
    }
}

impl ServiceProcess {
    /// Kills the process with SIGKILL, as a crash would end it, and reaps it.
    pub fn kill(&mut self) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            anyhow::bail!("the process was detached");
        };
        child.kill().context("cannot kill the process")?;
        child.wait().context("cannot reap the process")
    }
}

impl Drop for ServiceProcess {
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

/// The hidden `serve-worker` subcommand: serves a reference worker with tak-os-worker's flags
/// until SIGTERM or SIGINT, as the `tak-os-worker` binary does.
pub fn serve_worker(args: Vec<OsString>) -> anyhow::Result<()> {
    let cli = tak_os_worker::Cli::try_parse_from(
        std::iter::once(OsString::from("tak-os-worker")).chain(args),
    )?;
    observe::init_logging(cli.log_format.into());
    tak_os_worker::serve(cli.settings()?)
}

/// The hidden `serve-node` subcommand: serves the replicated node (mount owner, frontend with
/// `--mount-service`, or keeper with `--keeper`) with tak-os-node's flags until SIGTERM or
/// SIGINT, as the `tak-os-node` binary does.
///
/// Demo-internal: when the environment variable [`START_GATE`] names a file, the process first
/// waits until that file exists (polling every few milliseconds), and gives up if the demo that
/// started it is gone meanwhile.
pub fn serve_node(args: Vec<OsString>) -> anyhow::Result<()> {
    if let Some(gate) = std::env::var_os(START_GATE) {
        wait_for_gate(std::path::Path::new(&gate))?;
    }
    let cli = tak_os_node::config::Cli::try_parse_from(
        std::iter::once(OsString::from("tak-os-node")).chain(args),
    )?;
    observe::init_logging(cli.log_format.into());
    tak_os_node::serve(cli.config()?)
}

/// Waits until `gate` exists; fails once the parent process (the demo) is gone, so that a
/// process never let go does not wait forever.
fn wait_for_gate(gate: &std::path::Path) -> anyhow::Result<()> {
    let parent = rustix::process::getppid();
    while !gate.exists() {
        if rustix::process::getppid() != parent {
            anyhow::bail!(
                "the demo that started this process is gone before it let it go ({gate:?})"
            );
        }
        std::thread::sleep(GATE_POLL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gated_process_waits_until_its_gate_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let gate = dir.path().join("go");
        let opener = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                std::fs::write(gate, b"").unwrap();
            })
        };
        let start = Instant::now();
        wait_for_gate(&gate).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert!(gate.exists());
        opener.join().unwrap();
        // An open gate lets it go at once.
        wait_for_gate(&gate).unwrap();
    }
}
