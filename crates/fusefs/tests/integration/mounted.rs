//! What a `Mounted` owns: the volume's tasks (stopped on unmount, or alone for a hand-off), its
//! state as data, and an unmount that a remaining bind refuses without changing anything.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;
use std::time::Duration;

use fusefs::{Fs, FsConfig, ServingThreads};
use worker::AccessMode;

use crate::support::{Setup, budgets, register_connection, unregister_connection};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn the_mount_owns_its_tasks_and_shows_its_state_as_data() {
    let Some(mut setup) = Setup::new(
        "the_mount_owns_its_tasks_and_shows_its_state_as_data",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    // The mount is nosuid and nodev: set-user-ID programs and device nodes on a shared volume
    // never take effect on this node.
    let table = mountinfo::read_self().unwrap();
    let table = mountinfo::MountTable::parse(&table).unwrap();
    let options = table.by_mount_point(&root).unwrap().mount_options();
    for flag in ["nosuid", "nodev"] {
        assert!(options.has_flag(flag), "{flag}: {options:?}");
    }
    fs::create_dir(root.join("dir")).unwrap();
    fs::write(root.join("dir/file"), b"state").unwrap();
    let mut open = fs::OpenOptions::new()
        .append(true)
        .open(root.join("dir/file"))
        .unwrap();
    let ino = fs::metadata(root.join("dir/file")).unwrap().ino();

    let mount = setup.mount.as_mut().unwrap();
    let mounted = mount.mounted.as_mut().unwrap();
    assert!(
        mounted.tasks_running(),
        "mounting starts the handle renewal"
    );
    let state = mounted.fs().state();
    assert_eq!(state.nodes[0].node, fusefs::ROOT_NODE);
    let node = state.nodes.iter().find(|n| n.node == ino).unwrap();
    assert!(node.lookups >= 1, "{state:?}");
    let handle = state.handles.iter().find(|h| h.file.ino == ino).unwrap();
    assert_eq!(node.inode_generation, handle.file.inode_generation);
    assert_ne!(
        handle.flags & libc::O_APPEND as u32,
        0,
        "the open flags are kept"
    );

    // Stopping the tasks leaves the mount served.
    mounted.stop_tasks();
    assert!(!mounted.tasks_running());
    open.write_all(b" kept").unwrap();
    drop(open);
    assert_eq!(fs::read(root.join("dir/file")).unwrap(), b"state kept");

    // A bind of the mount makes unmount refuse, and the mount stays as it was.
    let bind = setup.volume.mount_point("bind");
    rustix::mount::mount_bind(&root, &bind).unwrap();
    let refused = setup.rt.block_on(
        setup
            .mount
            .as_mut()
            .unwrap()
            .mounted
            .as_mut()
            .unwrap()
            .unmount(Duration::from_secs(1)),
    );
    assert!(
        matches!(refused, Err(fusefs::MountError::StillReferenced { .. })),
        "{refused:?}"
    );
    assert_eq!(fs::read(root.join("dir/file")).unwrap(), b"state kept");
    rustix::mount::unmount(&bind, rustix::mount::UnmountFlags::empty()).unwrap();
    setup.finish();
}

/// Five hand-overs (pause, then a new session adopts the connection) while a writer streams
/// and verifies through the mount: no call fails, no byte is lost, and every descriptor opened
/// before (a file, a directory, a file unlinked while open) works after. The connection is the
/// same throughout: the same device and INIT record, and no second INIT.
#[test]
fn a_mount_handed_over_five_times_under_load_keeps_every_open_file() {
    use std::os::unix::fs::FileExt as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some(mut setup) = Setup::new(
        "a_mount_handed_over_five_times_under_load_keeps_every_open_file",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    fs::create_dir(root.join("dir")).unwrap();
    let dir = fs::File::open(root.join("dir")).unwrap();
    let held = fs::OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(root.join("dir/held"))
        .unwrap();
    held.write_all_at(b"held before", 0).unwrap();
    let unlinked = fs::OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(root.join("unlinked"))
        .unwrap();
    unlinked.write_all_at(b"gone but open", 0).unwrap();
    fs::remove_file(root.join("unlinked")).unwrap();

    let record = setup_mounted(&setup).init_record().unwrap().clone();
    let device = setup_mounted(&setup).device();

    let stop = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let stop = Arc::clone(&stop);
        let path = root.join("stream");
        move || {
            let file = fs::OpenOptions::new()
                .create(true)
                .read(true)
                .write(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            let mut blocks = 0u64;
            let mut back = [0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                let block = [(blocks % 251) as u8; 4096];
                file.write_all_at(&block, blocks * 4096).unwrap();
                file.read_exact_at(&mut back, blocks * 4096).unwrap();
                assert_eq!(back, block, "block {blocks} read back");
                blocks += 1;
            }
            blocks
        }
    });
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(60));
        let mount = setup.mount.as_mut().unwrap();
        setup.rt.block_on(mount.hand_over());
    }
    std::thread::sleep(Duration::from_millis(60));
    stop.store(true, Ordering::Relaxed);
    let blocks = writer.join().expect("the writer saw no error");
    assert!(blocks > 5, "the writer made progress: {blocks} blocks");
    let stream = fs::read(root.join("stream")).unwrap();
    assert_eq!(stream.len() as u64, blocks * 4096);
    for (i, block) in stream.chunks(4096).enumerate() {
        assert!(block.iter().all(|&b| b == (i % 251) as u8), "block {i}");
    }

    let mut text = [0u8; 13];
    held.read_exact_at(&mut text[..11], 0).unwrap();
    assert_eq!(&text[..11], b"held before");
    held.write_all_at(b" and after", 11).unwrap();
    unlinked.read_exact_at(&mut text, 0).unwrap();
    assert_eq!(&text, b"gone but open");
    assert_eq!(unlinked.metadata().unwrap().nlink(), 0);
    let inside = rustix::fs::openat(
        &dir,
        "held",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let mut both = Vec::new();
    std::io::Read::read_to_end(&mut fs::File::from(inside), &mut both).unwrap();
    assert_eq!(both, b"held before and after");

    assert_eq!(
        setup_mounted(&setup).device(),
        device,
        "the same connection"
    );
    assert_eq!(
        setup_mounted(&setup).init_record().unwrap(),
        &record,
        "served by the first INIT's record"
    );
    drop((dir, held, unlinked));
    setup.finish();
}

fn setup_mounted(
    setup: &Setup,
) -> &fusefs::Mounted<lease_client::Client<lease_client::HttpsTransport>> {
    setup.mount.as_ref().unwrap().mounted.as_ref().unwrap()
}

/// An adoption that does not fit the mount (another connection's device, or no mount at the
/// path) is refused before anything changes, and hands the connection back: resuming it
/// afterwards serves the mount as before.
#[test]
fn a_mismatched_adoption_is_refused_and_changes_nothing() {
    let Some(mut setup) = Setup::new(
        "a_mismatched_adoption_is_refused_and_changes_nothing",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    let root = setup.root();
    fs::write(root.join("file"), b"before").unwrap();
    let mount = setup.mount.as_mut().unwrap();
    let mounted = mount.mounted.take().unwrap();
    let paused = setup
        .rt
        .block_on(mounted.pause(Duration::from_secs(5)))
        .unwrap();
    let (major, minor) = paused.device;
    let elsewhere = setup.volume.mount_point("elsewhere");
    let _guard = setup.rt.enter();

    let refused = fusefs::adopt(
        Arc::clone(&paused.fs),
        &paused.volume_id,
        &paused.path,
        (major, minor + 1),
        paused.connection,
    )
    .unwrap_err();
    assert!(
        matches!(refused.error, fusefs::MountError::NotOurs { .. }),
        "{:?}",
        refused.error
    );
    let refused = fusefs::adopt(
        Arc::clone(&paused.fs),
        &paused.volume_id,
        &elsewhere,
        paused.device,
        refused.connection,
    )
    .unwrap_err();
    assert!(
        matches!(&refused.error, fusefs::MountError::NotOurs { found, .. } if found == "nothing"),
        "{:?}",
        refused.error
    );
    let refused = fusefs::adopt(
        Arc::clone(&paused.fs),
        "v1.another-volume",
        &paused.path,
        paused.device,
        refused.connection,
    )
    .unwrap_err();
    assert!(
        matches!(refused.error, fusefs::MountError::NotOurs { .. }),
        "{:?}",
        refused.error
    );

    let adopted = fusefs::adopt(
        paused.fs,
        &paused.volume_id,
        &paused.path,
        paused.device,
        refused.connection,
    )
    .unwrap();
    drop(_guard);
    setup.mount.as_mut().unwrap().mounted = Some(adopted);
    assert_eq!(fs::read(root.join("file")).unwrap(), b"before");
    fs::write(root.join("file"), b"after").unwrap();
    assert_eq!(fs::read(root.join("file")).unwrap(), b"after");
    setup.finish();
}

#[test]
fn a_mount_on_a_serving_thread_is_served_there_with_its_connection() {
    let Some(setup) = Setup::new(
        "a_mount_on_a_serving_thread_is_served_there_with_its_connection",
        AccessMode::Rwx,
        LIMIT,
    ) else {
        return;
    };
    // Made after the namespace switch, so the thread lives in the private namespace.
    let serving = ServingThreads::new("serving-test", 1).unwrap();
    let runtime = serving.next();
    assert_eq!(runtime.metrics().num_alive_tasks(), 0);
    let client = setup.volume.worker.client_on(budgets(), runtime.clone());
    let fs = Arc::new(Fs::new(client, FsConfig::default()).unwrap());
    let path = setup.volume.mount_point("b");
    // Mounted from the test's multi-threaded runtime, served on the serving thread.
    let mut mounted = setup
        .rt
        .block_on(fusefs::mount_on(
            &runtime,
            fs,
            &setup.volume.spec.volume_id,
            &path,
        ))
        .unwrap();
    register_connection(mounted.device().1, &path);

    fs::write(setup.root().join("f"), b"through a").unwrap();
    assert_eq!(fs::read(path.join("f")).unwrap(), b"through a");
    fs::write(path.join("g"), b"through b").unwrap();
    assert_eq!(fs::read(setup.root().join("g")).unwrap(), b"through b");
    // The session, the handle renewal and the worker connection all run there.
    let tasks = runtime.metrics().num_alive_tasks();
    assert!(tasks >= 3, "{tasks} tasks on the serving thread");

    let minor = mounted.device().1;
    setup
        .rt
        .block_on(mounted.unmount(Duration::from_secs(5)))
        .unwrap();
    unregister_connection(minor);
    drop(serving);
    setup.finish();
}
