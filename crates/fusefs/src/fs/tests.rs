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
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
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
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
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
    Fs::new(PartFails::new(end, fails_at), config).unwrap()
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
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
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
    Fs::new(InFlight::default(), config).unwrap()
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
struct CallerLog {
    calls: Mutex<Vec<(&'static str, Option<v1::Caller>)>>,
}

impl FileService for CallerLog {
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
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

    let fs = Fs::new(CallerLog::default(), config).unwrap();
    let killing = WriteFlags::from_request(0, FUSE_WRITE_KILL_SUIDGID);
    assert!(killing.kill_suidgid);
    let reply = fs.write(user, ROOT_NODE, 1, 0, &data, killing).await;
    assert_eq!(reply.unwrap() as usize, data.len());
    let calls = lock(&fs.service().calls).clone();
    assert_eq!(calls, vec![("write_kill_suidgid", named); 8], "each part");

    // Another write flag (FUSE_WRITE_LOCKOWNER) asks for nothing.
    let fs = Fs::new(CallerLog::default(), config).unwrap();
    let plain = WriteFlags::from_request(0, 1 << 1);
    fs.write(user, ROOT_NODE, 1, 0, &data, plain).await.unwrap();
    assert_eq!(lock(&fs.service().calls).clone(), vec![("write", None); 8]);

    // An open that truncates names its caller; one that does not is a plain open.
    let fs = Fs::new(CallerLog::default(), config).unwrap();
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
    // `CallerLog` answers a lookup with a flush result.
    let fs = Fs::new(CallerLog::default(), FsConfig::default()).unwrap();
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
    let fs = Fs::new(ReachableOnlyByHandle::default(), FsConfig::default()).unwrap();
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
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
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
        let fs = Fs::new(ThreeFiles, FsConfig::default()).unwrap();
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
    let fs = Fs::new(ThreeFiles, FsConfig::default()).unwrap();
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
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let written = op.data_len() as u32;
        std::future::ready(Ok(ReplyResult::Write(v1::WriteReply { written })))
    }
}

#[tokio::test]
async fn a_write_that_must_drop_set_id_bits_refuses_a_plain_write_reply() {
    let fs = Fs::new(PlainWrites, FsConfig::default()).unwrap();
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

/// A worker that logs every call as (request ID, operation) and answers it in full: reads
/// with zeros, writes whole, opens with handle 3, attribute requests with an entry.
#[derive(Default)]
struct Logged {
    calls: Mutex<Vec<(Option<RequestId>, Op)>>,
}

impl Logged {
    /// The calls logged since the last take, ordered by request ID (parts run in parallel).
    fn take(&self) -> Vec<(Option<RequestId>, Op)> {
        let mut calls = std::mem::take(&mut *lock(&self.calls));
        calls.sort_by_key(|(id, _)| id.map(|id| id.0));
        calls
    }
}

impl FileService for Logged {
    fn call(
        &self,
        request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let entry = |file| v1::Entry {
            file,
            attr: Some(v1::Attr::default()),
        };
        let result = match &op {
            Op::Read(r) => ReplyResult::Read(v1::ReadReply {
                data: Bytes::from(vec![0; r.size as usize]),
            }),
            Op::Write(w) => ReplyResult::Write(v1::WriteReply {
                written: w.data.len() as u32,
            }),
            Op::Open(_) => ReplyResult::Open(v1::OpenReply {
                handle: 3,
                handle_lease_ms: 0,
            }),
            Op::Setattr(r) => ReplyResult::Setattr(entry(r.file)),
            Op::RenewHandles(_) => ReplyResult::RenewHandles(v1::RenewHandlesReply::default()),
            _ => ReplyResult::Flush(v1::Empty {}),
        };
        lock(&self.calls).push((request_id, op));
        std::future::ready(Ok(result))
    }
}

#[tokio::test]
async fn a_request_served_again_by_a_successor_makes_the_same_calls_under_the_same_ids() {
    let config = FsConfig {
        call_data_bytes: PART,
        ..FsConfig::default()
    };
    /// Serves a write, a read and a setattr as kernel requests `unique`, `unique + 2` and
    /// `unique + 4`; the calls they made.
    async fn serve(fs: &Fs<Logged>, unique: u64) -> Vec<(Option<RequestId>, Op)> {
        let request = |unique| Caller { unique, ..caller() };
        let data = vec![5u8; MAX_DATA_BYTES];
        fs.write(
            request(unique),
            ROOT_NODE,
            3,
            0,
            &data,
            WriteFlags::default(),
        )
        .await
        .unwrap();
        fs.read(request(unique + 2), ROOT_NODE, 3, 0, MAX_DATA_BYTES as u32)
            .await
            .unwrap();
        let times = SetAttrs {
            atime: Some(SetTime::Now),
            mtime: Some(SetTime::Now),
            ..SetAttrs::default()
        };
        fs.setattr(request(unique + 4), ROOT_NODE, None, times)
            .await
            .unwrap();
        fs.service().take()
    }
    let first = Fs::new(Logged::default(), config).unwrap();
    first.open(caller(), ROOT_NODE, 0).await.unwrap();
    first.service().take();
    let by_first = serve(&first, 40).await;

    // Eight parts of the write, eight of the read, one setattr: every ID derived from the
    // nonce, the kernel's request ID and the call's index, and all different.
    assert_eq!(by_first.len(), 17);
    let nonce = first.nonce();
    let mut expected: Vec<RequestId> = (0..8)
        .map(|i| nonce.request_id(40, i))
        .chain((0..8).map(|i| nonce.request_id(42, i)))
        .chain([nonce.request_id(44, 0)])
        .collect();
    expected.sort_by_key(|id| id.0);
    let ids: Vec<RequestId> = by_first.iter().map(|(id, _)| id.unwrap()).collect();
    assert_eq!(ids, expected);
    // UTIME_NOW goes as the worker's now, never as a time read here.
    assert!(by_first.iter().any(|(_, op)| matches!(
        op,
        Op::Setattr(v1::SetattrRequest {
            atime: Some(v1::SetTime {
                time: Some(set_time::Time::Now(_))
            }),
            mtime: Some(v1::SetTime {
                time: Some(set_time::Time::Now(_))
            }),
            ..
        })
    )));

    // A successor with the handed-over state, served the same requests as resends (bit 63):
    // the identical calls, byte for byte, under the identical IDs.
    let successor = Fs::with_state(Logged::default(), config, &first.state());
    let resent = 40 | fuse_wire::Unique::RESEND_BIT;
    assert_eq!(serve(&successor, resent).await, by_first);

    // A fresh connection has another nonce, so the same kernel IDs give other request IDs.
    let other = Fs::new(Logged::default(), config).unwrap();
    assert_ne!(other.nonce(), nonce);
}

#[tokio::test]
async fn a_resent_request_is_never_interrupted_and_renewals_get_random_ids() {
    let fs = Fs::new(Logged::default(), FsConfig::default()).unwrap();
    let first = Caller {
        unique: 8,
        ..caller()
    };
    fs.interrupt(8);
    let error = fs.flush(first, ROOT_NODE, 3, 0).await.unwrap_err();
    assert_eq!(error.errno().raw(), libc::EINTR);

    // Interrupted again, but resent: it was sent to the workers already, so it runs.
    fs.interrupt(8);
    let resent = Caller {
        unique: 8 | fuse_wire::Unique::RESEND_BIT,
        ..caller()
    };
    fs.flush(resent, ROOT_NODE, 3, 0).await.unwrap();
    let calls = fs.service().take();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, Some(fs.nonce().request_id(8, 0)));

    // A call made for no kernel request: no derived ID.
    fs.open(caller(), ROOT_NODE, 0).await.unwrap();
    fs.service().take();
    fs.renew_handles().await.unwrap();
    let calls = fs.service().take();
    assert!(
        matches!(calls[..], [(None, Op::RenewHandles(_))]),
        "{calls:?}"
    );
}

/// A worker with a few files: `a` (inode 10) to look up, `new` (inode 11, handle 5) to
/// create, opens on handle 6, and a directory listing of 10, 12 and 13.
#[derive(Default)]
struct FewFiles;

fn file_id(ino: u64) -> Option<v1::FileId> {
    Some(v1::FileId {
        ino,
        inode_generation: ino + 100,
    })
}

impl FileService for FewFiles {
    fn call(
        &self,
        _request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let entry = |ino| v1::Entry {
            file: file_id(ino),
            attr: Some(v1::Attr::default()),
        };
        let listed = |ino: u64| v1::DirEntry {
            file: file_id(ino),
            name: format!("f{ino}").into_bytes(),
            file_type: libc::DT_REG.into(),
            next_offset: ino,
            attr: Some(v1::Attr::default()),
        };
        let result = match op {
            Op::Lookup(_) => ReplyResult::Lookup(entry(10)),
            Op::Create(_) => ReplyResult::Create(v1::CreateReply {
                entry: Some(entry(11)),
                handle: 5,
                handle_lease_ms: 0,
            }),
            Op::Open(_) => ReplyResult::Open(v1::OpenReply {
                handle: 6,
                handle_lease_ms: 0,
            }),
            Op::Getattr(_) => ReplyResult::Getattr(entry(ROOT_INO)),
            Op::Readdir(_) => ReplyResult::Readdir(v1::ReaddirReply {
                entries: vec![listed(10), listed(12), listed(13)],
                end: true,
            }),
            _ => ReplyResult::Release(v1::Empty {}),
        };
        std::future::ready(Ok(result))
    }
}

/// A write-ahead that logs what it is told, `record` as `true` and `note` as `false`, and
/// holds every `record` until the test lets it go.
#[derive(Debug)]
struct Journal {
    told: Mutex<Vec<(bool, Vec<TableChange>)>>,
    gate: tokio::sync::Semaphore,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            told: Mutex::default(),
            gate: tokio::sync::Semaphore::new(0),
        }
    }
}

impl Journal {
    fn take(&self) -> Vec<(bool, Vec<TableChange>)> {
        std::mem::take(&mut *lock(&self.told))
    }
}

impl WriteAhead for Journal {
    fn record(&self, changes: Vec<TableChange>) -> Recorded<'_> {
        Box::pin(async move {
            lock(&self.told).push((true, changes));
            if let Ok(permit) = self.gate.acquire().await {
                permit.forget();
            }
        })
    }

    fn note(&self, changes: Vec<TableChange>) {
        lock(&self.told).push((false, changes));
    }
}

#[tokio::test]
async fn new_nodes_and_handles_are_written_ahead_before_the_reply_and_the_rest_after() {
    let fs = Arc::new(Fs::new(FewFiles, FsConfig::default()).unwrap());
    let journal = Arc::new(Journal::default());
    assert!(fs.write_ahead_to(journal.clone()));
    assert!(!fs.write_ahead_to(journal.clone()), "set once");
    let node = |ino: u64| TableChange::Node {
        node: ino,
        inode_generation: ino + 100,
    };
    let request = |unique| Caller { unique, ..caller() };

    // A lookup of a node the kernel does not hold: no reply until the write-ahead is safe.
    let lookup = tokio::spawn({
        let fs = Arc::clone(&fs);
        async move { fs.lookup(request(2), ROOT_NODE, OsStr::new("a")).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!lookup.is_finished(), "the reply waits for the write-ahead");
    assert_eq!(journal.take(), [(true, vec![node(10)])]);
    journal.gate.add_permits(1);
    lookup.await.unwrap().unwrap();

    // Held already: nothing to write ahead; the gate stays shut and nothing waits.
    fs.lookup(request(4), ROOT_NODE, OsStr::new("a"))
        .await
        .unwrap();
    assert_eq!(journal.take(), []);

    // CREATE hands over a node and a handle: one record naming the request.
    journal.gate.add_permits(3);
    let created = fs
        .create(request(6), ROOT_NODE, OsStr::new("new"), 0o100644, 2)
        .await
        .unwrap();
    let opened = |handle, ino, flags, unique| TableChange::Opened {
        handle: handle_state(handle, ino, flags, Some(unique)),
    };
    assert_eq!(created.opened.handle, 5);
    assert_eq!(
        journal.take(),
        [(true, vec![node(11), opened(5, 11, 2, 6)])]
    );
    // Undelivered until the kernel takes the reply; then noted delivered.
    let opened_by = |fs: &Fs<FewFiles>| fs.state().handles[0].opened_by;
    assert_eq!(opened_by(&fs), Some(6));
    fs.replied(6, true);
    assert_eq!(opened_by(&fs), None);
    assert_eq!(
        journal.take(),
        [(false, vec![TableChange::Delivered { handle: 5 }])]
    );
    // A reply the kernel refused leaves the handle undelivered (its request may come again).
    fs.open(request(8), 10, 0).await.unwrap();
    assert_eq!(journal.take(), [(true, vec![opened(6, 10, 0, 8)])]);
    fs.replied(8, false);
    fs.replied(100, true);
    assert_eq!(journal.take(), []);
    assert_eq!(fs.state().handles[1].opened_by, Some(8));
    fs.replied(8, true);
    assert_eq!(
        journal.take(),
        [(false, vec![TableChange::Delivered { handle: 6 }])]
    );

    // READDIRPLUS: the entries the kernel does not hold, before the reply.
    let listing = fs.readdirplus(request(10), ROOT_NODE, 0).await.unwrap();
    assert_eq!(journal.take(), [(true, vec![node(12), node(13)])]);
    assert_eq!(listing.count(), 5, ". .. and three entries");

    // RELEASE and the last FORGET of a node: noted, nothing waits.
    fs.release(request(12), 11, 5, 0).await.unwrap();
    assert_eq!(
        journal.take(),
        [(false, vec![TableChange::Released { handle: 5 }])]
    );
    // Node 10 has three lookups (two LOOKUPs and the listing).
    fs.forget(10, 2);
    assert_eq!(journal.take(), []);
    fs.forget(10, 1);
    assert_eq!(
        journal.take(),
        [(false, vec![TableChange::Forgotten { node: 10 }])]
    );
}

#[tokio::test]
async fn a_resent_mutation_past_the_deadline_is_eio_and_never_sent_but_a_read_is() {
    let config = FsConfig {
        call_data_bytes: PART,
        ..FsConfig::default()
    };
    let fs = Fs::new(Logged::default(), config).unwrap();
    let resent = |unique: u64| Caller {
        unique: unique | fuse_wire::Unique::RESEND_BIT,
        ..caller()
    };
    // Before the deadline a resent write goes out, part by part.
    assert!(fs.resend_until(Instant::now() + Duration::from_secs(60)));
    assert!(!fs.resend_until(Instant::now()), "set once");
    let data = vec![1u8; 2 * PART];
    fs.write(resent(10), ROOT_NODE, 3, 0, &data, WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(fs.service().take().len(), 2);

    // Past it: EIO, and nothing reaches the workers; a request that was not resent, and a
    // resent read, go out as ever.
    let fs = Fs::new(Logged::default(), config).unwrap();
    fs.resend_until(Instant::now());
    let late = fs
        .write(resent(12), ROOT_NODE, 3, 0, &data, WriteFlags::default())
        .await
        .unwrap_err();
    assert_eq!(late.errno().raw(), libc::EIO);
    assert!(matches!(late, crate::Error::ResendTooLate { op: "write" }));
    let late = fs.flush(resent(14), ROOT_NODE, 3, 0).await.unwrap_err();
    assert_eq!(late.errno().raw(), libc::EIO);
    assert_eq!(fs.service().take(), []);
    fs.flush(
        Caller {
            unique: 16,
            ..caller()
        },
        ROOT_NODE,
        3,
        0,
    )
    .await
    .unwrap();
    fs.read(resent(18), ROOT_NODE, 3, 0, PART as u32)
        .await
        .unwrap();
    assert_eq!(fs.service().take().len(), 2);
}

#[tokio::test]
async fn no_part_of_a_write_starts_later_than_one_call_budget_after_the_first() {
    let config = FsConfig {
        call_data_bytes: PART,
        call_budget: Duration::ZERO,
        ..FsConfig::default()
    };
    let fs = Fs::new(Logged::default(), config).unwrap();
    let data = vec![1u8; 4 * PART];
    let written = fs
        .write(caller(), ROOT_NODE, 3, 0, &data, WriteFlags::default())
        .await
        .unwrap();
    // With no time at all after the first part, the write ends short after it.
    assert_eq!(written as usize, PART);
    assert_eq!(fs.service().take().len(), 1);
}

fn handle_state(handle: u64, ino: u64, flags: u32, opened_by: Option<u64>) -> HandleState {
    HandleState {
        handle,
        file: FileId {
            ino,
            inode_generation: ino + 100,
        },
        flags,
        opened_by,
    }
}

/// A worker whose opens answer the handles the test lines up (`None`: the open fails), and
/// that records every handle released.
#[derive(Default)]
struct Reopening {
    opens: Mutex<VecDeque<Option<u64>>>,
    released: Mutex<Vec<(Option<RequestId>, u64)>>,
}

impl FileService for Reopening {
    fn call(
        &self,
        request_id: Option<RequestId>,
        _until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, Error>> + Send {
        let result = match op {
            Op::Open(_) => match lock(&self.opens).pop_front().flatten() {
                Some(handle) => Ok(ReplyResult::Open(v1::OpenReply {
                    handle,
                    handle_lease_ms: 0,
                })),
                None => Err(Error::Refused {
                    volume_id: "v".into(),
                    op: "open",
                    refusal: Refusal::Errno(libc::EIO),
                }),
            },
            Op::Release(r) => {
                lock(&self.released).push((request_id, r.handle));
                Ok(ReplyResult::Release(v1::Empty {}))
            }
            _ => Err(Error::Refused {
                volume_id: "v".into(),
                op: "other",
                refusal: Refusal::InvalidRequest,
            }),
        };
        std::future::ready(result)
    }
}

#[tokio::test]
async fn a_successor_settles_the_handles_whose_open_reply_was_never_delivered() {
    // A dead owner's tables: handles 20, 21 and 22 opened by requests 30, 32 and 34 whose
    // replies were not seen to reach the kernel; 23 delivered.
    let state = MountState {
        nonce: ConnectionNonce([9; 16]),
        nodes: vec![crate::NodeState {
            node: ROOT_NODE,
            inode_generation: FsConfig::default().root_generation,
            lookups: 1,
        }],
        handles: vec![
            handle_state(20, 10, 0, Some(30)),
            handle_state(21, 10, 0, Some(32)),
            handle_state(22, 10, 0, Some(34)),
            handle_state(23, 10, 0, None),
        ],
    };
    let fs = Fs::with_state(Reopening::default(), FsConfig::default(), &state);
    let journal = Arc::new(Journal::default());
    journal.gate.add_permits(10);
    fs.write_ahead_to(journal.clone());
    assert_eq!(fs.state(), state, "taken over as it was");
    let resent = |unique: u64| Caller {
        unique: unique | fuse_wire::Unique::RESEND_BIT,
        ..caller()
    };
    let handles = |fs: &Fs<Reopening>| -> Vec<(u64, Option<u64>)> {
        fs.state()
            .handles
            .iter()
            .map(|h| (h.handle, h.opened_by))
            .collect()
    };
    *lock(&fs.service().opens) = [Some(20), Some(24), None, None].into();

    // Request 30 again: the worker answers from its reply cache, the same handle. It is kept,
    // and delivered with this reply.
    let opened = fs.open(resent(30), ROOT_NODE, 0).await.unwrap();
    assert_eq!(opened.handle, 20);
    fs.replied(resent(30).unique, true);
    assert_eq!(
        journal.take(),
        [
            (
                true,
                vec![TableChange::Opened {
                    handle: HandleState {
                        file: FileId {
                            ino: ROOT_NODE,
                            inode_generation: FsConfig::default().root_generation,
                        },
                        ..handle_state(20, 0, 0, Some(30))
                    }
                }]
            ),
            (false, vec![TableChange::Delivered { handle: 20 }])
        ]
    );

    // Request 32 again, answered with another handle: nobody holds 21, so it is released.
    let opened = fs.open(resent(32), ROOT_NODE, 0).await.unwrap();
    assert_eq!(opened.handle, 24);
    // Request 34 again, and the open fails: 22 is released.
    fs.open(resent(34), ROOT_NODE, 0).await.unwrap_err();
    // A request that was not resent fails: nothing of the dead owner's is touched.
    fs.open(
        Caller {
            unique: 36,
            ..caller()
        },
        ROOT_NODE,
        0,
    )
    .await
    .unwrap_err();
    let released = lock(&fs.service().released).clone();
    assert_eq!(released.iter().map(|r| r.1).collect::<Vec<_>>(), [21, 22]);
    assert!(
        released.iter().all(|r| r.0.is_none()),
        "releases are made for no kernel request: the client draws random IDs"
    );
    let noted: Vec<TableChange> = journal
        .take()
        .into_iter()
        .filter(|(recorded, _)| !recorded)
        .flat_map(|(_, changes)| changes)
        .collect();
    assert_eq!(
        noted,
        [
            TableChange::Released { handle: 21 },
            TableChange::Released { handle: 22 }
        ]
    );
    // Left: 20 delivered, 23 as it came, 24 awaiting its reply.
    assert_eq!(handles(&fs), [(20, None), (23, None), (24, Some(32))]);
}

#[tokio::test]
async fn a_request_resent_again_keeps_the_deadline_of_the_crash_it_first_survived() {
    let fs = Fs::new(Logged::default(), FsConfig::default()).unwrap();
    let journal = Arc::new(Journal::default());
    fs.write_ahead_to(journal.clone());
    let now = Instant::now();
    let past = now - Duration::from_millis(1);
    let later = now + Duration::from_secs(60);
    let resent = |unique: u64| Caller {
        unique: unique | fuse_wire::Unique::RESEND_BIT,
        ..caller()
    };
    // Taken over after a second crash: requests below 100 were read before the first one
    // (their deadline has passed); the rest were read by the owner that died last.
    fs.inherit_resend_rules(&[ResendRule {
        below: 100,
        until: past,
    }]);
    assert!(fs.resend_until(later));
    assert!(!fs.resend_until(later), "set once");
    let late = fs.flush(resent(50), ROOT_NODE, 3, 0).await.unwrap_err();
    assert!(
        matches!(late, crate::Error::ResendTooLate { .. }),
        "{late:?}"
    );
    fs.flush(resent(150), ROOT_NODE, 3, 0).await.unwrap();
    fs.read(resent(52), ROOT_NODE, 3, 0, 10).await.unwrap();
    assert_eq!(fs.service().take().len(), 2, "reads are sent whenever");

    // The first request read first-hand bounds this owner's rule, and is noted once; a
    // FORGET does not count (the adapter does not report it), nor does a resend.
    fs.read_request(160 | fuse_wire::Unique::RESEND_BIT);
    fs.read_request(201);
    fs.read_request(204);
    assert_eq!(
        fs.resend_rules(),
        [
            ResendRule {
                below: 100,
                until: past
            },
            ResendRule {
                below: 200,
                until: later
            }
        ]
    );
    assert_eq!(
        journal.take(),
        [(false, vec![TableChange::FirstRead { unique: 200 }])]
    );
    assert!(
        !fs.resend_until(later),
        "still set once after the first request read first-hand"
    );
    assert_eq!(fs.resend_rules().len(), 2);

    // Rules pile up over many crashes: past the cap the oldest merge, keeping the earlier
    // deadline for the larger range.
    let many = Fs::new(Logged::default(), FsConfig::default()).unwrap();
    let rules: Vec<ResendRule> = (1..=MAX_RESEND_RULES as u64 + 2)
        .map(|n| ResendRule {
            below: n * 10,
            until: now + Duration::from_secs(n),
        })
        .collect();
    many.inherit_resend_rules(&rules);
    let kept = many.resend_rules();
    assert_eq!(kept.len(), MAX_RESEND_RULES);
    assert_eq!(
        kept[0],
        ResendRule {
            below: 30,
            until: now + Duration::from_secs(1)
        }
    );
    assert_eq!(kept.last(), rules.last());
}

/// An observer that keeps what it is told.
#[derive(Debug, Default)]
struct Seen(Mutex<Vec<ObservedCall>>);

impl CallObserver for Seen {
    fn observed(&self, call: &ObservedCall) {
        lock(&self.0).push(*call);
    }
}

#[tokio::test]
async fn an_observer_is_told_of_each_call_made_for_a_kernel_request() {
    let config = FsConfig {
        call_data_bytes: PART,
        ..FsConfig::default()
    };
    let fs = Fs::new(Logged::default(), config).unwrap();
    let seen = Arc::new(Seen::default());
    assert!(fs.observe_calls(seen.clone()));
    assert!(!fs.observe_calls(seen.clone()), "set once");
    let resent = Caller {
        unique: 20 | fuse_wire::Unique::RESEND_BIT,
        ..caller()
    };
    fs.write(
        resent,
        ROOT_NODE,
        3,
        0,
        &vec![1u8; 2 * PART],
        WriteFlags::default(),
    )
    .await
    .unwrap();
    fs.read(caller(), ROOT_NODE, 3, 0, 10).await.unwrap();
    fs.open(caller(), ROOT_NODE, 0).await.unwrap();
    fs.renew_handles().await.unwrap();

    let (sending, mut calls): (Vec<ObservedCall>, Vec<ObservedCall>) =
        lock(&seen.0).iter().partition(|c| c.succeeded.is_none());
    assert_eq!(sending.len(), calls.len(), "told before sending, and after");
    assert!(calls.iter().all(|c| c.succeeded == Some(true)));
    calls.sort_by_key(|c| (c.unique, c.index, c.op));
    let summary: Vec<(u64, bool, u32, &str, bool)> = calls
        .iter()
        .map(|c| (c.unique, c.resent, c.index, c.op, c.mutation))
        .collect();
    assert_eq!(
        summary,
        [
            (0, false, 0, "open", true),
            (0, false, 0, "read", false),
            (20, true, 0, "write", true),
            (20, true, 1, "write", true),
        ],
        "the renewal, made for no kernel request, is not told"
    );
    assert!(
        calls
            .iter()
            .all(|c| c.nonce == fs.nonce()
                && c.request_id == fs.nonce().request_id(c.unique, c.index))
    );
}
