//! The whole TAK-OS storage node on one machine, driven as kubelet and the external-provisioner
//! would drive it.
//!
//! [`demo`] enters a private mount namespace and lays out a temporary directory (a tmpfs store,
//! kubelet's root, the sockets and logs). Then, each step printed with its duration:
//!
//! 1. **The local CSI driver** ([`scenario`]), a separate process: its identity, a volume
//!    created, published read-write and read-only to two pods' targets, written through one and
//!    read through the other, the read-only one refusing writes, its stats, unpublished and
//!    deleted.
//! 2. **The replicated node** ([`system`]): a second local volume published to the reference
//!    worker group as a trusted consumer holds the group's state; the group's leader (serving
//!    the reference CSI controller) and a follower start; the controller creates an RWO volume;
//!    the node's FUSE keeper, mount owner and kubelet-facing frontend start; the volume is
//!    staged (one FUSE mount, the lease claimed) and published to two pods, written through one
//!    and read through the other; the frontend is killed and restarted while a writer streams,
//!    then the mount owner is upgraded (SIGTERM: it hands the stage over to the keeper, the
//!    next owner takes it back) while a writer streams, and then killed (SIGKILL: a successor
//!    takes the stage over from the keeper, the kernel resending what the dead owner had read)
//!    while a writer streams, each with no error and the stream read back whole, the same
//!    mount and the same lease epoch; then unpublished, unstaged (the lease released); owner
//!    and keeper killed together end the mount cleanly and a new owner cleans up; deleted, and
//!    the local volume released and deleted.
//!
//! The last line is `PASS` or `FAIL`. Afterwards every process is stopped, everything mounted
//! is unmounted and the directory removed, unless `--keep` leaves the processes running.
//! `--local-only` and `--replicated-only` run one part (the latter keeps the workers' state in
//! a plain directory).
//!
//! Every process is this same executable run with a hidden subcommand (`serve-driver`,
//! `serve-worker`, `serve-node`; see [`driver`]), serving the library its own binary serves,
//! so the demo needs no other binary; `--driver` runs a `tak-os-local-csi` binary instead.
//!
//! What the demo does not do: run Kubernetes or the sidecars; its "kubelet" and
//! "provisioner" are the calls those components would make for these claims.

#![deny(missing_docs)]

pub mod config;
pub mod driver;
pub mod namespace;
pub mod report;
pub mod scenario;
pub mod system;
pub mod workspace;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

pub use config::{Options, Parts};

use crate::driver::{ServiceProcess, Stopped};
use crate::report::{Done, Failure, Report};
use crate::workspace::Workspace;

/// How long the driver may take to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
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
    let mut services = Services::default();
    let failure = serve_and_drive(options, report, &workspace, &mut services).err();
    if failure.is_some() {
        for (name, log) in services.logs(&workspace) {
            log_tail(report, name, &log);
        }
    }
    if options.keep && services.all_running() {
        keep(report, &workspace, services);
        return failure.map_or(Ok(()), Err);
    }
    let cleaned = clean_up(report, &workspace, services);
    // The first failure is the one to report; cleanup problems were printed anyway.
    match failure {
        Some(failure) => Err(failure),
        None => cleaned,
    }
}

/// Every process the demo started.
#[derive(Debug, Default)]
struct Services {
    driver: Option<ServiceProcess>,
    metrics: Option<SocketAddr>,
    replicated: system::Processes,
}

impl Services {
    /// The logs of the processes that were started, for a failure.
    fn logs(&self, workspace: &Workspace) -> Vec<(&'static str, std::path::PathBuf)> {
        let mut logs = Vec::new();
        if self.driver.is_some() {
            logs.push(("driver", workspace.driver_log()));
        }
        logs.extend(
            system::logs(workspace)
                .into_iter()
                .filter(|(_, log)| log.exists()),
        );
        logs
    }

    /// Whether every started process still runs (`--keep` keeps only a whole system).
    fn all_running(&mut self) -> bool {
        let replicated = &mut self.replicated;
        [
            self.driver.as_mut(),
            replicated.leader.as_mut(),
            replicated.follower.as_mut(),
            replicated.keeper.as_mut(),
            replicated.owner.as_mut(),
            replicated.frontend.as_mut(),
        ]
        .into_iter()
        .flatten()
        .all(|p| matches!(p.exited(), Ok(None)))
    }
}

/// Starts the processes and runs the parts the options select.
fn serve_and_drive(
    options: &Options,
    report: &mut Report<'_>,
    workspace: &Workspace,
    services: &mut Services,
) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new("build the async runtime", e))?;
    if options.parts.local() {
        report.say(format_args!(
            "-- the local CSI driver (csi.local.tak-os.org)"
        ));
        let metrics =
            free_local_port().map_err(|e| Failure::new("find a free port for metrics", e))?;
        services.metrics = Some(metrics);
        let process = report.sync_step("start the local CSI driver", || {
            let args = driver::driver_args(workspace, metrics, options.log_format);
            let process = ServiceProcess::spawn(&options.driver, args, &workspace.driver_log())
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
        })?;
        services.driver = Some(process);
    }
    runtime.block_on(async {
        tokio::select! {
            outcome = drive(options, report, workspace, services) => outcome,
            signal = observe::shutdown_signal() => Err(Failure::new("interrupted", signal)),
        }
    })
}

/// The parts, in order.
async fn drive(
    options: &Options,
    report: &mut Report<'_>,
    workspace: &Workspace,
    services: &mut Services,
) -> Result<(), Failure> {
    if let (Some(driver), Some(metrics)) = (services.driver.as_mut(), services.metrics) {
        report.say(format_args!(
            "-- the local CSI driver (csi.local.tak-os.org)"
        ));
        scenario::run(report, workspace, driver, metrics).await?;
    }
    if !options.parts.replicated() {
        return Ok(());
    }
    report.say(format_args!(
        "-- the replicated node (csi.replicated.tak-os.org) on the reference worker group"
    ));
    let host = if options.parts.local() {
        system::host_state_on_local_volume(report, workspace).await?
    } else {
        let dir = workspace.worker_dir().join("state");
        std::fs::create_dir(&dir)
            .map_err(|e| Failure::new("create the workers' state directory", e))?;
        system::StateHost::Directory(dir)
    };
    system::run(
        report,
        workspace,
        &host,
        &mut services.replicated,
        options.log_format,
    )
    .await?;
    if options.keep {
        // Everything stays up, the workers on their local volume.
        return Ok(());
    }
    // The workers must let go of their state before the local volume can be unpublished.
    stop_replicated(report, &mut services.replicated).await?;
    system::release_local_state(report, workspace, &host).await
}

/// Stops the replicated part's processes (SIGTERM), each as a step, while the runtime keeps
/// serving the demo's own connections to them.
async fn stop_replicated(
    report: &mut Report<'_>,
    processes: &mut system::Processes,
) -> Result<(), Failure> {
    let mut result = Ok(());
    for (name, mut process) in processes.in_stop_order() {
        let stopped = report
            .step(&format!("stop the {name} (SIGTERM)"), async {
                describe_stop(name, process.stop_async(STOP_GRACE).await)
            })
            .await;
        result = result.and(stopped);
    }
    result
}

/// Stops one process with SIGTERM as a step (no runtime runs any more).
fn stop(report: &mut Report<'_>, name: &str, mut process: ServiceProcess) -> Result<(), Failure> {
    report.sync_step(&format!("stop the {name} (SIGTERM)"), || {
        describe_stop(name, process.stop(STOP_GRACE))
    })
}

/// What a stop says: only an exit after SIGTERM is clean.
fn describe_stop(name: &str, stopped: anyhow::Result<Stopped>) -> Result<Done<()>, String> {
    let stopped = stopped.map_err(|e| format!("{e:#}"))?;
    match stopped {
        Stopped::Terminated(status) if stopped.is_clean() => {
            Ok(Done::said(format!("exited ({status})")))
        }
        Stopped::Terminated(status) => Err(format!("the {name} exited with {status}")),
        Stopped::AlreadyExited(status) => Err(format!(
            "the {name} had already exited on its own ({status})"
        )),
        Stopped::Killed => Err(format!(
            "the {name} ignored SIGTERM for {STOP_GRACE:?} and was killed"
        )),
    }
}

/// Stops every process and removes the temporary directory, each as a step.
fn clean_up(
    report: &mut Report<'_>,
    workspace: &Workspace,
    mut services: Services,
) -> Result<(), Failure> {
    let mut stopped = Ok(());
    for (name, process) in services.replicated.in_stop_order() {
        stopped = stopped.and(stop(report, name, process));
    }
    if let Some(driver) = services.driver.take() {
        stopped = stopped.and(stop(report, "local CSI driver", driver));
    }
    // Remove the directory even when stopping failed: the processes are gone either way.
    let removed = report.sync_step(
        "unmount what is left and remove the temporary directory",
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

/// Leaves every process running and says how to reach and stop them.
fn keep(report: &mut Report<'_>, workspace: &Workspace, mut services: Services) {
    let root = workspace.root().display().to_string();
    let mut pids = Vec::new();
    report.say(format_args!("left running (--keep):"));
    if let Some(driver) = services.driver.take() {
        let pid = driver.detach();
        pids.push(pid);
        report.say(format_args!("  pid      {pid} (local CSI driver)"));
        report.say(format_args!(
            "  socket   unix://{}",
            workspace.socket().display()
        ));
        report.say(format_args!(
            "  store    {} (a tmpfs)",
            workspace.store().display()
        ));
        if let Some(metrics) = services.metrics {
            report.say(format_args!(
                "  metrics  http://{metrics}/metrics (health: http://{metrics}/healthz)"
            ));
        }
        report.say(format_args!(
            "  log      {}",
            workspace.driver_log().display()
        ));
    }
    let replicated = &mut services.replicated;
    let owner_metrics = replicated.owner_metrics;
    let frontend_metrics = replicated.frontend_metrics;
    let endpoints = replicated.endpoints.clone();
    for (name, process) in replicated.in_stop_order().into_iter().rev() {
        let pid = process.detach();
        pids.push(pid);
        report.say(format_args!("  pid      {pid} ({name})"));
    }
    if !endpoints.is_empty() {
        let list: Vec<String> = endpoints.iter().map(|e| format!("https://{e}")).collect();
        report.say(format_args!("  workers  {}", list.join(" ")));
        for (name, socket) in system::sockets(workspace) {
            report.say(format_args!(
                "  socket   unix://{} ({name})",
                socket.display()
            ));
        }
        for (name, metrics) in [
            ("mount owner", owner_metrics),
            ("frontend", frontend_metrics),
        ] {
            if let Some(metrics) = metrics {
                report.say(format_args!("  metrics  http://{metrics}/metrics ({name})"));
            }
        }
        for (name, log) in system::logs(workspace) {
            report.say(format_args!("  log      {} ({name})", log.display()));
        }
    }
    report.say(format_args!(
        "  kubelet  {}",
        workspace.kubelet_root().display()
    ));
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let first = pids.first().cloned().unwrap_or_default();
    report.say(format_args!(
        "  every mount is visible only in the processes' private mount namespace: \
         nsenter -t {first} -m findmnt --list | grep {root}"
    ));
    report.say(format_args!(
        "  stop them: kill {}; then rm -r {root} (the mounts vanish with the processes)",
        pids.join(" ")
    ));
}

/// A TCP port on 127.0.0.1 that is free right now (the services take fixed addresses).
pub(crate) fn free_local_port() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    listener.local_addr()
}

/// Prints the last lines of a process's log.
fn log_tail(report: &mut Report<'_>, name: &str, log: &Path) {
    let Ok(text) = std::fs::read_to_string(log) else {
        return;
    };
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        report.say(format_args!("{name} log: empty"));
        return;
    }
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    report.say(format_args!(
        "{name} log (last {} of {} lines; --keep keeps the whole log):",
        tail.len(),
        lines.len()
    ));
    for line in tail {
        report.say(format_args!("  | {line}"));
    }
}
