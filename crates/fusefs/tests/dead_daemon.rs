//! DESIGN.md section 5: decisions about a possibly dead FUSE mount are made from what the
//! kernel already knows, never by asking the filesystem. This proves each method on a FUSE
//! daemon that is first frozen (SIGSTOP: every request would hang forever) and then killed
//! (SIGKILL: every request fails): `/proc/self/mountinfo`, `statx` with `AT_STATX_DONT_SYNC |
//! AT_SYMLINK_NOFOLLOW` on the mount root, and `statmount` (through `mounter`'s per-target
//! probe), each within a short timeout; then the mount is unmounted after an identity check.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fusefs::testing::WorkerVolume;
use fusefs::{FS_TYPE, FsConfig};
use mounter::{LinuxMounter, MountCalls, Mounter, Probe, TargetRoot};
use worker::{AccessMode, Timings};

const CHILD_ENV: &str = "FUSEFS_DEAD_DAEMON_MOUNT";
/// How long a kernel-only answer may take, generously: a request to a frozen daemon never
/// comes back at all.
const PROMPT: Duration = Duration::from_secs(5);

/// Not a test on its own: the daemon process. Mounts a volume at `$FUSEFS_DEAD_DAEMON_MOUNT`,
/// writes `<mount>.ready`, and serves until it is stopped or killed.
#[test]
#[ignore = "the FUSE daemon process of a_frozen_or_killed_daemon_is_never_asked"]
fn dead_daemon_child() {
    let Some(mount_point) = std::env::var_os(CHILD_ENV).map(PathBuf::from) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Beside the mount point, inside the parent test's temporary directory, which removes it:
    // this process is killed and cleans up nothing.
    let state = mount_point.with_extension("state");
    rt.block_on(async {
        let volume = WorkerVolume::start(
            &state,
            "v1.dead-daemon",
            AccessMode::Rwx,
            Timings::default(),
        )
        .await
        .unwrap();
        let mounted = volume
            .mount(
                &mount_point,
                lease_client::Budgets::default(),
                FsConfig::default(),
            )
            .await
            .unwrap();
        std::fs::write(mount_point.with_extension("ready"), b"").unwrap();
        std::future::pending::<()>().await;
        drop((mounted, volume));
    });
}

/// Kills the child on drop, so a failed assertion never leaves a daemon behind.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
}

/// Runs `probe` on another thread and fails if it does not answer within [`PROMPT`]. A probe
/// that asked the filesystem would hang here on the frozen daemon.
fn promptly<T: Send + 'static>(what: &str, probe: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(probe());
    });
    let answer = rx.recv_timeout(PROMPT).unwrap_or_else(|_| {
        panic!("{what} did not answer within {PROMPT:?}: it asked the FUSE daemon")
    });
    eprintln!("{what}: {:?}", started.elapsed());
    answer
}

fn check_kernel_only_answers(dir: &Path, mount_point: &Path, state: &str) {
    let mp = mount_point.to_owned();
    let from_table = promptly(&format!("mountinfo ({state})"), move || {
        let bytes = mountinfo::read_self().unwrap();
        let table = mountinfo::MountTable::parse(&bytes).unwrap();
        table.by_mount_point(&mp).map(|m| m.fs_type().to_owned())
    });
    assert_eq!(from_table.as_deref(), Some(std::ffi::OsStr::new(FS_TYPE)));

    let mp = mount_point.to_owned();
    let mode = promptly(&format!("statx DONT_SYNC ({state})"), move || {
        let stx = rustix::fs::statx(
            rustix::fs::CWD,
            &mp,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW | rustix::fs::AtFlags::STATX_DONT_SYNC,
            rustix::fs::StatxFlags::TYPE | rustix::fs::StatxFlags::MNT_ID,
        )
        .unwrap();
        (stx.stx_mode, stx.stx_attributes)
    });
    assert_eq!(u32::from(mode.0) & libc::S_IFMT, libc::S_IFDIR);

    for probe in [Probe::Kernel, Probe::MountTable] {
        let (dir, mp) = (dir.to_owned(), mount_point.to_owned());
        let found = promptly(&format!("mounter {probe:?} ({state})"), move || {
            let target = TargetRoot::new(dir).unwrap().resolve(&mp).unwrap();
            LinuxMounter::with_methods(probe, MountCalls::New)
                .mounted_at(&target)
                .unwrap()
        });
        let found = found.expect("the FUSE mount is seen");
        assert_eq!(found.identity.fs_type, FS_TYPE, "{probe:?}");
        assert_eq!(found.identity.source, "v1.dead-daemon", "{probe:?}");
    }
}

#[test]
fn a_frozen_or_killed_daemon_is_never_asked() {
    if !test_support::private_mount_namespace_with_fuse("a_frozen_or_killed_daemon_is_never_asked")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mount_point = dir.path().join("mnt");
    std::fs::create_dir(&mount_point).unwrap();
    // The child shares this thread's private mount namespace.
    let mut daemon = Daemon(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "dead_daemon_child",
                "--ignored",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, &mount_point)
            .spawn()
            .unwrap(),
    );
    let ready = mount_point.with_extension("ready");
    let start = Instant::now();
    while !ready.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the daemon never mounted"
        );
        assert!(
            daemon.0.try_wait().unwrap().is_none(),
            "the daemon exited before mounting"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // statmount's sb_source (Linux 6.13) is what lets the kernel probe answer without the
    // table; on such kernels the probe must really be the kernel's, not the fallback.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    if (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (6, 13) {
        assert!(
            LinuxMounter::kernel_probe_available(),
            "kernel {release} answers statmount"
        );
    }

    signal(&daemon.0, rustix::process::Signal::STOP);
    check_kernel_only_answers(dir.path(), &mount_point, "frozen daemon");

    signal(&daemon.0, rustix::process::Signal::KILL);
    daemon.0.wait().unwrap();
    check_kernel_only_answers(dir.path(), &mount_point, "killed daemon");

    // The dead mount goes after an identity check, never by path alone.
    let target = TargetRoot::new(dir.path())
        .unwrap()
        .resolve(&mount_point)
        .unwrap();
    let mounter = LinuxMounter::new();
    let found = mounter.mounted_at(&target).unwrap().unwrap();
    let other_volume = mounter::MountIdentity {
        source: "v1.another-volume".into(),
        ..found.identity.clone()
    };
    let refused = mounter.unmount(&target, &other_volume).unwrap_err();
    assert!(
        matches!(refused, mounter::Error::ForeignMount { .. }),
        "{refused}"
    );
    assert!(
        mounter.mounted_at(&target).unwrap().is_some(),
        "a refused unmount leaves it"
    );
    assert_eq!(
        mounter.unmount(&target, &found.identity).unwrap(),
        mounter::Unmounted::Unmounted
    );
    assert!(mounter.mounted_at(&target).unwrap().is_none());
}
