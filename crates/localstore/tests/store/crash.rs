//! Crash safety: stop every operation at every step, reopen, and check what reconciliation
//! leaves. Once in-process through the fault-injection hook, once with real processes killed by
//! SIGKILL at each step.

use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use localstore::{CrashPoint, Store, StoreOptions, VolumeId, VolumeState};

use crate::common::{NODE, Root, assert_consistent, request};
use crate::require_root;

const TARGET: &str = "/consumer/1/replica/mount";
const CHILD_ENV: &str = "LOCALSTORE_CRASH_CHILD";
const CHILD_TEST: &str = "crash::child_process_entry";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Delete,
    Claim,
    Release,
}

impl Op {
    const ALL: [Self; 4] = [Self::Create, Self::Delete, Self::Claim, Self::Release];

    fn points(self) -> &'static [CrashPoint] {
        match self {
            Self::Create => CrashPoint::CREATE,
            Self::Delete => CrashPoint::DELETE,
            Self::Claim => CrashPoint::CLAIM,
            Self::Release => CrashPoint::RELEASE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Delete => "delete",
            Self::Claim => "claim",
            Self::Release => "release",
        }
    }

    fn parse(s: &str) -> Self {
        Self::ALL.into_iter().find(|op| op.name() == s).unwrap()
    }

    /// Builds the state the operation starts from.
    fn prepare(self, root: &Root) -> VolumeId {
        let store = root.open();
        let id = store.volume_id("vol").unwrap();
        if self != Self::Create {
            store.create(&request("vol")).unwrap();
            let dir = store.data_dir(&id);
            fs::create_dir(dir.join("sub")).unwrap();
            fs::write(dir.join("sub/file"), b"user data").unwrap();
            fs::write(dir.join("top"), b"user data").unwrap();
        }
        if self == Self::Release {
            store.claim(&id, Path::new(TARGET)).unwrap();
        }
        // A bystander volume that no crash may disturb.
        store.create(&request("bystander")).unwrap();
        id
    }

    fn run(self, store: &Store, id: &VolumeId) {
        match self {
            Self::Create => drop(store.create(&request("vol")).unwrap()),
            Self::Delete => store.delete(id).unwrap(),
            Self::Claim => drop(store.claim(id, Path::new(TARGET)).unwrap()),
            Self::Release => store.release(id, Path::new(TARGET)).unwrap(),
        }
    }
}

fn point_named(name: &str) -> CrashPoint {
    Op::ALL
        .iter()
        .flat_map(|op| op.points())
        .copied()
        .find(|p| p.to_string() == name)
        .unwrap()
}

/// Whether the operation's effect is visible after a crash at `point` (and reconciliation).
fn took_effect(point: CrashPoint) -> bool {
    use CrashPoint::*;
    match point {
        CreateRecordTempWritten
        | CreateRecordRenamed
        | CreateRecordDurable
        | CreateDataDirMade
        | CreateDataDirDurable
        | CreateReadyTempWritten => false,
        CreateReadyRenamed | CreateReadyDurable => true,
        DeleteRecordTempWritten => false,
        DeleteRecordRenamed
        | DeleteRecordDurable
        | DeleteDataPartlyRemoved
        | DeleteDataDirRemoved
        | DeleteDataDirDurable
        | DeleteRecordRemoved => true,
        ClaimTempWritten => false,
        ClaimRenamed | ClaimDurable => true,
        ReleaseClaimRemoved | ReleaseDurable => true,
    }
}

/// Reopens the store after a crash at `point` and checks consistency, the operation's outcome,
/// the bystander, and that retrying the operation reaches the desired state.
fn check_after_crash(root: &Root, op: Op, point: CrashPoint, id: &VolumeId) {
    let store = root.open();
    assert_consistent(&store);
    let effect = took_effect(point);
    let record = store.find(id).unwrap();
    let claim = store.claim_of(id).unwrap();
    match op {
        Op::Create => assert_eq!(record.is_some(), effect, "{point}"),
        Op::Delete => {
            assert_eq!(record.is_none(), effect, "{point}");
            if !effect {
                // Not a byte of the user's data was lost.
                let dir = store.data_dir(id);
                assert_eq!(fs::read(dir.join("sub/file")).unwrap(), b"user data");
                assert_eq!(fs::read(dir.join("top")).unwrap(), b"user data");
            }
        }
        Op::Claim => assert_eq!(claim.is_some(), effect, "{point}"),
        Op::Release => assert_eq!(claim.is_none(), effect, "{point}"),
    }
    if let Some(record) = record {
        assert_eq!(record.state, VolumeState::Ready);
    }
    let bystander = store.get(&store.volume_id("bystander").unwrap()).unwrap();
    assert!(store.data_dir(&bystander.volume_id).is_dir());
    // A retry (as the CO would send) reaches the desired state.
    op.run(&store, id);
    assert_consistent(&store);
}

#[derive(Debug)]
struct Stopped;

#[test]
fn every_step_in_process() {
    require_root!();
    let mut checked = 0;
    for op in Op::ALL {
        for &point in op.points() {
            let root = Root::new();
            let id = op.prepare(&root);
            let hook: localstore::CrashHook = Arc::new(move |reached| {
                if reached == point {
                    std::panic::panic_any(Stopped);
                }
            });
            let store = Store::open(root.path(), StoreOptions::new(NODE).crash_hook(hook)).unwrap();
            let outcome = catch_unwind(AssertUnwindSafe(|| op.run(&store, &id)));
            let payload = outcome.expect_err(&format!("{op:?} never reached {point}"));
            assert!(
                payload.is::<Stopped>(),
                "{op:?} at {point} panicked for another reason"
            );
            drop(store);
            check_after_crash(&root, op, point, &id);
            checked += 1;
        }
    }
    assert_eq!(checked, 20);
}

/// Not a test of its own: the body of the child process that [`every_step_killed_by_sigkill`]
/// starts (ignored, so a normal run does not count it as a test).
#[test]
#[ignore = "the child process of every_step_killed_by_sigkill"]
fn child_process_entry() {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let spec = spec.into_string().unwrap();
    let mut parts = spec.splitn(4, '\t');
    let op = Op::parse(parts.next().unwrap());
    let point = point_named(parts.next().unwrap());
    let marker = PathBuf::from(parts.next().unwrap());
    let root = PathBuf::from(parts.next().unwrap());
    let hook: localstore::CrashHook = Arc::new(move |reached| {
        if reached == point {
            fs::write(&marker, b"reached").unwrap();
            loop {
                std::thread::sleep(Duration::from_secs(60));
            }
        }
    });
    let store = Store::open(&root, StoreOptions::new(NODE).crash_hook(hook)).unwrap();
    let id = store.volume_id("vol").unwrap();
    op.run(&store, &id);
    panic!("{op:?} finished without reaching {point}");
}

#[test]
fn every_step_killed_by_sigkill() {
    require_root!();
    let exe = std::env::current_exe().unwrap();
    for op in Op::ALL {
        for &point in op.points() {
            let root = Root::new();
            let id = op.prepare(&root);
            let marker = root.path().with_extension("reached");
            let mut child = Command::new(&exe)
                .args([
                    "--exact",
                    CHILD_TEST,
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    CHILD_ENV,
                    format!(
                        "{}\t{point}\t{}\t{}",
                        op.name(),
                        marker.display(),
                        root.path().display()
                    ),
                )
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !marker.exists() {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("child for {op:?} at {point} exited early: {status}");
                }
                assert!(Instant::now() < deadline, "child never reached {point}");
                std::thread::sleep(Duration::from_millis(5));
            }
            child.kill().unwrap(); // SIGKILL
            let status = child.wait().unwrap();
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(9)
            );
            fs::remove_file(&marker).unwrap();
            check_after_crash(&root, op, point, &id);
        }
    }
}
