//! The local CSI driver on one machine, driven as kubelet and the external-provisioner would
//! drive it.
//!
//! [`demo`] enters a private mount namespace, lays out a temporary directory (a tmpfs store,
//! kubelet's root, the socket), starts the driver as a separate process and then, over its
//! socket: checks its identity, creates a volume, publishes it read-write and read-only to two
//! pods' targets, writes through one and reads through the other, shows that the read-only one
//! refuses writes, reads its stats, unpublishes and deletes it. Each step is printed with its
//! duration; the last line is `PASS` or `FAIL`. Afterwards the driver is stopped, everything
//! mounted is unmounted and the directory removed, unless `--keep` leaves the driver running.
//!
//! The driver is this same executable run with the hidden `serve-driver` subcommand (see
//! [`driver`]), so the demo needs no other binary; `--driver` runs a `tak-os-local-csi` binary
//! instead.
//!
//! What the demo does not do: run Kubernetes, the sidecars or the replicated node; its "kubelet"
//! and "provisioner" are the few calls those components would make for one claim.

#![deny(missing_docs)]

pub mod config;
pub mod driver;
pub mod namespace;
pub mod report;
pub mod scenario;
pub mod workspace;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

pub use config::Options;

use crate::driver::{DriverProcess, Stopped};
use crate::report::{Done, Failure, Report};
use crate::workspace::Workspace;

/// How long the driver may take to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How many lines of the driver's log are shown after a failure.
const LOG_TAIL_LINES: usize = 30;

/// How the demo ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every step succeeded.
    Pass,
    /// A step failed; the last line of the output says which and why.
    Fail,
}

/// Runs the demo, printing to `out`.
///
/// Must be called on the process's only thread, before any other thread (a runtime's workers)
/// exists: it moves that thread into a private mount namespace, which the driver process and
/// everything started afterwards inherit.
pub fn demo(options: &Options, out: &mut dyn Write) -> Outcome {
    let mut report = Report::new(out);
    let failure = run(options, &mut report).err();
    report.conclude(failure.as_ref());
    match failure {
        None => Outcome::Pass,
        Some(_) => Outcome::Fail,
    }
}

fn run(options: &Options, report: &mut Report<'_>) -> Result<(), Failure> {
    report.sync_step("enter a private mount namespace", || {
        namespace::enter_private_mount_namespace()
            .map_err(|e| tak_os_local_csi::status::chain(&e))?;
        Ok(Done::said(
            "nothing mounted from here on is visible on the host",
        ))
    })?;
    let workspace = report.sync_step("lay out a temporary directory", || {
        let workspace = Workspace::create().map_err(|e| format!("{e:#}"))?;
        let root = workspace.root().display().to_string();
        let layout = format!(
            "store {} (its own tmpfs), kubelet root {}",
            workspace.store().display(),
            workspace.kubelet_root().display()
        );
        Ok(Done::new(workspace).detail(root).detail(layout))
    })?;
    let (failure, mut driver) = match serve_and_drive(options, report, &workspace) {
        Ok(driver) => (None, driver),
        Err((failure, driver)) => (Some(failure), driver),
    };
    if failure.is_some() {
        log_tail(report, &workspace.driver_log());
    }
    if options.keep
        && let Some(driver) = driver.take_if(|d| matches!(d.process.exited(), Ok(None)))
    {
        keep(report, &workspace, driver);
        return failure.map_or(Ok(()), Err);
    }
    let cleaned = clean_up(report, &workspace, driver.map(|d| d.process));
    // The first failure is the one to report; cleanup problems were printed anyway.
    match failure {
        Some(failure) => Err(failure),
        None => cleaned,
    }
}

/// A started driver and where its metrics are served.
#[derive(Debug)]
struct Driver {
    process: DriverProcess,
    metrics: SocketAddr,
}

/// Starts the driver and runs the scenario. Returns the driver (absent when it never started),
/// with the failure if there was one.
fn serve_and_drive(
    options: &Options,
    report: &mut Report<'_>,
    workspace: &Workspace,
) -> Result<Option<Driver>, (Failure, Option<Driver>)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (Failure::new("build the async runtime", e), None))?;
    let metrics =
        free_local_port().map_err(|e| (Failure::new("find a free port for metrics", e), None))?;
    let mut process = report
        .sync_step("start the driver", || {
            let args = driver::driver_args(workspace, metrics, options.log_format);
            let process = DriverProcess::spawn(&options.driver, args, &workspace.driver_log())
                .map_err(|e| format!("{e:#}"))?;
            let program = match &options.driver {
                driver::DriverProgram::ThisExecutable => {
                    format!("this executable, `{}`", driver::SERVE_DRIVER)
                }
                driver::DriverProgram::Binary(path) => path.display().to_string(),
            };
            let pid = process.pid();
            Ok(Done::new(process)
                .detail(format!("pid {pid} ({program})"))
                .detail(format!("log {}", workspace.driver_log().display())))
        })
        .map_err(|failure| (failure, None))?;
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = scenario::run(report, workspace, &mut process, metrics) => outcome,
            signal = observe::shutdown_signal() => Err(Failure::new("interrupted", signal)),
        }
    });
    let driver = Driver { process, metrics };
    match outcome {
        Ok(()) => Ok(Some(driver)),
        Err(failure) => Err((failure, Some(driver))),
    }
}

/// Stops the driver and removes the temporary directory, each as a step.
fn clean_up(
    report: &mut Report<'_>,
    workspace: &Workspace,
    driver: Option<DriverProcess>,
) -> Result<(), Failure> {
    let stopped = match driver {
        None => Ok(()),
        Some(mut driver) => report.sync_step("stop the driver (SIGTERM)", || {
            let stopped = driver.stop(STOP_GRACE).map_err(|e| format!("{e:#}"))?;
            match stopped {
                Stopped::Terminated(status) if stopped.is_clean() => {
                    Ok(Done::said(format!("exited ({status})")))
                }
                Stopped::Terminated(status) => Err(format!("the driver exited with {status}")),
                Stopped::AlreadyExited(status) => Err(format!(
                    "the driver had already exited on its own ({status})"
                )),
                Stopped::Killed => Err(format!(
                    "the driver ignored SIGTERM for {STOP_GRACE:?} and was killed"
                )),
            }
        }),
    };
    // Remove the directory even when stopping failed: the process is gone either way.
    let removed = report.sync_step(
        "unmount the store and remove the temporary directory",
        || {
            workspace.remove().map_err(|e| format!("{e:#}"))?;
            Ok(Done::said(format!(
                "{} is gone",
                workspace.root().display()
            )))
        },
    );
    stopped.and(removed)
}

/// Leaves the driver running and says how to reach and stop it.
fn keep(report: &mut Report<'_>, workspace: &Workspace, driver: Driver) {
    let metrics = driver.metrics;
    let pid = driver.process.detach();
    let root = workspace.root().display();
    report.say(format_args!("driver left running (--keep):"));
    report.say(format_args!("  pid      {pid}"));
    report.say(format_args!(
        "  socket   unix://{}",
        workspace.socket().display()
    ));
    report.say(format_args!(
        "  store    {} (a tmpfs)",
        workspace.store().display()
    ));
    report.say(format_args!(
        "  kubelet  {}",
        workspace.kubelet_root().display()
    ));
    report.say(format_args!(
        "  metrics  http://{metrics}/metrics (health: http://{metrics}/healthz)"
    ));
    report.say(format_args!(
        "  log      {}",
        workspace.driver_log().display()
    ));
    report.say(format_args!(
        "  the store's tmpfs and every publication are visible only in the driver's private \
         mount namespace: nsenter -t {pid} -m findmnt --list | grep {root}"
    ));
    report.say(format_args!(
        "  stop it: kill {pid}; then rm -r {root} (the mounts vanish with the driver)"
    ));
}

/// A TCP port on 127.0.0.1 that is free right now (the driver takes a fixed address).
fn free_local_port() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    listener.local_addr()
}

/// Prints the last lines of the driver's log.
fn log_tail(report: &mut Report<'_>, log: &Path) {
    let Ok(text) = std::fs::read_to_string(log) else {
        return;
    };
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        report.say(format_args!("driver log: empty"));
        return;
    }
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    report.say(format_args!(
        "driver log (last {} of {} lines; --keep keeps the whole log):",
        tail.len(),
        lines.len()
    ));
    for line in tail {
        report.say(format_args!("  | {line}"));
    }
}
