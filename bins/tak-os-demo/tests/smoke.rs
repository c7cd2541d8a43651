//! Runs the built demo binary as the README does and checks that it passes and leaves nothing
//! behind. Needs root (the demo mounts in a private mount namespace of its own); skipped loudly
//! without it, and a failure when `CI=true`.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const DEMO: &str = env!("CARGO_BIN_EXE_tak-os-demo");

fn privileged(test: &str) -> bool {
    test_support::requires_root(test, "the demo mounts")
}

fn run(args: &[&str]) -> std::io::Result<(Output, String)> {
    let output = Command::new(DEMO).args(args).output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    Ok((output, stdout))
}

/// The temporary directory the demo reports on its "lay out" step.
fn workspace(stdout: &str) -> Option<PathBuf> {
    let mut lines = stdout.lines();
    lines.find(|l| l.contains("lay out a temporary directory ... ok"))?;
    Some(PathBuf::from(lines.next()?.trim()))
}

/// The first word after `label` on the first line that starts with it (after indentation).
fn field<'a>(stdout: &'a str, label: &str) -> Option<&'a str> {
    stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))?
        .split_whitespace()
        .next()
}

fn is_running(pid: i32) -> bool {
    // A zombie waiting for its (new) parent to reap it counts as stopped.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

#[test]
fn the_demo_passes_and_leaves_nothing_behind() {
    if !privileged("the_demo_passes_and_leaves_nothing_behind") {
        return;
    }
    let (output, stdout) = run(&[]).unwrap();
    assert!(
        output.status.success(),
        "exit {:?}:\n{stdout}",
        output.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("PASS ("), "last line {last:?}:\n{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    let dir = workspace(&stdout).unwrap();
    assert!(
        dir.starts_with(std::env::temp_dir().canonicalize().unwrap()),
        "{dir:?}"
    );
    assert!(!dir.exists(), "{dir:?} was left behind");
    let pid: i32 = field(&stdout, "pid ").unwrap().parse().unwrap();
    assert!(!is_running(pid), "the driver (pid {pid}) is still running");
}

#[test]
fn keep_leaves_a_reachable_driver_that_kill_stops() {
    if !privileged("keep_leaves_a_reachable_driver_that_kill_stops") {
        return;
    }
    let (output, stdout) = run(&["--keep"]).unwrap();
    let dir = workspace(&stdout).unwrap();
    let pid: i32 = field(&stdout, "pid ")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // Stop the kept driver whatever the assertions below say.
    struct Stop(i32, PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Some(pid) = rustix::process::Pid::from_raw(self.0) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while is_running(self.0) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            // The driver's namespace, and with it every mount, is gone with the driver; from
            // this namespace the directory never held a mount.
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let stop = Stop(pid, dir.clone());

    assert!(
        output.status.success(),
        "exit {:?}:\n{stdout}",
        output.status
    );
    assert!(
        stdout
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("PASS ("),
        "{stdout}"
    );
    assert!(pid > 0 && is_running(pid), "no running driver:\n{stdout}");
    let socket = field(&stdout, "socket ").unwrap();
    assert_eq!(socket, format!("unix://{}", dir.join("csi.sock").display()));
    assert!(dir.join("csi.sock").exists());
    let metrics = field(&stdout, "metrics ").unwrap();
    assert!(metrics.starts_with("http://127.0.0.1:"), "{metrics}");
    assert!(stdout.contains(&format!("nsenter -t {pid} -m")), "{stdout}");
    // The store's tmpfs is mounted only inside the driver's namespace.
    let ours = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !ours.contains(&dir.display().to_string()),
        "a mount leaked to the host"
    );
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    assert!(
        theirs.contains(&dir.join("store").display().to_string()),
        "{theirs}"
    );

    drop(stop);
    assert!(!is_running(pid), "kill {pid} did not stop the driver");
    assert!(!dir.exists());
}

#[test]
fn a_driver_that_cannot_start_fails_the_demo_and_is_cleaned_up() {
    if !privileged("a_driver_that_cannot_start_fails_the_demo_and_is_cleaned_up") {
        return;
    }
    let (output, stdout) = run(&["--driver", "/bin/false"]).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("FAIL: wait for the driver's socket: the driver exited"),
        "{stdout}"
    );
    assert!(!workspace(&stdout).unwrap().exists(), "{stdout}");
}
