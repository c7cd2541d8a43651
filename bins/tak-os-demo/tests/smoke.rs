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

/// Every PID the output names (`pid N` anywhere on a line).
fn pids(stdout: &str) -> Vec<i32> {
    let words: Vec<&str> = stdout.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "pid")
        .filter_map(|w| w[1].parse().ok())
        .collect()
}

/// The indented detail lines printed under the step whose line contains `step`.
fn details<'a>(stdout: &'a str, step: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .skip_while(|l| !l.contains(step))
        .skip(1)
        .take_while(|l| !l.starts_with('[') && l.starts_with(' '))
        .map(str::trim)
        .collect()
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
    // The driver, both workers, two keepers (the first, the one started after owner and keeper
    // were killed together), four owners (the first, its successors after the upgrade and the
    // crash, the one started after the last kill) and both frontends.
    let pids = pids(&stdout);
    assert!(pids.len() >= 11, "{pids:?}:\n{stdout}");
    let keeper: i32 = field(&stdout, "keeper pid ")
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no keeper pid:\n{stdout}"));
    assert!(pids.contains(&keeper), "{pids:?}:\n{stdout}");
    for pid in pids {
        assert!(!is_running(pid), "pid {pid} is still running:\n{stdout}");
    }
    for proof in [
        "NodePublishVolume to the worker group as a trusted consumer ... ok",
        "start the FUSE keeper",
        "kill the frontend (SIGKILL) and start a new one while a writer streams ... ok",
        "zero errors",
        "the stream is whole",
        "upgrade the mount owner (SIGTERM: it hands the stage over to the keeper) while a writer streams ... ok",
        "after the upgrade: the stream is whole, and the new owner serves the stage it took back ... ok",
        "took a handed-over stage back",
        "kill the mount owner (SIGKILL: no hand-over) while a writer streams: a successor takes the stage over ... ok",
        "after the crash: the stream is whole, and the successor serves the stage ... ok",
        "crashed=true",
        "kill the mount owner and the keeper (SIGKILL) ... ok",
        "start a new keeper ... ok",
        "mount lease released",
        "stop the keeper (SIGTERM) ... ok",
    ] {
        assert!(stdout.contains(proof), "{proof:?} missing:\n{stdout}");
    }
    // The upgrade's figures: the time to ready, zero errors, the pauses.
    let upgrade = details(&stdout, "upgrade the mount owner (SIGTERM");
    for figure in [
        "exited 0",
        "(owner upgrade: SIGTERM to ready)",
        "zero errors",
        "throughput",
        "longest pause between writes during the upgrade",
    ] {
        assert!(
            upgrade.iter().any(|l| l.contains(figure)),
            "{figure:?} missing from the upgrade's figures {upgrade:#?}:\n{stdout}"
        );
    }
    // The crash's figures, as the upgrade's.
    let crash = details(
        &stdout,
        "kill the mount owner (SIGKILL: no hand-over) while",
    );
    for figure in [
        "keeping it for a successor",
        "(owner crash: SIGKILL to ready)",
        "zero errors",
        "longest pause between writes during the take-over",
    ] {
        assert!(
            crash.iter().any(|l| l.contains(figure)),
            "{figure:?} missing from the crash's figures {crash:#?}:\n{stdout}"
        );
    }
    let after = details(&stdout, "after the upgrade: the stream is whole");
    for proof in [
        "read back and checked",
        "never remounted",
        "no new claim",
        "the stage serves",
        "took a handed-over stage back",
    ] {
        assert!(
            after.iter().any(|l| l.contains(proof)),
            "{proof:?} missing from {after:#?}:\n{stdout}"
        );
    }
    let ours = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!ours.contains(&dir.display().to_string()), "a mount leaked");
}

#[test]
fn each_part_runs_alone() {
    if !privileged("each_part_runs_alone") {
        return;
    }
    for (flag, absent, present) in [
        (
            "--local-only",
            "the replicated node",
            "NodePublishVolume read-only ... ok",
        ),
        (
            "--replicated-only",
            "start the local CSI driver",
            "NodeUnstageVolume",
        ),
    ] {
        let (output, stdout) = run(&[flag]).unwrap();
        assert!(
            output.status.success(),
            "{flag}: exit {:?}:\n{stdout}",
            output.status
        );
        assert!(!stdout.contains(absent), "{flag}:\n{stdout}");
        assert!(stdout.contains(present), "{flag}:\n{stdout}");
        assert!(!workspace(&stdout).unwrap().exists(), "{flag}:\n{stdout}");
        for pid in pids(&stdout) {
            assert!(!is_running(pid), "{flag}: pid {pid} is still running");
        }
    }
}

#[test]
fn keep_leaves_reachable_processes_that_kill_stops() {
    if !privileged("keep_leaves_reachable_processes_that_kill_stops") {
        return;
    }
    let (output, stdout) = run(&["--keep"]).unwrap();
    let dir = workspace(&stdout).unwrap();
    // The kept processes, as the "left running" lines list them.
    let kept: Vec<i32> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("left running"))
        .filter_map(|l| l.trim_start().strip_prefix("pid "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    let pid = kept.first().copied().unwrap_or(0);
    // Stop the kept processes whatever the assertions below say.
    struct Stop(Vec<i32>, PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            for pid in &self.0 {
                if let Some(pid) = rustix::process::Pid::from_raw(*pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while self.0.iter().any(|p| is_running(*p)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            // The processes' namespace, and with it every mount, is gone with them; from this
            // namespace the directory never held a mount.
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let stop = Stop(kept.clone(), dir.clone());
    assert_eq!(
        kept.len(),
        6,
        "driver, leader, follower, keeper, owner, frontend:\n{stdout}"
    );

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
    for pid in &kept {
        assert!(is_running(*pid), "pid {pid} is not running:\n{stdout}");
    }
    assert!(dir.join("node/csi.sock").exists() && dir.join("node/owner.sock").exists());
    assert!(dir.join("node/keeper.sock").exists());
    assert!(
        stdout.contains(&format!(
            "unix://{} (keeper)",
            dir.join("node/keeper.sock").display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{} (keeper)",
            dir.join("node/keeper.log").display()
        )),
        "{stdout}"
    );
    assert!(dir.join("worker/controller.sock").exists());
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
    for pid in &kept {
        assert!(!is_running(*pid), "kill {pid} did not stop it");
    }
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
        last.starts_with("FAIL: wait for the driver's socket: pid ") && last.contains("exited"),
        "{stdout}"
    );
    assert!(!workspace(&stdout).unwrap().exists(), "{stdout}");
}
