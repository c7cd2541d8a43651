//! Hand-off across processes: an owner process mounts and serves, deposits a copy of its
//! descriptor and its INIT record over `SCM_RIGHTS` (`fdpass`), and is killed; this process
//! adopts the copy.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use fdpass::{AsyncChannel, AsyncListener, Listener};
use fuse_session::{ServeOptions, Session};
use fuse_wire::Opcode;
use tokio::sync::mpsc;

use crate::memfs::{DATA_LEN, HELLO, MemFs, Stuck};
use crate::support::{
    ChildProcess, MountPoint, PROMPT, STILL_WAITING, bounded, options, runtime, started, wait_ended,
};

const OWNER_SOCKET: &str = "FUSE_SESSION_TEST_OWNER_SOCKET";
const OWNER_MOUNT: &str = "FUSE_SESSION_TEST_OWNER_MOUNT";

/// Not a test on its own: the owner process. Mounts at `$FUSE_SESSION_TEST_OWNER_MOUNT`,
/// connects to the keeper socket `$FUSE_SESSION_TEST_OWNER_SOCKET`, deposits its descriptor
/// and encoded INIT record, then serves until killed. A LOOKUP of `stuck` is never answered;
/// its `unique` is reported on the socket (8 bytes, little-endian).
#[test]
#[ignore = "the owner process of the hand-off tests, started by them"]
fn owner_process() {
    let (Some(socket), Some(mount)) = (
        std::env::var_os(OWNER_SOCKET),
        std::env::var_os(OWNER_MOUNT),
    ) else {
        return;
    };
    let rt = runtime();
    rt.block_on(async {
        let (entered_tx, mut entered) = mpsc::unbounded_channel();
        let handler = MemFs::new().stuck(Stuck::Forever, entered_tx);
        let session = Session::mount(Path::new(&mount), &options(), handler)
            .await
            .unwrap();
        let keeper = fdpass::Channel::connect(&socket).unwrap();
        keeper
            .send(&session.record().encode(), &[session.descriptor()])
            .unwrap();
        while let Some(unique) = entered.recv().await {
            keeper.send(&unique.raw().to_le_bytes(), &[]).unwrap();
        }
        std::future::pending::<()>().await;
    });
}

/// An owner process and what it deposited.
pub(crate) struct Owner {
    pub(crate) process: ChildProcess,
    pub(crate) channel: AsyncChannel,
    pub(crate) fd: OwnedFd,
    pub(crate) record: Vec<u8>,
}

/// Starts an owner mounting at `mnt` and takes its deposit, as a keeper would.
pub(crate) fn start_owner(rt: &tokio::runtime::Runtime, mnt: &MountPoint) -> Owner {
    let socket = mnt.dir.path().join("keeper.sock");
    let listener = {
        let _entered = rt.enter();
        AsyncListener::new(Listener::bind(&socket).unwrap()).unwrap()
    };
    // From this thread: the owner shares its mount namespace.
    let process = ChildProcess::spawn(
        "handoff::owner_process",
        &[
            (OWNER_SOCKET, socket.as_os_str()),
            (OWNER_MOUNT, mnt.path.as_os_str()),
        ],
    );
    let (channel, deposit) = rt.block_on(async {
        let channel = tokio::time::timeout(2 * PROMPT, listener.accept())
            .await
            .expect("the owner connects")
            .unwrap();
        let deposit = tokio::time::timeout(PROMPT, channel.recv())
            .await
            .expect("the owner deposits")
            .unwrap()
            .expect("a deposit, not the end");
        (channel, deposit)
    });
    let mut fds = deposit.fds.into_iter();
    let fd = fds.next().expect("one descriptor");
    assert!(fds.next().is_none());
    Owner {
        process,
        channel,
        fd,
        record: deposit.payload,
    }
}

#[test]
fn a_copy_received_from_a_killed_owner_keeps_the_mount_alive() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_copy_received_from_a_killed_owner_keeps_the_mount_alive",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let Owner {
        mut process,
        channel,
        fd,
        record,
    } = start_owner(&rt, &mnt);

    let hello = mnt.file("hello");
    let meta = bounded("stat through the owner", move || std::fs::metadata(hello)).unwrap();
    assert_eq!(meta.len(), HELLO.len() as u64);

    // Killed while idle: its descriptors close, ours is the last copy.
    process.kill();
    drop(channel);
    let data = mnt.file("data");
    let waiting = started(move || std::fs::metadata(data));
    assert!(
        waiting.recv_timeout(STILL_WAITING).is_err(),
        "nobody reads: the call waits in the kernel's queue, the connection is not aborted"
    );

    let handler = MemFs::new();
    let log = handler.log();
    let session = {
        let _entered = rt.enter();
        Session::adopt_encoded(fd, &record, handler, &ServeOptions::default()).unwrap()
    };
    let meta = waiting
        .recv_timeout(PROMPT)
        .expect("the waiting call is answered by the adopter")
        .unwrap();
    assert_eq!((meta.len(), meta.ino()), (DATA_LEN as u64, 3));
    let hello = mnt.file("hello");
    assert_eq!(
        bounded("read through the adopter", move || std::fs::read(hello)).unwrap(),
        HELLO
    );
    assert_eq!(session.counters().unexpected_inits, 0);
    assert_eq!(log.count(Opcode::INIT), 0);
    eprintln!(
        "observed: after SIGKILL of the owner the copy received over SCM_RIGHTS kept the \
         connection: a call made in the gap waited, then the adopter (no INIT) answered it"
    );

    mnt.unmount();
    wait_ended(rt.handle(), &session);
}
