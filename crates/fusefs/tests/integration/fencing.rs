//! Stale epoch: once another node holds an RWO volume, every operation on the old mount fails
//! and nothing it attempts reaches the volume's data.

use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fusefs::{Fs, FsConfig};
use lease_client::protocol::MountEpoch;
use lease_client::{Error, LeaseConfig, MountLease, Refusal};
use rustix::fs::{AtFlags, CWD, Timespec, Timestamps};
use worker::{AccessMode, Timings};

use crate::support::{
    Mount, MountOptions, SCALE, Volume, Watchdog, errno_of, runtime, timed, tree_with_metadata,
};

/// The lease, shortened further than the other timings (3 s instead of 9 s) so that node A's
/// lease runs out quickly once it stops renewing; the client's lease timings keep the
/// default proportions to it.
const LEASE: Duration = Duration::from_secs(3);

#[test]
fn after_another_node_claims_the_volume_every_operation_of_the_old_mount_fails() {
    let test = "after_another_node_claims_the_volume_every_operation_of_the_old_mount_fails";
    if !test_support::private_mount_namespace_with_fuse(test) {
        return;
    }
    let _watchdog = Watchdog::arm(test, Duration::from_secs(60));
    let rt = runtime();
    let timings = Timings {
        lease: LEASE,
        ..Timings::default().scaled(SCALE)
    };
    let lease = LeaseConfig::default().scaled(LEASE.as_secs_f64() / 90.0);
    let volume = rt.block_on(Volume::start_with(AccessMode::Rwo, timings));
    let options = MountOptions {
        lease,
        renew_lease: true,
        ..MountOptions::default()
    };
    let mut mount_a = rt.block_on(Mount::with(
        &volume,
        &volume.mount_point("a"),
        "node-a",
        options,
    ));
    let a = mount_a.path().to_owned();

    // Node A works while it holds the lease (renewed in the background, so longer than one
    // lease).
    fs::create_dir(a.join("dir")).unwrap();
    fs::write(a.join("dir/f"), b"written by A").unwrap();
    std::os::unix::fs::symlink("dir/f", a.join("link")).unwrap();
    let held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(a.join("dir/f"))
        .unwrap();
    std::thread::sleep(LEASE + Duration::from_millis(500));
    held.write_all_at(b"W", 0).unwrap();
    assert_eq!(fs::read(a.join("dir/f")).unwrap(), b"Written by A");

    // A stops renewing (its node lost contact with the lease, say); node B claims as soon as
    // the workers let it: when A's lease has run out.
    rt.block_on(mount_a.lease_renewal.take().unwrap().stop());
    let client_b = volume.client();
    let epoch_b = MountEpoch::random().unwrap();
    let lease_b = MountLease::new(&client_b, epoch_b, "node-b", lease);
    let started = Instant::now();
    loop {
        let call = lease_b.prepare_claim().unwrap();
        match rt.block_on(lease_b.claim(&call)) {
            Ok(_) => break,
            Err(Error::Refused {
                refusal: Refusal::LeaseHeld { .. },
                ..
            }) if started.elapsed() < 4 * LEASE => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) => panic!("node B's claim failed: {error}"),
        }
    }
    eprintln!(
        "node B claimed {:?} after A stopped renewing",
        started.elapsed()
    );
    let before = tree_with_metadata(&volume.backing_dir());

    // Every operation on A's mount fails, promptly (a definite refusal, no budget spent).
    let mut buf = [0u8; 16];
    type Attempt<'a> = (&'static str, Box<dyn FnOnce() -> io::Result<()> + 'a>);
    let attempts: Vec<Attempt<'_>> = vec![
        ("stat", Box::new(|| fs::metadata(a.join("dir/f")).map(drop))),
        (
            "lstat of the root's entry",
            Box::new(|| fs::symlink_metadata(a.join("link")).map(drop)),
        ),
        ("fstat", Box::new(|| held.metadata().map(drop))),
        ("read", Box::new(|| held.read_at(&mut buf, 0).map(drop))),
        (
            "write",
            Box::new(|| held.write_at(b"A was here", 0).map(drop)),
        ),
        ("truncate", Box::new(|| held.set_len(0))),
        (
            "open",
            Box::new(|| fs::File::open(a.join("dir/f")).map(drop)),
        ),
        ("create", Box::new(|| fs::write(a.join("dir/new"), b"x"))),
        ("mkdir", Box::new(|| fs::create_dir(a.join("dir2")))),
        (
            "readdir",
            Box::new(|| fs::read_dir(&a)?.next().transpose().map(drop)),
        ),
        (
            "readlink",
            Box::new(|| fs::read_link(a.join("link")).map(drop)),
        ),
        (
            "symlink",
            Box::new(|| std::os::unix::fs::symlink("x", a.join("l2"))),
        ),
        (
            "link",
            Box::new(|| fs::hard_link(a.join("dir/f"), a.join("h"))),
        ),
        (
            "rename",
            Box::new(|| fs::rename(a.join("dir/f"), a.join("g"))),
        ),
        ("unlink", Box::new(|| fs::remove_file(a.join("dir/f")))),
        ("rmdir", Box::new(|| fs::remove_dir(a.join("dir")))),
        (
            "chmod",
            Box::new(|| fs::set_permissions(a.join("dir/f"), fs::Permissions::from_mode(0o777))),
        ),
        (
            "chown",
            Box::new(|| std::os::unix::fs::chown(a.join("dir/f"), Some(1), Some(1))),
        ),
        (
            "utimens",
            Box::new(|| {
                let zero = Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                let times = Timestamps {
                    last_access: zero,
                    last_modification: zero,
                };
                rustix::fs::utimensat(CWD, a.join("dir/f"), &times, AtFlags::empty())
                    .map_err(io::Error::from)
            }),
        ),
        ("fsync", Box::new(|| held.sync_all())),
        (
            "statfs",
            Box::new(|| rustix::fs::statvfs(&a).map(drop).map_err(io::Error::from)),
        ),
    ];
    for (what, attempt) in attempts {
        let (result, took) = timed(attempt);
        assert_eq!(
            errno_of(result),
            Some(libc::EIO),
            "{what} on the fenced mount"
        );
        assert!(took < Duration::from_secs(1), "{what} took {took:?}");
    }
    drop(held);
    let after = tree_with_metadata(&volume.backing_dir());
    assert_eq!(before, after, "the fenced mount changed the volume's data");

    // Node B mounts with its epoch and sees A's last acknowledged write; A stays fenced.
    let fs_b = Arc::new(Fs::new(client_b.with_epoch(epoch_b), FsConfig::default()).unwrap());
    let mount_b = rt.block_on(Mount::of(fs_b, &volume, &volume.mount_point("b")));
    let b = mount_b.path().to_owned();
    assert_eq!(fs::read(b.join("dir/f")).unwrap(), b"Written by A");
    fs::write(b.join("dir/f"), b"B's now").unwrap();
    assert_eq!(errno_of(fs::read(a.join("dir/f"))), Some(libc::EIO));
    // A renewal or a new claim with A's epoch cannot take the volume back.
    let lease_a = mount_a.lease.take().unwrap();
    assert!(matches!(
        rt.block_on(lease_a.renew()),
        Err(Error::Refused {
            refusal: Refusal::StaleEpoch,
            ..
        })
    ));
    assert_eq!(fs::read(b.join("dir/f")).unwrap(), b"B's now");

    rt.block_on(mount_a.unmount());
    rt.block_on(mount_b.unmount());
}
