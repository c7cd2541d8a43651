//! Pausing: a drained pause hands the connection to a new session in the same process while
//! an application keeps reading; a pause that cannot drain serves again.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fuse_session::{Error, Session};
use fuse_wire::Opcode;
use tokio::sync::{mpsc, watch};

use crate::memfs::{MemFs, STUCK, Stuck, data_byte};
use crate::support::{
    MountPoint, PROMPT, STILL_WAITING, adopt, bounded, options, runtime, started, wait_ended,
    wait_until,
};

#[test]
fn a_paused_session_is_adopted_in_one_process_while_a_reader_reads_on() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_paused_session_is_adopted_in_one_process_while_a_reader_reads_on",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let first = MemFs::new();
    let second = first.sharing();
    let (first_log, second_log) = (first.log(), second.log());
    let session = rt
        .block_on(Session::mount(&mnt.path, &options(), first))
        .unwrap();

    // A reader that reads 4 KiB blocks of `data` in a loop, each read a READ request (direct
    // I/O), and checks every byte.
    let reads = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (reads, stop, path) = (Arc::clone(&reads), Arc::clone(&stop), mnt.file("data"));
        std::thread::spawn(move || -> std::io::Result<()> {
            let file = File::open(path)?;
            let mut buf = vec![0u8; 4096];
            let mut block = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let offset = (block % 16) * 4096;
                file.read_exact_at(&mut buf, offset as u64)?;
                if !buf
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| b == data_byte(offset + i))
                {
                    return Err(std::io::Error::other(format!("wrong bytes at {offset}")));
                }
                reads.fetch_add(1, Ordering::Relaxed);
                block += 1;
            }
            Ok(())
        })
    };
    let count = || reads.load(Ordering::Relaxed);
    wait_until("50 reads through the first session", || count() >= 50);

    let paused = rt.block_on(session.pause(PROMPT)).unwrap();
    let at_pause = count();
    std::thread::sleep(STILL_WAITING);
    let while_paused = count();
    // A read answered just before the pause may be counted just after it.
    assert!(
        while_paused <= at_pause + 1,
        "nothing is served while paused: {at_pause} then {while_paused}"
    );

    let session = adopt(&rt, paused.fd, paused.record, second);
    wait_until("50 more reads through the adopting session", || {
        count() >= while_paused + 50
    });
    stop.store(true, Ordering::Relaxed);
    bounded("the reader's end", move || reader.join())
        .unwrap()
        .expect("the reader saw no error across the hand-over");

    assert!(first_log.count(Opcode::READ) >= 50);
    assert!(second_log.count(Opcode::READ) >= 50);
    assert_eq!(session.counters().unexpected_inits, 0, "no second INIT");
    assert_eq!(second_log.count(Opcode::INIT), 0);
    eprintln!(
        "observed: {at_pause} reads before the pause, {} after the adoption; the reader \
         waited in the kernel's queue meanwhile; no INIT reached the adopting session",
        count() - while_paused
    );

    mnt.unmount();
    wait_ended(rt.handle(), &session);
}

#[test]
fn a_pause_past_its_deadline_serves_again_and_nothing_hangs() {
    if !test_support::private_mount_namespace_with_fuse(
        "a_pause_past_its_deadline_serves_again_and_nothing_hangs",
    ) {
        return;
    }
    let mnt = MountPoint::new();
    let rt = runtime();
    let (gate, gate_rx) = watch::channel(false);
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let handler = MemFs::new().stuck(Stuck::UntilOpened(gate_rx), entered_tx);
    let session = rt
        .block_on(Session::mount(&mnt.path, &options(), handler))
        .unwrap();

    let path = mnt.file(STUCK);
    let stuck = started(move || std::fs::metadata(path));
    rt.block_on(async { tokio::time::timeout(PROMPT, entered.recv()).await })
        .unwrap()
        .unwrap();

    let deadline = Duration::from_millis(300);
    let begun = Instant::now();
    let refused = rt.block_on(session.pause(deadline)).unwrap_err();
    let took = begun.elapsed();
    assert!(took >= deadline && took < PROMPT, "{took:?}");
    assert!(
        matches!(refused.error, Error::PauseDeadline { in_flight: 1, .. }),
        "{:?}",
        refused.error
    );
    let session = refused.session;

    // It reads again: other calls are answered while the stuck one still waits.
    let hello = mnt.file("hello");
    bounded("stat after the failed pause", move || {
        std::fs::metadata(hello)
    })
    .unwrap();
    assert!(stuck.try_recv().is_err(), "the stuck call still waits");

    gate.send_replace(true);
    let meta = stuck.recv_timeout(PROMPT).unwrap().unwrap();
    assert_eq!(meta.ino(), 4);

    // Nothing in flight now: the pause drains at once.
    let paused = rt.block_on(session.pause(PROMPT)).unwrap();
    let session = adopt(&rt, paused.fd, paused.record, MemFs::new());
    let hello = mnt.file("hello");
    bounded("stat after the adoption", move || std::fs::metadata(hello)).unwrap();
    eprintln!("observed: a pause with a stuck request returned after {took:?} and served again");

    mnt.unmount();
    wait_ended(rt.handle(), &session);
}
