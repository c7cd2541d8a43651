//! The public POSIX conformance suite pjdfstest (its Rust edition, `cargo install pjdfstest`)
//! run against a real mount, as root in a private mount namespace, against the reference worker
//! over loopback TLS.
//!
//! Every case must pass except the ones in [`EXPECTED_FAILURES`], each of which
//! `SEMANTICS.md` explains. A listed case that starts passing fails the test too, so that the
//! list (and the document) cannot go stale. Without the `pjdfstest` binary the test is skipped
//! loudly, and fails when `CI=true` (the project's test command installs it).
//!
//! The suite runs twice against the same mount: first only the EROFS cases (which remount the
//! filesystem read-only), then every other case. pjdfstest 0.2.2 leaks descriptors in
//! `open::einval_invalid_combination`; once that case's files are unlinked, the kernel refuses
//! to make the filesystem read-only (`EBUSY`, on tmpfs and ext4 alike), so in one run every
//! EROFS case after it fails whatever the filesystem.

// Helpers outside `#[test]` functions fail the test loudly, as the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::print_stderr,
    reason = "the suite's summary and any failure must be seen in the output"
)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use fusefs::FsConfig;
use fusefs::testing::WorkerVolume;
use lease_client::Budgets;
use worker::{AccessMode, Timings};

/// The cases that fail on purpose, each with the `SEMANTICS.md` entry that says why.
const EXPECTED_FAILURES: &[(&str, &str)] = &[];

/// Long enough for the whole suite on a loaded two-core machine; a hang ends here.
const SUITE_TIMEOUT: Duration = Duration::from_secs(20 * 60);

fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default()
}

/// The `pjdfstest` binary: on `PATH`, or where `cargo install` puts it.
fn pjdfstest_binary() -> Option<PathBuf> {
    let mut dirs = path_dirs();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|dir| dir.join("pjdfstest"))
        .find(|candidate| candidate.is_file())
}

/// A directory to put first on the suite's `PATH`, holding a `mount` for the EROFS cases, which
/// remount the filesystem with `mount -o remount,ro <mount point>` (the kernel's superblock
/// flags; nothing outside this test's private mount namespace changes). It differs from
/// mount(8) twice:
/// - it never runs a mount helper: for type `fuse.tak-os-replicated`, mount(8) would run
///   `mount.fuse` where the fuse package is installed, and that would try to start a program
///   named `tak-os-replicated`;
/// - it retries a refused remount for up to 5 s: the kernel refuses to make a superblock
///   read-only while it holds an unlinked inode, and it holds a file's inode until the
///   asynchronous RELEASE of its last close is answered (see `SEMANTICS.md`, "pjdfstest").
fn mount_without_helpers(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let real = path_dirs()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|dir| dir.join("mount"))
        .find(|candidate| candidate.is_file())
        .expect("mount(8) is installed");
    let shim_dir = dir.join("bin");
    fs::create_dir(&shim_dir).unwrap();
    let shim = shim_dir.join("mount");
    fs::write(
        &shim,
        format!(
            "#!/bin/sh\n\
             tries=0\n\
             until {} -i \"$@\"; do\n\
             \x20   tries=$((tries + 1))\n\
             \x20   [ \"$tries\" -lt 50 ] || exit 32\n\
             \x20   sleep 0.1\n\
             done\n",
            real.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap();
    shim_dir
}

/// The suite's configuration: the optional features the filesystem is meant to have, the two
/// unprivileged users present on every Debian system, and the expected failures.
fn config(allow_remount: bool) -> String {
    let expected: Vec<String> = EXPECTED_FAILURES
        .iter()
        .map(|(name, _)| format!("    {name:?},\n"))
        .collect();
    format!(
        "[features]\n\
         posix_fallocate = {{}}\n\
         rename_ctime = {{}}\n\
         utime_now = {{}}\n\
         utimensat = {{}}\n\
         \n\
         [settings]\n\
         naptime = 0.01\n\
         allow_remount = {allow_remount}\n\
         expected_failures = [\n{}]\n\
         \n\
         [dummy_auth]\n\
         entries = [[\"nobody\", \"nogroup\"], [\"daemon\", \"daemon\"]]\n",
        expected.concat()
    )
}

/// One pjdfstest invocation against the mount, from the calling thread (so in its mount
/// namespace), stopped after [`SUITE_TIMEOUT`].
struct Invocation<'a> {
    binary: &'a Path,
    dir: &'a Path,
    mount_point: &'a Path,
    search_path: &'a std::ffi::OsStr,
}

/// What one invocation printed, and how it ended (`None`: it was killed after the timeout).
struct Run {
    report: String,
    status: Option<ExitStatus>,
    elapsed: Duration,
}

impl Invocation<'_> {
    fn run(&self, name: &str, allow_remount: bool, patterns: &[&str]) -> Run {
        let config_path = self.dir.join(format!("{name}.toml"));
        fs::write(&config_path, config(allow_remount)).unwrap();
        let report_path = self.dir.join(format!("{name}.txt"));
        let secondary = self.dir.join(format!("{name}-other-fs"));
        fs::create_dir(&secondary).unwrap();
        let started = Instant::now();
        let mut child = Command::new(self.binary)
            .arg("-c")
            .arg(&config_path)
            .arg("-p")
            .arg(self.mount_point)
            .arg("-s")
            .arg(&secondary)
            .args(patterns)
            .env("NO_COLOR", "1")
            .env("PATH", self.search_path)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&report_path).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() > SUITE_TIMEOUT {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        Run {
            report: fs::read_to_string(&report_path).unwrap(),
            status,
            elapsed: started.elapsed(),
        }
    }
}

/// What one run of the suite reported, by case name.
#[derive(Debug, Default)]
struct Outcome {
    cases: BTreeMap<String, Verdict>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Passed,
    Failed,
    Skipped,
    FailedAsExpected,
    PassedUnexpectedly,
}

impl Outcome {
    /// Reads pjdfstest's report: one line per case, `<name> <padding> <verdict>`, where a
    /// failure is followed by indented lines with the panic message.
    fn parse(report: &str) -> Outcome {
        let verdicts = [
            ("PASSED UNEXPECTEDLY", Verdict::PassedUnexpectedly),
            ("failed as expected", Verdict::FailedAsExpected),
            ("FAILED", Verdict::Failed),
            ("skipped", Verdict::Skipped),
            ("ok", Verdict::Passed),
        ];
        let mut outcome = Outcome::default();
        for line in report.lines().filter(|l| !l.starts_with([' ', '\t'])) {
            let Some((name, rest)) = line.split_once(' ') else {
                continue;
            };
            let rest = rest.trim();
            if let Some((_, verdict)) = verdicts.iter().find(|(text, _)| rest == *text) {
                outcome.cases.insert(name.to_owned(), *verdict);
            }
        }
        outcome
    }

    fn with(&self, verdict: Verdict) -> Vec<&str> {
        self.cases
            .iter()
            .filter(|(_, v)| **v == verdict)
            .map(|(name, _)| name.as_str())
            .collect()
    }
}

#[test]
fn pjdfstest_passes_except_the_documented_cases() {
    pjdfstest(
        "pjdfstest_passes_except_the_documented_cases",
        Serving::Fresh,
    );
}

#[test]
fn pjdfstest_passes_on_an_adopted_mount() {
    pjdfstest("pjdfstest_passes_on_an_adopted_mount", Serving::Adopted);
}

/// Who serves the mount the suite runs against.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serving {
    /// The session that mounted it.
    Fresh,
    /// Before each of the two runs, the mount is paused and its connection adopted by a new
    /// session (`Mounted::pause`, `HandOver::resume`): no second INIT, the nodes the first
    /// run left with the kernel still served.
    Adopted,
}

fn pjdfstest(test: &'static str, serving: Serving) {
    let Some(binary) = pjdfstest_binary() else {
        assert!(
            !test_support::in_ci(),
            "{test}: pjdfstest is not installed (cargo install --locked pjdfstest)"
        );
        eprintln!("SKIPPED: {test}: pjdfstest is not installed (cargo install --locked pjdfstest)");
        return;
    };
    if !test_support::private_mount_namespace_with_fuse(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The suite switches to unprivileged users, who must be able to reach the mount point.
    fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mount_point = dir.path().join("mnt");
    fs::create_dir(&mount_point).unwrap();
    let mut search_path = vec![mount_without_helpers(dir.path())];
    search_path.extend(path_dirs());
    let search_path = std::env::join_paths(search_path).unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let volume = rt
        .block_on(WorkerVolume::start(
            dir.path(),
            "v1.fusefs-pjdfstest",
            AccessMode::Rwx,
            Timings::default(),
        ))
        .unwrap();
    let mut mounted = Some(
        rt.block_on(volume.mount(&mount_point, Budgets::default(), FsConfig::default()))
            .unwrap(),
    );
    let mut hand_over = || {
        if serving == Serving::Adopted {
            let paused = rt.block_on(mounted.take().unwrap().pause(Duration::from_secs(5)));
            let adopted = rt.block_on(async { paused.unwrap().resume() }).unwrap();
            mounted = Some(adopted);
        }
    };

    let suite = Invocation {
        binary: &binary,
        dir: dir.path(),
        mount_point: &mount_point,
        search_path: &search_path,
    };
    hand_over();
    let erofs = suite.run("erofs", true, &["erofs"]);
    hand_over();
    let runs = [erofs, suite.run("all", false, &[])];

    rt.block_on(mounted.unwrap().unmount(Duration::from_secs(15)))
        .unwrap();
    rt.block_on(volume.stop());

    // The EROFS run's verdicts replace the second run's skips.
    let mut outcome = Outcome::parse(&runs[1].report);
    outcome.cases.extend(Outcome::parse(&runs[0].report).cases);
    let elapsed: Duration = runs.iter().map(|run| run.elapsed).sum();
    eprintln!(
        "pjdfstest {binary:?} in {elapsed:.0?}: {} cases: {} passed, {} failed, {} failed as \
         expected, {} passed unexpectedly, {} skipped",
        outcome.cases.len(),
        outcome.with(Verdict::Passed).len(),
        outcome.with(Verdict::Failed).len(),
        outcome.with(Verdict::FailedAsExpected).len(),
        outcome.with(Verdict::PassedUnexpectedly).len(),
        outcome.with(Verdict::Skipped).len(),
    );
    let failed = outcome.with(Verdict::Failed);
    let unexpected_passes = outcome.with(Verdict::PassedUnexpectedly);
    let statuses: Vec<Option<ExitStatus>> = runs.iter().map(|run| run.status).collect();
    if !failed.is_empty()
        || !unexpected_passes.is_empty()
        || statuses.iter().any(|s| !s.is_some_and(|s| s.success()))
    {
        let mut stderr = std::io::stderr().lock();
        for run in &runs {
            stderr.write_all(run.report.as_bytes()).unwrap();
        }
    }
    assert!(
        statuses.iter().all(Option::is_some),
        "pjdfstest did not finish in {SUITE_TIMEOUT:?}"
    );
    assert!(
        failed.is_empty(),
        "{} cases failed that SEMANTICS.md does not list: {failed:#?}",
        failed.len()
    );
    assert!(
        unexpected_passes.is_empty(),
        "cases listed as failing now pass; remove them from EXPECTED_FAILURES and SEMANTICS.md: \
         {unexpected_passes:#?}"
    );
    assert!(
        statuses.iter().flatten().all(ExitStatus::success),
        "pjdfstest failed: {statuses:?}"
    );
    assert!(
        !outcome.with(Verdict::Passed).is_empty(),
        "the report names no passing case"
    );
}
