//! Closing the last copy of the descriptor aborts the connection: nobody hangs.

use rustix::io::Errno;

use crate::memfs::STUCK;
use crate::support::{MountPoint, PROMPT, bounded, errno, mount_stuck, runtime, started};

#[test]
fn closing_the_last_copy_aborts_the_connection() {
    if !test_support::private_mount_namespace_with_fuse(
        "closing_the_last_copy_aborts_the_connection",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let (session, mut entered) = mount_stuck(&rt, &mnt);
    let hello = mnt.file("hello");
    bounded("stat", move || std::fs::metadata(hello)).unwrap();

    let path = mnt.file(STUCK);
    let stuck = started(move || std::fs::metadata(path));
    rt.block_on(async { tokio::time::timeout(PROMPT, entered.recv()).await })
        .unwrap()
        .unwrap();

    // The session's copy is the only one.
    drop(session);
    let read_request = stuck
        .recv_timeout(PROMPT)
        .expect("the caller of a request already read is released")
        .unwrap_err();
    let hello = mnt.file("hello");
    let new_request =
        bounded("stat after the abort", move || std::fs::metadata(hello)).unwrap_err();
    eprintln!(
        "observed: after the last copy closed, the caller whose request had been read got \
         {read_request} ({}), a new call got {new_request} ({})",
        errno(&read_request),
        errno(&new_request)
    );
    assert_eq!(errno(&read_request), Errno::CONNABORTED.raw_os_error());
    assert_eq!(errno(&new_request), Errno::NOTCONN.raw_os_error());

    mnt.unmount();
}
