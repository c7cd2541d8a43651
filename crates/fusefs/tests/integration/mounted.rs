//! What a `Mounted` owns: the volume's tasks (stopped on unmount, or alone for a hand-off), its
//! state as data, and an unmount that a remaining bind refuses without changing anything.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::time::Duration;

use worker::AccessMode;

use crate::support::Setup;

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
