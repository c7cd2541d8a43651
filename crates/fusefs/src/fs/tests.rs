//! Unit tests of the core with in-process stand-ins for the workers.

use std::future::Future;

use lease_client::{Error, Refusal};

use lease_client::protocol::MAX_DATA_BYTES;

use super::*;

/// A worker whose root is open as handle 7 but reachable only through that handle, as a
/// file unlinked while open is; it records the handle each attribute request names.
#[derive(Default)]
struct ReachableOnlyByHandle {
    handles_sent: Mutex<Vec<Option<u64>>>,
}

impl FileService for ReachableOnlyByHandle {
    fn call(&self, op: Op) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let entry = |file| v1::Entry {
            file,
            attr: Some(v1::Attr::default()),
        };
        let result = match op {
            Op::Open(_) => Ok(ReplyResult::Open(v1::OpenReply {
                handle: 7,
                handle_lease_ms: 0,
            })),
            Op::Getattr(r) => self.by_handle(r.handle, ReplyResult::Getattr(entry(r.file))),
            Op::Setattr(r) => self.by_handle(r.handle, ReplyResult::Setattr(entry(r.file))),
            _ => Err(Error::Refused {
                volume_id: "v".into(),
                op: "other",
                refusal: Refusal::InvalidRequest,
            }),
        };
        std::future::ready(result)
    }
}

impl ReachableOnlyByHandle {
    fn by_handle(&self, handle: Option<u64>, ok: ReplyResult) -> Result<ReplyResult, Error> {
        lock(&self.handles_sent).push(handle);
        match handle {
            Some(7) => Ok(ok),
            _ => Err(Error::Refused {
                volume_id: "v".into(),
                op: "attr",
                refusal: Refusal::Errno(libc::ESTALE),
            }),
        }
    }
}

fn caller() -> Caller {
    Caller {
        unique: 1,
        uid: 0,
        gid: 0,
    }
}

/// A worker whose file ends at `end` and whose reads and writes at offset `fails_at` fail
/// with `EIO`; it records the offset of every read and write.
struct PartFails {
    end: u64,
    fails_at: u64,
    offsets: Mutex<Vec<u64>>,
}

impl PartFails {
    fn new(end: u64, fails_at: u64) -> Self {
        PartFails {
            end,
            fails_at,
            offsets: Mutex::new(Vec::new()),
        }
    }

    fn sent(&self) -> Vec<u64> {
        let mut offsets = lock(&self.offsets).clone();
        offsets.sort_unstable();
        offsets
    }
}

impl FileService for PartFails {
    fn call(&self, op: Op) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let offset = match &op {
            Op::Read(r) => r.offset,
            Op::Write(r) => r.offset,
            _ => u64::MAX,
        };
        lock(&self.offsets).push(offset);
        let result = match op {
            _ if offset == self.fails_at => Err(Error::Refused {
                volume_id: "v".into(),
                op: "io",
                refusal: Refusal::Errno(libc::EIO),
            }),
            Op::Read(r) => {
                let len = self.end.saturating_sub(r.offset).min(u64::from(r.size));
                let fill = (r.offset >> 17) as u8;
                Ok(ReplyResult::Read(v1::ReadReply {
                    data: Bytes::from(vec![fill; len as usize]),
                }))
            }
            Op::Write(r) => Ok(ReplyResult::Write(v1::WriteReply {
                written: r.data.len() as u32,
            })),
            _ => Err(Error::Refused {
                volume_id: "v".into(),
                op: "other",
                refusal: Refusal::InvalidRequest,
            }),
        };
        std::future::ready(result)
    }
}

const PART: usize = 128 << 10;

fn parts_of(config_part: usize, end: u64, fails_at: u64) -> Fs<PartFails> {
    let config = FsConfig {
        call_data_bytes: config_part,
        ..FsConfig::default()
    };
    Fs::new(PartFails::new(end, fails_at), config)
}

#[tokio::test]
async fn a_failed_part_ends_the_count_of_a_write_and_fails_it_only_when_first() {
    let data = vec![1u8; 8 * PART];
    let up_to = |n: usize| (0..n).map(|i| (i * PART) as u64).collect::<Vec<_>>();

    // The parts start in order, and each answers at once: once the fourth has failed, no
    // later part starts.
    let fs = parts_of(PART, 0, 3 * PART as u64);
    let reply = fs
        .write(caller(), ROOT_NODE, 1, 0, &data, WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(reply as usize, 3 * PART, "the parts before the failed one");
    assert_eq!(
        fs.service().sent(),
        up_to(4),
        "nothing after the failed part"
    );

    let fs = parts_of(PART, 0, 0);
    let failed = fs
        .write(caller(), ROOT_NODE, 1, 0, &data, WriteFlags::default())
        .await;
    assert_eq!(failed.unwrap_err().errno().raw(), libc::EIO);
    assert_eq!(fs.service().sent(), up_to(1));

    let fs = parts_of(PART, 0, u64::MAX);
    let reply = fs
        .write(caller(), ROOT_NODE, 1, 0, &data, WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(reply as usize, data.len());
    assert_eq!(fs.service().sent(), up_to(8));

    // A part size of zero is clamped (to 4 KiB), not a panic.
    let fs = parts_of(0, 0, u64::MAX);
    let reply = fs
        .write(
            caller(),
            ROOT_NODE,
            1,
            0,
            &data[..PART],
            WriteFlags::default(),
        )
        .await;
    assert_eq!(reply.unwrap() as usize, PART);
    assert_eq!(fs.service().sent().len(), PART / (4 << 10));
}

/// A worker that answers reads and writes after yielding, later offsets after fewer
/// yields (so they finish first), and records the offsets in the order the calls start
/// and how many were in flight at most. Anything else is an open, answered with handle 9.
#[derive(Default)]
struct InFlight {
    now: Mutex<usize>,
    most: Mutex<usize>,
    started: Mutex<Vec<u64>>,
}

impl FileService for InFlight {
    fn call(&self, op: Op) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let (offset, result) = match op {
            Op::Write(r) => (
                r.offset,
                ReplyResult::Write(v1::WriteReply {
                    written: r.data.len() as u32,
                }),
            ),
            Op::Read(r) => {
                let fill = (r.offset >> 17) as u8;
                let data = Bytes::from(vec![fill; r.size as usize]);
                (r.offset, ReplyResult::Read(v1::ReadReply { data }))
            }
            _ => (
                u64::MAX,
                ReplyResult::Open(v1::OpenReply {
                    handle: 9,
                    handle_lease_ms: 0,
                }),
            ),
        };
        lock(&self.started).push(offset);
        {
            let mut now = lock(&self.now);
            *now += 1;
            let mut most = lock(&self.most);
            *most = (*most).max(*now);
        }
        let yields = 16u64.saturating_sub(offset / PART as u64);
        async move {
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            *lock(&self.now) -= 1;
            Ok(result)
        }
    }
}

fn in_flight() -> Fs<InFlight> {
    let config = FsConfig {
        call_data_bytes: PART,
        ..FsConfig::default()
    };
    Fs::new(InFlight::default(), config)
}

fn started(fs: &Fs<InFlight>) -> Vec<u64> {
    lock(&fs.service().started).clone()
}

#[tokio::test]
async fn an_appending_write_goes_out_as_whole_calls_one_after_another() {
    let data = vec![1u8; 2 * MAX_DATA_BYTES + 1];
    let whole = MAX_DATA_BYTES as u64;

    let fs = in_flight();
    let reply = fs.write(
        caller(),
        ROOT_NODE,
        1,
        0,
        &data[..MAX_DATA_BYTES],
        WriteFlags::default(),
    );
    assert_eq!(reply.await.unwrap() as usize, MAX_DATA_BYTES);
    assert_eq!(
        *lock(&fs.service().most),
        PARALLEL_CALLS,
        "parts in parallel"
    );
    assert_eq!(
        started(&fs),
        (0..8).map(|i| (i * PART) as u64).collect::<Vec<_>>()
    );

    // O_APPEND on the write: one call per MiB, one at a time, in order.
    let fs = in_flight();
    let append = libc::O_APPEND as u32;
    let appending = WriteFlags::from_request(append, 0);
    let reply = fs.write(caller(), ROOT_NODE, 1, 0, &data, appending).await;
    assert_eq!(reply.unwrap() as usize, data.len());
    assert_eq!(*lock(&fs.service().most), 1);
    assert_eq!(started(&fs), [0, whole, 2 * whole]);

    // O_APPEND only at open (after F_SETFL the kernel's writes may not say it).
    let fs = in_flight();
    let open = fs.open(caller(), ROOT_NODE, libc::O_WRONLY as u32 | append);
    let fh = open.await.unwrap().handle;
    let reply = fs.write(
        caller(),
        ROOT_NODE,
        fh,
        0,
        &data[..MAX_DATA_BYTES],
        WriteFlags::default(),
    );
    assert_eq!(reply.await.unwrap() as usize, MAX_DATA_BYTES);
    assert_eq!(started(&fs), [u64::MAX, 0], "the open, then one call");
}

/// A worker that records each call's operation and the caller it names, and answers
/// writes in full and opens with handle 3.
#[derive(Default)]
struct Recorded {
    calls: Mutex<Vec<(&'static str, Option<v1::Caller>)>>,
}

impl FileService for Recorded {
    fn call(&self, op: Op) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let written = v1::WriteReply {
            written: op.data_len() as u32,
        };
        let opened = v1::OpenReply {
            handle: 3,
            handle_lease_ms: 0,
        };
        let (caller, result) = match &op {
            Op::Write(_) => (None, ReplyResult::Write(written)),
            Op::WriteKillSuidgid(r) => (r.caller, ReplyResult::WriteKillSuidgid(written)),
            Op::Open(_) => (None, ReplyResult::Open(opened)),
            Op::OpenKillSuidgid(r) => (r.caller, ReplyResult::OpenKillSuidgid(opened)),
            _ => (None, ReplyResult::Flush(v1::Empty {})),
        };
        lock(&self.calls).push((op.name(), caller));
        std::future::ready(Ok(result))
    }
}

#[tokio::test]
async fn every_part_of_a_write_without_fsetid_asks_the_worker_to_drop_set_id_bits() {
    let user = Caller {
        unique: 5,
        uid: 1000,
        gid: 100,
    };
    let named = Some(v1::Caller {
        uid: 1000,
        gid: 100,
    });
    let config = FsConfig {
        call_data_bytes: PART,
        ..FsConfig::default()
    };
    let data = vec![7u8; MAX_DATA_BYTES];

    let fs = Fs::new(Recorded::default(), config);
    let killing = WriteFlags::from_request(0, FUSE_WRITE_KILL_SUIDGID);
    assert!(killing.kill_suidgid);
    let reply = fs.write(user, ROOT_NODE, 1, 0, &data, killing).await;
    assert_eq!(reply.unwrap() as usize, data.len());
    let calls = lock(&fs.service().calls).clone();
    assert_eq!(calls, vec![("write_kill_suidgid", named); 8], "each part");

    // Another write flag (FUSE_WRITE_LOCKOWNER) asks for nothing.
    let fs = Fs::new(Recorded::default(), config);
    let plain = WriteFlags::from_request(0, 1 << 1);
    fs.write(user, ROOT_NODE, 1, 0, &data, plain).await.unwrap();
    assert_eq!(lock(&fs.service().calls).clone(), vec![("write", None); 8]);

    // An open that truncates names its caller; one that does not is a plain open.
    let fs = Fs::new(Recorded::default(), config);
    let trunc = (libc::O_WRONLY | libc::O_TRUNC) as u32;
    assert_eq!(fs.open(user, ROOT_NODE, trunc).await.unwrap().handle, 3);
    assert_eq!(
        fs.open(user, ROOT_NODE, libc::O_WRONLY as u32)
            .await
            .unwrap()
            .handle,
        3
    );
    assert_eq!(
        lock(&fs.service().calls).clone(),
        [("open_kill_suidgid", named), ("open", None)]
    );
}

#[tokio::test]
async fn a_reply_that_does_not_fit_is_an_error_naming_its_operation() {
    // `Recorded` answers a lookup with a flush result.
    let fs = Fs::new(Recorded::default(), FsConfig::default());
    let error = fs
        .lookup(caller(), ROOT_NODE, OsStr::new("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, crate::Error::MalformedReply { op: "Lookup", .. }),
        "{error:?}"
    );
    assert_eq!(error.errno().raw(), libc::EIO);
    assert_eq!(error.class(), crate::ErrorClass::Protocol);
    // A node the kernel never received is stale, not a protocol failure.
    let error = fs.getattr(caller(), 77, None).await.unwrap_err();
    assert!(
        matches!(error, crate::Error::StaleNode { node: 77 }),
        "{error:?}"
    );
    assert_eq!(error.errno().raw(), libc::ESTALE);
}

#[tokio::test]
async fn a_read_or_write_interrupted_before_sending_fails_with_eintr_and_sends_nothing() {
    let fs = in_flight();
    let data = vec![1u8; MAX_DATA_BYTES];
    fs.interrupt(caller().unique);
    let write = fs
        .write(caller(), ROOT_NODE, 1, 0, &data, WriteFlags::default())
        .await;
    assert_eq!(write.unwrap_err().errno().raw(), libc::EINTR);
    fs.interrupt(caller().unique);
    let read = fs
        .read(caller(), ROOT_NODE, 1, 0, MAX_DATA_BYTES as u32)
        .await;
    assert_eq!(read.unwrap_err().errno().raw(), libc::EINTR);
    assert!(started(&fs).is_empty());

    // An interrupt of another request changes nothing.
    fs.interrupt(caller().unique + 1);
    let write = fs
        .write(caller(), ROOT_NODE, 1, 0, &data, WriteFlags::default())
        .await;
    assert_eq!(write.unwrap() as usize, data.len());
}

#[tokio::test]
async fn a_read_is_reassembled_in_order_when_later_parts_finish_first() {
    let fs = in_flight();
    let read = fs
        .read(caller(), ROOT_NODE, 1, 0, MAX_DATA_BYTES as u32)
        .await;
    let expected: Vec<u8> = (0..8u8).flat_map(|i| vec![i; PART]).collect();
    assert!(read.unwrap()[..] == expected[..]);
    assert_eq!(*lock(&fs.service().most), PARALLEL_CALLS);
}

#[tokio::test]
async fn a_read_is_reassembled_in_order_ends_at_a_short_part_and_fails_on_a_failed_one() {
    let size = 8 * PART as u32;
    let fs = parts_of(PART, u64::MAX, u64::MAX);
    let read = fs.read(caller(), ROOT_NODE, 1, 0, size).await.unwrap();
    let expected: Vec<u8> = (0..8u8).flat_map(|i| vec![i; PART]).collect();
    assert!(read[..] == expected[..], "in order");

    // The end of the file inside the second part: what comes later does not matter.
    let end = (PART + PART / 2) as u64;
    let fs = parts_of(PART, end, 5 * PART as u64);
    let read = fs.read(caller(), ROOT_NODE, 1, 0, size).await.unwrap();
    assert_eq!(read.len() as u64, end);

    // A failed part before the end fails the whole read.
    let fs = parts_of(PART, u64::MAX, 5 * PART as u64);
    let failed = fs.read(caller(), ROOT_NODE, 1, 0, size).await;
    assert_eq!(failed.unwrap_err().errno().raw(), libc::EIO);

    // Parts of 1 MiB: one call for the whole read.
    let fs = parts_of(MAX_DATA_BYTES, u64::MAX, u64::MAX);
    let read = fs.read(caller(), ROOT_NODE, 1, 0, size).await.unwrap();
    assert_eq!(read.len(), size as usize);
    assert_eq!(fs.service().sent(), [0]);
}

#[tokio::test]
async fn fstat_and_fchmod_of_a_file_unlinked_while_open_go_through_its_handle() {
    let fs = Fs::new(ReachableOnlyByHandle::default(), FsConfig::default());
    assert_eq!(
        fs.getattr(caller(), ROOT_NODE, None)
            .await
            .unwrap_err()
            .errno()
            .raw(),
        libc::ESTALE,
        "without an open handle the file is gone"
    );
    fs.open(caller(), ROOT_NODE, libc::O_RDWR as u32)
        .await
        .unwrap();
    fs.getattr(caller(), ROOT_NODE, None).await.unwrap();
    let chmod = SetAttrs {
        mode: Some(0o600),
        ..SetAttrs::default()
    };
    fs.setattr(caller(), ROOT_NODE, None, chmod).await.unwrap();
    assert_eq!(
        *lock(&fs.service().handles_sent),
        [None, None, Some(7), None, Some(7)],
        "each request goes by inode first, then once more through the open handle"
    );
}

/// A worker with a root directory of three files (inodes 10, 11, 12) for READDIRPLUS.
struct ThreeFiles;

impl FileService for ThreeFiles {
    fn call(&self, op: Op) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let attr = |mode| {
            Some(v1::Attr {
                mode,
                nlink: 1,
                ..v1::Attr::default()
            })
        };
        let result = match op {
            Op::Getattr(r) => ReplyResult::Getattr(v1::Entry {
                file: r.file,
                attr: attr(0o040_755),
            }),
            _ => ReplyResult::Readdir(v1::ReaddirReply {
                entries: (10u64..13)
                    .map(|ino| v1::DirEntry {
                        file: Some(v1::FileId {
                            ino,
                            inode_generation: 1,
                        }),
                        name: format!("f{ino}").into_bytes(),
                        file_type: 0o100_000,
                        next_offset: ino,
                        attr: attr(0o100_644),
                    })
                    .collect(),
                end: true,
            }),
        };
        std::future::ready(Ok(result))
    }
}

#[tokio::test]
async fn a_readdirplus_entry_counts_as_a_lookup_only_once_the_next_one_is_pulled() {
    let listed = |taken: usize| async move {
        let fs = Fs::new(ThreeFiles, FsConfig::default());
        let listing = fs.readdirplus(caller(), ROOT_NODE, 0).await.unwrap();
        let names: Vec<_> = listing
            .take(taken)
            .map(|e| e.dirent.name.into_string().unwrap())
            .collect();
        (names.len(), fs.node_count())
    };
    // `.`, `..` and three files; the root is always held.
    assert_eq!(
        listed(5).await,
        (5, 1 + 2),
        "the last pulled is not known taken"
    );
    assert_eq!(listed(3).await, (3, 1), "`.` and `..` are not lookups");
    assert_eq!(listed(4).await, (4, 1 + 1));
    let fs = Fs::new(ThreeFiles, FsConfig::default());
    let all: Vec<_> = fs
        .readdirplus(caller(), ROOT_NODE, 0)
        .await
        .unwrap()
        .collect();
    assert_eq!(all.len(), 5);
    assert_eq!(
        fs.node_count(),
        1 + 3,
        "the end of the listing counts the last one"
    );
}

/// A worker that answers every call as a plain write of everything it was sent.
struct PlainWrites;

impl FileService for PlainWrites {
    fn call(&self, op: Op) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let written = op.data_len() as u32;
        std::future::ready(Ok(ReplyResult::Write(v1::WriteReply { written })))
    }
}

#[tokio::test]
async fn a_write_that_must_drop_set_id_bits_refuses_a_plain_write_reply() {
    let fs = Fs::new(PlainWrites, FsConfig::default());
    let killing = WriteFlags::from_request(0, FUSE_WRITE_KILL_SUIDGID);
    let error = fs
        .write(caller(), ROOT_NODE, 1, 0, b"data", killing)
        .await
        .unwrap_err();
    assert!(
        matches!(error, crate::Error::MalformedReply { op: "write", .. }),
        "{error:?}"
    );
    let plain = fs.write(caller(), ROOT_NODE, 1, 0, b"data", WriteFlags::default());
    assert_eq!(plain.await.unwrap(), 4);
}
