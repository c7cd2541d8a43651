//! INTERRUPT: a caller that gets a signal while its request is being handled makes the kernel
//! send INTERRUPT; the session signals the request's context, and the handler's `EINTR`
//! releases the caller.

use std::time::Instant;

use fuse_session::Session;
use rustix::process::{Pid, Signal};
use tokio::sync::mpsc;

use crate::memfs::{MemFs, STUCK, Stuck};
use crate::support::{ChildProcess, MountPoint, PROMPT, bounded, options, runtime};

const CALLER_PATH: &str = "FUSE_SESSION_TEST_CALLER_PATH";

/// Not a test on its own: a process that stats `$FUSE_SESSION_TEST_CALLER_PATH` and exits.
#[test]
#[ignore = "the caller process of an_interrupted_request_reaches_its_handler"]
fn caller_process() {
    if let Some(path) = std::env::var_os(CALLER_PATH) {
        let _ = std::fs::metadata(path);
    }
}

#[test]
fn an_interrupted_request_reaches_its_handler() {
    if !test_support::private_mount_namespace_with_fuse(
        "an_interrupted_request_reaches_its_handler",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let handler = MemFs::new().stuck(Stuck::UntilInterrupted, entered_tx);
    let session = rt
        .block_on(Session::mount(&mnt.path, &options(), handler))
        .unwrap();

    let stuck = mnt.file(STUCK);
    let mut caller = ChildProcess::spawn(
        "interrupt::caller_process",
        &[(CALLER_PATH, stuck.as_os_str())],
    );
    rt.block_on(async { tokio::time::timeout(PROMPT, entered.recv()).await })
        .expect("the caller's LOOKUP reaches the handler")
        .unwrap();

    rustix::process::kill_process(Pid::from_raw(caller.id() as i32).unwrap(), Signal::TERM)
        .unwrap();
    let begun = Instant::now();
    let status = bounded("the interrupted caller's exit", move || caller.wait());
    let took = begun.elapsed();
    assert!(!status.success(), "killed by SIGTERM: {status:?}");
    assert_eq!(session.counters().interrupts, 1);
    eprintln!(
        "observed: SIGTERM to a caller whose LOOKUP was being handled made the kernel send \
         INTERRUPT; the handler answered EINTR and the caller exited after {took:?}"
    );

    let hello = mnt.file("hello");
    bounded("stat after the interrupt", move || std::fs::metadata(hello)).unwrap();
    mnt.unmount();
    crate::support::wait_ended(rt.handle(), &session);
}
