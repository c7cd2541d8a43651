//! How the reader runs handlers: it polls each handler once itself, answers what is answered
//! at once in its own turn, and starts a task only for a request that has to wait. On one
//! thread, as fusefs serves a mount, a waiting request must hold up none of the others, and a
//! handler that panics in the reader's turn must not end the reader.

use std::os::unix::fs::MetadataExt;

use fuse_session::Session;
use tokio::sync::{mpsc, watch};

use crate::memfs::{MemFs, STUCK, Stuck};
use crate::support::{
    MountPoint, OneThread, PROMPT, bounded, errno, options, started, wait_ended, wait_until,
};

#[test]
fn on_one_thread_a_waiting_request_holds_up_none_and_only_it_becomes_a_task() {
    if !test_support::private_mount_namespace_with_fuse(
        "on_one_thread_a_waiting_request_holds_up_none_and_only_it_becomes_a_task",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let thread = OneThread::start();
    let (gate, gate_rx) = watch::channel(false);
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let handler = MemFs::new().stuck(Stuck::UntilOpened(gate_rx), entered_tx);
    let session = thread
        .handle()
        .block_on(Session::mount(&mnt.path, &options(), handler))
        .unwrap();

    let path = mnt.file(STUCK);
    let stuck = started(move || std::fs::metadata(path));
    thread
        .handle()
        .block_on(async { tokio::time::timeout(PROMPT, entered.recv()).await })
        .unwrap()
        .unwrap();
    // The handler reports entering from its first poll; the reader spawns it just after.
    wait_until("the held lookup to go on as a task", || {
        session.counters().waited == 1 && session.in_flight() == 1
    });
    let before = session.counters();

    // The one thread serves everything else while the lookup waits, each answered at once.
    for _ in 0..20 {
        let hello = mnt.file("hello");
        bounded("stat while a lookup waits", move || {
            std::fs::metadata(hello)
        })
        .unwrap();
    }
    assert!(stuck.try_recv().is_err(), "the held lookup still waits");
    let during = session.counters();
    assert!(
        during.requests >= before.requests + 20,
        "{before:?} then {during:?}"
    );
    assert_eq!(
        during.waited, 1,
        "no request answered at once became a task"
    );
    assert_eq!(session.in_flight(), 1);

    gate.send_replace(true);
    let meta = stuck.recv_timeout(PROMPT).unwrap().unwrap();
    assert_eq!(meta.ino(), 4);
    wait_until("the waiting request to finish", || session.in_flight() == 0);
    let after = session.counters();
    assert_eq!(after.waited, 1);
    assert_eq!(after.replaced_replies, 0);
    eprintln!(
        "observed: {} requests, {} of them a task of its own",
        after.requests, after.waited
    );

    mnt.unmount();
    wait_ended(thread.handle(), &session);
}

#[test]
fn a_handler_that_panics_in_the_readers_turn_is_answered_eio_and_the_reader_reads_on() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_handler_that_panics_in_the_readers_turn_is_answered_eio_and_the_reader_reads_on",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let thread = OneThread::start();
    let (entered_tx, _entered) = mpsc::unbounded_channel();
    let handler = MemFs::new().stuck(Stuck::Panics, entered_tx);
    let session = thread
        .handle()
        .block_on(Session::mount(&mnt.path, &options(), handler))
        .unwrap();

    let path = mnt.file(STUCK);
    let refused = bounded("stat of the panicking lookup", move || {
        std::fs::metadata(path)
    })
    .unwrap_err();
    assert_eq!(errno(&refused), libc_eio());
    let counters = session.counters();
    assert_eq!(counters.replaced_replies, 1, "{counters:?}");
    assert_eq!(
        counters.waited, 0,
        "it panicked before it waited: {counters:?}"
    );

    let hello = mnt.file("hello");
    let meta = bounded("stat after the panic", move || std::fs::metadata(hello)).unwrap();
    assert!(meta.is_file());

    mnt.unmount();
    wait_ended(thread.handle(), &session);
}

/// `EIO`, as the kernel reports it to the caller.
fn libc_eio() -> i32 {
    rustix::io::Errno::IO.raw_os_error()
}
