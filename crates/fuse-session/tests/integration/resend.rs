//! What happens to a request that was read but never answered when its reader goes and a copy
//! of the descriptor survives: it waits, a successor does not see it, and
//! `FUSE_NOTIFY_RESEND` delivers it again with the resend bit, after which the kernel
//! refuses a late reply to the first reading.

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use fuse_session::notify_resend;
use fuse_wire::{InitRecord, Unique};

use crate::handoff::{Owner, start_owner};
use crate::memfs::{MemFs, STUCK, Stuck};
use crate::support::{
    MountPoint, PROMPT, STILL_WAITING, adopt, bounded, mount_stuck, options, runtime, started,
    wait_ended,
};

#[test]
fn a_request_read_by_a_killed_owner_is_resent_to_the_adopter() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_request_read_by_a_killed_owner_is_resent_to_the_adopter",
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

    let path = mnt.file(STUCK);
    let stuck = started(move || std::fs::metadata(path));
    let report = rt
        .block_on(async { tokio::time::timeout(PROMPT, channel.recv()).await })
        .expect("the owner reports the request it holds")
        .unwrap()
        .unwrap();
    let held = Unique(u64::from_le_bytes(report.payload.try_into().unwrap()));
    assert!(!held.is_resend());

    process.kill();
    assert!(
        stuck.recv_timeout(STILL_WAITING).is_err(),
        "the caller still waits after its reader died: the copy keeps the request"
    );

    let record = InitRecord::decode(&record).unwrap();
    assert!(record.has_resend(), "this kernel offers FUSE_HAS_RESEND");
    notify_resend(fd.as_fd(), &record).unwrap();
    let handler = MemFs::new();
    let log = handler.log();
    let session = adopt(&rt, fd, record, handler);

    let meta = stuck
        .recv_timeout(PROMPT)
        .expect("the resent request is answered")
        .unwrap();
    assert_eq!(meta.ino(), 4);
    let lookups = log.lookups_of(STUCK);
    assert_eq!(lookups.len(), 1, "{lookups:?}");
    assert!(
        lookups[0].is_resend(),
        "bit 63 is set: {:#x}",
        lookups[0].raw()
    );
    assert_eq!(lookups[0].id(), held.id());
    eprintln!(
        "observed: LOOKUP {:#x} read by the killed owner was resent as {:#x} (bit 63 set, \
         same id) after FUSE_NOTIFY_RESEND on the surviving copy; the caller's stat completed",
        held.raw(),
        lookups[0].raw()
    );

    mnt.unmount();
    wait_ended(rt.handle(), &session);
}

#[test]
fn a_request_abandoned_by_a_dropped_session_waits_for_a_resend() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_request_abandoned_by_a_dropped_session_waits_for_a_resend",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let (session, mut entered) = mount_stuck(&rt, &mnt);
    let copy = session.descriptor().try_clone_to_owned().unwrap();
    let record = session.record().clone();

    let path = mnt.file(STUCK);
    let stuck = started(move || std::fs::metadata(path));
    let held = rt
        .block_on(async { tokio::time::timeout(PROMPT, entered.recv()).await })
        .unwrap()
        .unwrap();
    // Its task is stopped without a reply; the copy keeps the connection.
    drop(session);

    // A successor that asks for no resend never sees the abandoned request.
    let second = MemFs::new();
    let second_log = second.log();
    let session = adopt(&rt, copy, record, second);
    let hello = mnt.file("hello");
    bounded("stat through the successor", move || {
        std::fs::metadata(hello)
    })
    .unwrap();
    assert!(stuck.recv_timeout(STILL_WAITING).is_err(), "still waiting");
    assert!(second_log.lookups_of(STUCK).is_empty());

    // Paused, RESEND, adopted again: now it comes, with the resend bit, and is answered.
    let paused = rt.block_on(session.pause(PROMPT)).unwrap();
    notify_resend(paused.fd.as_fd(), &paused.record).unwrap();
    let third = MemFs::new();
    let third_log = third.log();
    let session = adopt(&rt, paused.fd, paused.record, third);
    let meta = stuck
        .recv_timeout(PROMPT)
        .expect("answered after the resend")
        .unwrap();
    assert_eq!(meta.ino(), 4);
    let lookups = third_log.lookups_of(STUCK);
    assert_eq!(lookups.len(), 1, "{lookups:?}");
    assert!(lookups[0].is_resend());
    assert_eq!(lookups[0].id(), held.id());
    eprintln!(
        "observed: LOOKUP {:#x} abandoned by a dropped session was not seen by a successor \
         that sent no RESEND; after RESEND it came again as {:#x}",
        held.raw(),
        lookups[0].raw()
    );

    mnt.unmount();
    wait_ended(rt.handle(), &session);
}

#[test]
fn a_reply_to_a_request_resent_meanwhile_is_reported_undelivered() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_reply_to_a_request_resent_meanwhile_is_reported_undelivered",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let handler = MemFs::new().stuck(Stuck::UntilOpened(gate_rx), entered_tx);
    let log = handler.log();
    let session = rt
        .block_on(fuse_session::Session::mount(&mnt.path, &options(), handler))
        .unwrap();
    let mut next_entered = || {
        rt.block_on(async { tokio::time::timeout(PROMPT, entered.recv()).await })
            .expect("the handler holds the request")
            .unwrap()
    };

    let path = mnt.file(STUCK);
    let stuck = started(move || std::fs::metadata(path));
    let first = next_entered();
    // While the first reading of the request is held, the kernel is asked to send it again:
    // the same session reads it a second time, under the resend bit.
    notify_resend(session.descriptor(), session.record()).unwrap();
    let second = next_entered();
    assert!(!first.is_resend() && second.is_resend());
    assert_eq!(first.id(), second.id());

    gate.send_replace(true);
    assert_eq!(stuck.recv_timeout(PROMPT).unwrap().unwrap().ino(), 4);
    let lookups: Vec<(Unique, bool)> = log
        .replied()
        .into_iter()
        .filter(|r| r.0 == fuse_wire::Opcode::LOOKUP && r.1.id() == first.id())
        .map(|r| (r.1, r.2))
        .collect();
    assert_eq!(lookups.len(), 2, "{lookups:?}");
    assert!(
        lookups.contains(&(first, false)) && lookups.contains(&(second, true)),
        "the kernel refuses the reply to the request it sent again: {lookups:?}"
    );

    mnt.unmount();
    wait_ended(rt.handle(), &session);
}
