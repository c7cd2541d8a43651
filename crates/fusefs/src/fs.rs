//! The filesystem's logic: each kernel request becomes one or more protocol calls. No FUSE
//! session is needed to use it; the fuse3 adapter only forwards to it.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fuse3::raw::reply::{
    DirectoryEntry, DirectoryEntryPlus, ReplyAttr, ReplyCreated, ReplyData, ReplyEntry, ReplyOpen,
    ReplyStatFs, ReplyWrite,
};
use fuse3::{FileType, SetAttr};
use futures_util::StreamExt as _;
use lease_client::protocol::{FileId, MAX_DATA_BYTES, ROOT_INO};
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;
use lease_client::v1::{self, set_time};

use crate::attr::{file_attr, kind_of_entry, timestamp};
use crate::error::Error;
use crate::nodes::{NodeState, Nodes};
use crate::service::FileService;

/// `FOPEN_DIRECT_IO`: the kernel sends every read and write to us, caching nothing.
const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// Lifetime of every entry, attribute and negative entry the kernel may cache: none, so that a
/// write through another mount is visible at once.
pub const TTL: Duration = Duration::ZERO;
/// How many interrupts are remembered for requests that have not started yet.
const MAX_PENDING_INTERRUPTS: usize = 1024;

/// Who asks: the kernel's request ID (for interrupts) and the caller's credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The kernel's unique request ID.
    pub unique: u64,
    /// The caller's user ID.
    pub uid: u32,
    /// The caller's group ID.
    pub gid: u32,
}

/// `FUSE_WRITE_KILL_SUIDGID` in a WRITE request's `write_flags`: the writer lacks
/// CAP_FSETID, so the write must drop the file's set-user-ID and set-group-ID bits (with
/// direct I/O the kernel leaves this to the filesystem).
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// What the kernel says about one WRITE besides its data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// The `open(2)` flags of the descriptor written through (`O_APPEND` ...).
    pub open_flags: u32,
    /// The writer lacks CAP_FSETID: the worker clears the file's set-user-ID bit, and its
    /// set-group-ID bit as the rule in SEMANTICS.md says, before it writes.
    pub kill_suidgid: bool,
}

impl WriteFlags {
    /// The flags of a WRITE request: its open flags and its FUSE `write_flags`.
    pub fn from_request(open_flags: u32, write_flags: u32) -> Self {
        WriteFlags {
            open_flags,
            kill_suidgid: write_flags & FUSE_WRITE_KILL_SUIDGID != 0,
        }
    }
}

/// Tunables of the filesystem.
#[derive(Clone, Copy, Debug)]
pub struct FsConfig {
    /// The inode generation of the volume root on the workers.
    pub root_generation: u64,
    /// How many entries one readdir call asks a worker for.
    pub readdir_batch: u32,
    /// How often open handles are renewed until a worker states its handle lease.
    pub default_handle_renewal: Duration,
    /// The most file data one worker call carries (clamped to 4 KiB..=1 MiB). A larger read or
    /// write is sent as several calls of this size, up to [`PARALLEL_CALLS`] of them in flight
    /// at once, so that the two ends of the connection and the worker's disk work on the parts
    /// of one request together instead of one after another.
    pub call_data_bytes: usize,
}

/// How many calls of one read or write may be in flight at once.
pub const PARALLEL_CALLS: usize = 8;

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            root_generation: lease_client::protocol::ROOT_INODE_GENERATION,
            readdir_batch: 256,
            default_handle_renewal: Duration::from_secs(10),
            call_data_bytes: 128 << 10,
        }
    }
}

impl FsConfig {
    fn part_size(&self) -> usize {
        self.call_data_bytes.clamp(4 << 10, MAX_DATA_BYTES)
    }
}

/// The filesystem of one mounted volume.
#[derive(Debug)]
pub struct Fs<S> {
    service: S,
    config: FsConfig,
    nodes: Mutex<Nodes>,
    /// Open worker handles (the FUSE file handle *is* the worker's handle) and their files.
    handles: Mutex<HashMap<u64, OpenFile>>,
    /// The handle lease the workers last stated.
    handle_lease: Mutex<Option<Duration>>,
    /// Interrupts for requests that have not been sent yet.
    interrupts: Mutex<VecDeque<u64>>,
}

/// A worker handle this mount holds: its file and the flags it was opened with.
#[derive(Clone, Copy, Debug)]
struct OpenFile {
    file: FileId,
    flags: u32,
}

/// One open handle the kernel holds, as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleState {
    /// The FUSE file handle, which is the worker's handle.
    pub handle: u64,
    /// The file it is open on.
    pub file: FileId,
    /// The `open(2)` flags it was opened with.
    pub flags: u32,
}

/// What the kernel holds of a mounted volume, as data rather than private fields: every node
/// (with its inode generation and lookup count) and every open handle (with its file and open
/// flags). A process taking over a live FUSE connection needs exactly this to answer requests
/// that name them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountState {
    /// The nodes, root included, in node ID order.
    pub nodes: Vec<NodeState>,
    /// The open handles, in handle order.
    pub handles: Vec<HandleState>,
}

/// The parts of a read as one buffer, copied only when there is more than one.
fn concat(mut parts: Vec<Bytes>) -> Bytes {
    if parts.len() <= 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut whole = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for part in &parts {
        whole.extend_from_slice(part);
    }
    whole.freeze()
}

/// The bytes a write call's result says were written; `None` for a result of another kind.
fn written_by(result: &ReplyResult) -> Option<usize> {
    match result {
        ReplyResult::Write(reply) | ReplyResult::WriteKillSuidgid(reply) => {
            Some(reply.written as usize)
        }
        _ => None,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the expected result out of a reply, or a malformed-reply error for a reply to another
/// operation (which the client already refuses; this is the last line).
macro_rules! expect {
    ($result:expr, $variant:ident) => {
        match $result {
            ReplyResult::$variant(value) => value,
            _ => {
                return Err(Error::malformed(
                    stringify!($variant),
                    "it answers another operation",
                ));
            }
        }
    };
}

impl<S: FileService> Fs<S> {
    /// A filesystem that sends its calls to `service`.
    pub fn new(service: S, config: FsConfig) -> Self {
        Fs {
            service,
            nodes: Mutex::new(Nodes::new(config.root_generation)),
            config,
            handles: Mutex::new(HashMap::new()),
            handle_lease: Mutex::new(None),
            interrupts: Mutex::new(VecDeque::new()),
        }
    }

    /// The file service.
    pub fn service(&self) -> &S {
        &self.service
    }

    /// How many nodes the kernel holds (the root included).
    pub fn node_count(&self) -> usize {
        lock(&self.nodes).len()
    }

    /// The nodes and open handles the kernel holds, as data.
    pub fn state(&self) -> MountState {
        let nodes = lock(&self.nodes).snapshot();
        let mut handles: Vec<HandleState> = lock(&self.handles)
            .iter()
            .map(|(&handle, open)| HandleState {
                handle,
                file: open.file,
                flags: open.flags,
            })
            .collect();
        handles.sort_unstable_by_key(|h| h.handle);
        MountState { nodes, handles }
    }

    /// How many handles are open.
    pub fn open_handles(&self) -> usize {
        lock(&self.handles).len()
    }

    fn file(&self, node: u64) -> Result<FileId, Error> {
        lock(&self.nodes)
            .file(node)
            .ok_or(Error::StaleNode { node })
    }

    /// Sends `op` on behalf of `caller`, unless the kernel interrupted the request before it
    /// could be sent. Once sent, a call runs to its outcome: an `EINTR` after sending would
    /// invite the application to repeat a mutation under a new request ID.
    async fn call(&self, caller: Caller, op: Op) -> Result<ReplyResult, Error> {
        self.not_interrupted(caller)?;
        self.send(op).await
    }

    /// `EINTR` if the kernel interrupted `caller`'s request (which is then forgotten).
    fn not_interrupted(&self, caller: Caller) -> Result<(), Error> {
        let mut interrupts = lock(&self.interrupts);
        match interrupts.iter().position(|u| *u == caller.unique) {
            Some(at) => {
                interrupts.remove(at);
                Err(Error::Interrupted)
            }
            None => Ok(()),
        }
    }

    /// Sends `op`, whatever the kernel may have interrupted meanwhile.
    async fn send(&self, op: Op) -> Result<ReplyResult, Error> {
        let name = op.name();
        self.service
            .call(op)
            .await
            .map_err(|source| Error::call(name, source))
    }

    /// The kernel interrupts request `unique`. Honoured only if it has not been sent yet.
    pub fn interrupt(&self, unique: u64) {
        let mut interrupts = lock(&self.interrupts);
        if interrupts.len() == MAX_PENDING_INTERRUPTS {
            interrupts.pop_front();
        }
        interrupts.push_back(unique);
    }

    fn entry(&self, entry: v1::Entry) -> Result<ReplyEntry, Error> {
        let (Some(file), Some(attr)) = (entry.file, entry.attr) else {
            return Err(Error::malformed("entry", "no file or no attributes"));
        };
        let file = FileId::from(file);
        lock(&self.nodes).looked_up(file);
        Ok(ReplyEntry {
            ttl: TTL,
            attr: file_attr(file.ino, &attr),
            generation: file.inode_generation,
        })
    }

    fn attr(node: u64, entry: v1::Entry) -> Result<ReplyAttr, Error> {
        let attr = entry
            .attr
            .ok_or(Error::malformed("entry", "no attributes"))?;
        Ok(ReplyAttr {
            ttl: TTL,
            attr: file_attr(node, &attr),
        })
    }

    fn caller_of(caller: Caller) -> Option<v1::Caller> {
        Some(v1::Caller {
            uid: caller.uid,
            gid: caller.gid,
        })
    }

    /// LOOKUP.
    pub async fn lookup(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
    ) -> Result<ReplyEntry, Error> {
        let parent = self.file(parent)?;
        let op = Op::Lookup(v1::LookupRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
        });
        self.entry(expect!(self.call(caller, op).await?, Lookup))
    }

    /// FORGET (and each item of BATCH_FORGET).
    pub fn forget(&self, node: u64, count: u64) {
        lock(&self.nodes).forget(node, count);
    }

    /// An open handle of `file`, for a request about a file that the kernel names without one.
    fn open_handle_of(&self, file: FileId) -> Option<u64> {
        lock(&self.handles)
            .iter()
            .find(|(_, open)| open.file == file)
            .map(|(handle, _)| *handle)
    }

    /// Sends the attribute request `op(handle)`. A file that is open but has no name left
    /// (unlinked while open) is only reachable through an open handle, and the kernel sends
    /// `fstat`, `fchmod` and the like without one: on `ESTALE` the request is sent again with
    /// a handle this mount holds for the file. The worker refuses `ESTALE` before it changes
    /// anything, so repeating the request under a new ID is safe.
    async fn attr_call(
        &self,
        caller: Caller,
        file: FileId,
        fh: Option<u64>,
        op: impl Fn(Option<u64>) -> Op,
    ) -> Result<ReplyResult, Error> {
        match self.call(caller, op(fh)).await {
            Err(error) if error.errno().raw() == libc::ESTALE && fh.is_none() => {
                match self.open_handle_of(file) {
                    Some(handle) => self.call(caller, op(Some(handle))).await,
                    None => Err(error),
                }
            }
            other => other,
        }
    }

    /// GETATTR.
    pub async fn getattr(
        &self,
        caller: Caller,
        node: u64,
        fh: Option<u64>,
    ) -> Result<ReplyAttr, Error> {
        let file = self.file(node)?;
        let op = |handle| {
            Op::Getattr(v1::GetattrRequest {
                file: Some(file.into()),
                handle,
            })
        };
        let reply = self.attr_call(caller, file, fh, op).await?;
        Self::attr(node, expect!(reply, Getattr))
    }

    /// SETATTR: mode, owner, size and times, each only when asked for.
    pub async fn setattr(
        &self,
        caller: Caller,
        node: u64,
        fh: Option<u64>,
        set: SetAttr,
    ) -> Result<ReplyAttr, Error> {
        let file = self.file(node)?;
        let time = |t: Option<fuse3::Timestamp>| {
            t.map(|t| v1::SetTime {
                time: Some(set_time::Time::At(timestamp(t))),
            })
        };
        let op = |handle| {
            Op::Setattr(v1::SetattrRequest {
                file: Some(file.into()),
                handle,
                mode: set.mode.map(|m| m & 0o7777),
                uid: set.uid,
                gid: set.gid,
                size: set.size,
                atime: time(set.atime),
                mtime: time(set.mtime),
            })
        };
        let reply = self.attr_call(caller, file, fh, op).await?;
        Self::attr(node, expect!(reply, Setattr))
    }

    /// READLINK.
    pub async fn readlink(&self, caller: Caller, node: u64) -> Result<ReplyData, Error> {
        let file = self.file(node)?;
        let op = Op::Readlink(v1::ReadlinkRequest {
            file: Some(file.into()),
        });
        let reply = expect!(self.call(caller, op).await?, Readlink);
        Ok(ReplyData {
            data: Bytes::from(reply.target),
        })
    }

    /// SYMLINK.
    pub async fn symlink(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<ReplyEntry, Error> {
        let parent = self.file(parent)?;
        let op = Op::Symlink(v1::SymlinkRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
            target: target.as_bytes().to_vec(),
            caller: Self::caller_of(caller),
        });
        self.entry(expect!(self.call(caller, op).await?, Symlink))
    }

    /// MKNOD. The kernel has applied the umask already.
    pub async fn mknod(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<ReplyEntry, Error> {
        let parent = self.file(parent)?;
        let op = Op::Mknod(v1::MknodRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
            mode,
            umask: 0,
            rdev: u64::from(rdev),
            caller: Self::caller_of(caller),
        });
        self.entry(expect!(self.call(caller, op).await?, Mknod))
    }

    /// MKDIR.
    pub async fn mkdir(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<ReplyEntry, Error> {
        let parent = self.file(parent)?;
        let op = Op::Mkdir(v1::MkdirRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
            mode,
            umask,
            caller: Self::caller_of(caller),
        });
        self.entry(expect!(self.call(caller, op).await?, Mkdir))
    }

    /// UNLINK.
    pub async fn unlink(&self, caller: Caller, parent: u64, name: &OsStr) -> Result<(), Error> {
        let parent = self.file(parent)?;
        let op = Op::Unlink(v1::UnlinkRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
        });
        expect!(self.call(caller, op).await?, Unlink);
        Ok(())
    }

    /// RMDIR.
    pub async fn rmdir(&self, caller: Caller, parent: u64, name: &OsStr) -> Result<(), Error> {
        let parent = self.file(parent)?;
        let op = Op::Rmdir(v1::RmdirRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
        });
        expect!(self.call(caller, op).await?, Rmdir);
        Ok(())
    }

    /// RENAME and RENAME2 (`flags` as renameat2 takes them).
    pub async fn rename(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: u32,
    ) -> Result<(), Error> {
        let (parent, new_parent) = (self.file(parent)?, self.file(new_parent)?);
        let op = Op::Rename(v1::RenameRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
            new_parent: Some(new_parent.into()),
            new_name: new_name.as_bytes().to_vec(),
            flags,
        });
        expect!(self.call(caller, op).await?, Rename);
        Ok(())
    }

    /// LINK.
    pub async fn link(
        &self,
        caller: Caller,
        node: u64,
        new_parent: u64,
        new_name: &OsStr,
    ) -> Result<ReplyEntry, Error> {
        let (file, new_parent) = (self.file(node)?, self.file(new_parent)?);
        let op = Op::Link(v1::LinkRequest {
            file: Some(file.into()),
            new_parent: Some(new_parent.into()),
            new_name: new_name.as_bytes().to_vec(),
        });
        self.entry(expect!(self.call(caller, op).await?, Link))
    }

    fn opened(&self, file: FileId, flags: u32, handle: u64, lease_ms: u64) {
        lock(&self.handles).insert(handle, OpenFile { file, flags });
        if lease_ms > 0 {
            *lock(&self.handle_lease) = Some(Duration::from_millis(lease_ms));
        }
    }

    /// OPEN: every file is opened for direct I/O. An open that truncates (`O_TRUNC`: the
    /// kernel truncates through the open and sends no kill request of its own) names its
    /// caller, so that the worker drops the file's privileges as a truncation does.
    pub async fn open(&self, caller: Caller, node: u64, flags: u32) -> Result<ReplyOpen, Error> {
        let file = self.file(node)?;
        let open = v1::OpenRequest {
            file: Some(file.into()),
            flags,
        };
        let reply = if flags & libc::O_TRUNC as u32 == 0 {
            expect!(self.call(caller, Op::Open(open)).await?, Open)
        } else {
            let op = Op::OpenKillSuidgid(v1::OpenKillSuidgidRequest {
                open: Some(open),
                caller: Self::caller_of(caller),
            });
            expect!(self.call(caller, op).await?, OpenKillSuidgid)
        };
        self.opened(file, flags, reply.handle, reply.handle_lease_ms);
        Ok(ReplyOpen {
            fh: reply.handle,
            flags: FOPEN_DIRECT_IO,
        })
    }

    /// CREATE: create and open in one call.
    pub async fn create(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: u32,
    ) -> Result<ReplyCreated, Error> {
        let parent = self.file(parent)?;
        let op = Op::Create(v1::CreateRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
            mode,
            umask: 0,
            flags,
            caller: Self::caller_of(caller),
        });
        let reply = expect!(self.call(caller, op).await?, Create);
        let entry = self.entry(reply.entry.ok_or(Error::malformed("create", "no entry"))?)?;
        let file = FileId {
            ino: entry.attr.ino,
            inode_generation: entry.generation,
        };
        self.opened(file, flags, reply.handle, reply.handle_lease_ms);
        Ok(ReplyCreated {
            ttl: TTL,
            attr: entry.attr,
            generation: entry.generation,
            fh: reply.handle,
            flags: FOPEN_DIRECT_IO,
        })
    }

    /// READ: one call per [`FsConfig::call_data_bytes`], several in flight, reassembled in
    /// order. A short part is the end of the file and a failed part before it fails the read
    /// (a short read would look like the end of the file); either way no further part starts,
    /// and parts still in flight are abandoned (a read changes nothing).
    pub async fn read(
        &self,
        caller: Caller,
        node: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<ReplyData, Error> {
        let file = self.file(node)?;
        self.not_interrupted(caller)?;
        let part = self.config.part_size();
        let calls = (0..size as usize).step_by(part).map(|start| {
            let len = part.min(size as usize - start);
            let op = Op::Read(v1::ReadRequest {
                file: Some(file.into()),
                handle: fh,
                offset: offset.saturating_add(start as u64),
                size: len as u32,
            });
            async move { (len, self.send(op).await) }
        });
        let mut replies = futures_util::stream::iter(calls).buffered(PARALLEL_CALLS);
        let mut parts = Vec::new();
        while let Some((len, reply)) = replies.next().await {
            let data = expect!(reply?, Read).data;
            if data.len() > len {
                return Err(Error::malformed("read", "more data than asked for"));
            }
            let short = data.len() < len;
            parts.push(data);
            if short {
                break;
            }
        }
        Ok(ReplyData {
            data: concat(parts),
        })
    }

    /// WRITE: one call per [`FsConfig::call_data_bytes`], several in flight, each run to its
    /// outcome once sent; after a part fails or comes back short, no further part starts.
    /// The reply counts the bytes before the first part that failed or was short, and is an
    /// error when that is the first part; parts sent after it may have been written too (no
    /// promise that a request applies as one).
    ///
    /// On a handle opened with `O_APPEND`, or a write that says `O_APPEND`, the worker's
    /// descriptor appends whatever the offset, so the parts of a write would land in the order
    /// they arrive: such a write goes out as calls of the largest size, one after another (a
    /// kernel request, at most 1 MiB, is then one call and appends as one).
    ///
    /// A write by a caller without CAP_FSETID ([`WriteFlags::kill_suidgid`]) goes out as
    /// `write_kill_suidgid` calls, every part of it, naming the caller.
    pub async fn write(
        &self,
        caller: Caller,
        node: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        flags: WriteFlags,
    ) -> Result<ReplyWrite, Error> {
        let file = self.file(node)?;
        self.not_interrupted(caller)?;
        let opened_with = lock(&self.handles).get(&fh).map_or(0, |open| open.flags);
        let appends = (flags.open_flags | opened_with) & libc::O_APPEND as u32 != 0;
        let (part, in_flight) = match appends {
            false => (self.config.part_size(), PARALLEL_CALLS),
            true => (MAX_DATA_BYTES, 1),
        };
        let stopped = AtomicBool::new(false);
        let stopped = &stopped;
        let calls = (0..data.len()).step_by(part).map(|start| async move {
            let chunk = &data[start..data.len().min(start + part)];
            if stopped.load(Ordering::Acquire) {
                return (chunk.len(), None);
            }
            // Copied out of fuse3's buffer when the call starts, so the connection encrypts
            // one part while the next is copied.
            let write = v1::WriteRequest {
                file: Some(file.into()),
                handle: fh,
                offset: offset.saturating_add(start as u64),
                data: Bytes::copy_from_slice(chunk),
                flags: flags.open_flags,
            };
            let op = match flags.kill_suidgid {
                false => Op::Write(write),
                true => Op::WriteKillSuidgid(v1::WriteKillSuidgidRequest {
                    write: Some(write),
                    caller: Self::caller_of(caller),
                }),
            };
            let reply = self.send(op).await;
            let whole = matches!(&reply, Ok(result) if written_by(result) == Some(chunk.len()));
            if !whole {
                stopped.store(true, Ordering::Release);
            }
            (chunk.len(), Some(reply))
        });
        // Collected whole: a call already sent is never dropped half-way.
        let replies: Vec<_> = futures_util::stream::iter(calls)
            .buffered(in_flight)
            .collect()
            .await;
        let mut written = 0usize;
        for (len, reply) in replies {
            let n = match reply {
                Some(Ok(reply)) => match written_by(&reply) {
                    Some(n) => n,
                    None => expect!(reply, Write).written as usize,
                },
                Some(Err(error)) if written == 0 => return Err(error),
                Some(Err(_)) | None => break,
            };
            if n > len {
                return Err(Error::malformed("write", "more bytes written than sent"));
            }
            written += n;
            if n < len {
                break;
            }
        }
        Ok(ReplyWrite {
            written: u32::try_from(written).unwrap_or(u32::MAX),
        })
    }

    /// FLUSH.
    pub async fn flush(
        &self,
        caller: Caller,
        node: u64,
        fh: u64,
        lock_owner: u64,
    ) -> Result<(), Error> {
        let file = self.file(node)?;
        let op = Op::Flush(v1::FlushRequest {
            file: Some(file.into()),
            handle: fh,
            lock_owner,
        });
        expect!(self.call(caller, op).await?, Flush);
        Ok(())
    }

    /// FSYNC.
    pub async fn fsync(
        &self,
        caller: Caller,
        node: u64,
        fh: u64,
        datasync: bool,
    ) -> Result<(), Error> {
        let file = self.file(node)?;
        let op = Op::Fsync(v1::FsyncRequest {
            file: Some(file.into()),
            handle: fh,
            datasync,
        });
        expect!(self.call(caller, op).await?, Fsync);
        Ok(())
    }

    /// RELEASE: the handle is forgotten here whatever the worker answers (the kernel will not
    /// use it again; the worker reclaims it when its lease ends).
    pub async fn release(
        &self,
        caller: Caller,
        node: u64,
        fh: u64,
        flags: u32,
    ) -> Result<(), Error> {
        let open = lock(&self.handles).remove(&fh);
        let file = match open {
            Some(open) => open.file,
            None => self.file(node)?,
        };
        let op = Op::Release(v1::ReleaseRequest {
            file: Some(file.into()),
            handle: fh,
            flags,
        });
        expect!(self.call(caller, op).await?, Release);
        Ok(())
    }

    /// STATFS.
    pub async fn statfs(&self, caller: Caller) -> Result<ReplyStatFs, Error> {
        let reply = expect!(
            self.call(caller, Op::Statfs(v1::StatfsRequest {})).await?,
            Statfs
        );
        Ok(ReplyStatFs {
            blocks: reply.blocks,
            bfree: reply.blocks_free,
            bavail: reply.blocks_available,
            files: reply.files,
            ffree: reply.files_free,
            bsize: reply.block_size,
            namelen: reply.name_max,
            frsize: reply.fragment_size,
        })
    }

    /// One worker readdir batch after FUSE offset `offset`: `.` and `..` take the FUSE offsets
    /// 1 and 2, and the worker's cookie `c` is FUSE offset `c + 2`.
    async fn readdir_batch(
        &self,
        caller: Caller,
        dir: FileId,
        offset: u64,
        plus: bool,
    ) -> Result<(Vec<v1::DirEntry>, bool), Error> {
        let op = Op::Readdir(v1::ReaddirRequest {
            dir: Some(dir.into()),
            handle: None,
            offset: offset.saturating_sub(2),
            max_entries: self.config.readdir_batch,
            plus,
        });
        let reply = expect!(self.call(caller, op).await?, Readdir);
        Ok((reply.entries, reply.end))
    }

    fn fuse_offset(cookie: u64) -> Result<i64, Error> {
        cookie
            .checked_add(2)
            .and_then(|o| i64::try_from(o).ok())
            .ok_or(Error::malformed(
                "readdir",
                "a directory offset out of range",
            ))
    }

    /// READDIR from FUSE offset `offset`: one worker batch (the kernel asks again for more).
    pub async fn readdir(
        &self,
        caller: Caller,
        node: u64,
        offset: u64,
    ) -> Result<Vec<DirectoryEntry>, Error> {
        let dir = self.file(node)?;
        let mut out = Vec::new();
        for (at, name) in [(0u64, "."), (1, "..")] {
            if offset <= at {
                out.push(DirectoryEntry {
                    inode: dir.ino,
                    kind: FileType::Directory,
                    name: name.into(),
                    offset: at as i64 + 1,
                });
            }
        }
        let (entries, _end) = self
            .readdir_batch(caller, dir, offset.max(2), false)
            .await?;
        for e in entries {
            let ino = e.file.map_or(0, |f| f.ino);
            out.push(DirectoryEntry {
                inode: ino,
                kind: kind_of_entry(e.file_type),
                name: OsStr::from_bytes(&e.name).to_owned(),
                offset: Self::fuse_offset(e.next_offset)?,
            });
        }
        Ok(out)
    }

    /// READDIRPLUS from FUSE offset `offset`: entries with attributes. Each entry the kernel
    /// takes counts as a lookup (except `.` and `..`); the caller reports those with
    /// [`Fs::delivered`], because the kernel may take fewer entries than were read.
    pub async fn readdirplus(
        &self,
        caller: Caller,
        node: u64,
        offset: u64,
    ) -> Result<Vec<DirectoryEntryPlus>, Error> {
        let dir = self.file(node)?;
        let mut out = Vec::new();
        if offset < 2 {
            let attr = self.getattr(caller, node, None).await?.attr;
            for (at, name) in [(0u64, "."), (1, "..")] {
                if offset <= at {
                    out.push(DirectoryEntryPlus {
                        inode: dir.ino,
                        generation: dir.inode_generation,
                        kind: FileType::Directory,
                        name: name.into(),
                        offset: at as i64 + 1,
                        attr,
                        entry_ttl: TTL,
                        attr_ttl: TTL,
                    });
                }
            }
        }
        let (entries, _end) = self.readdir_batch(caller, dir, offset.max(2), true).await?;
        for e in entries {
            let (Some(file), Some(attr)) = (e.file, e.attr) else {
                return Err(Error::malformed(
                    "readdir",
                    "an entry without file or attributes",
                ));
            };
            let file = FileId::from(file);
            out.push(DirectoryEntryPlus {
                inode: file.ino,
                generation: file.inode_generation,
                kind: kind_of_entry(e.file_type),
                name: OsStr::from_bytes(&e.name).to_owned(),
                offset: Self::fuse_offset(e.next_offset)?,
                attr: file_attr(file.ino, &attr),
                entry_ttl: TTL,
                attr_ttl: TTL,
            });
        }
        Ok(out)
    }

    /// The kernel took `entry` from a READDIRPLUS reply: it now holds one lookup of it.
    pub fn delivered(&self, entry: &DirectoryEntryPlus) {
        if entry.name != "." && entry.name != ".." {
            let file = FileId {
                ino: entry.inode,
                inode_generation: entry.generation,
            };
            lock(&self.nodes).looked_up(file);
        }
    }

    /// Renews every open handle in one call and forgets those the worker says expired.
    /// Returns how long to wait before the next renewal (a third of the handle lease).
    pub async fn renew_handles(&self) -> Result<Duration, Error> {
        let handles: Vec<u64> = lock(&self.handles).keys().copied().collect();
        let default = self.config.default_handle_renewal;
        if handles.is_empty() {
            return Ok(lock(&self.handle_lease).map_or(default, |lease| lease / 3));
        }
        let caller = Caller {
            unique: 0,
            uid: 0,
            gid: 0,
        };
        let reply = expect!(
            self.call(
                caller,
                Op::RenewHandles(v1::RenewHandlesRequest { handles })
            )
            .await?,
            RenewHandles
        );
        {
            let mut open = lock(&self.handles);
            for expired in &reply.expired {
                open.remove(expired);
            }
        }
        if !reply.expired.is_empty() {
            tracing::warn!(
                count = reply.expired.len(),
                "open handles expired on the worker"
            );
        }
        let lease = Duration::from_millis(reply.handle_lease_ms);
        if reply.handle_lease_ms > 0 {
            *lock(&self.handle_lease) = Some(lease);
            return Ok(lease / 3);
        }
        Ok(default)
    }

    /// Renews open handles for as long as the future is polled.
    pub async fn run_handle_renewal(&self) {
        let mut wait = self.config.default_handle_renewal;
        loop {
            tokio::time::sleep(wait).await;
            wait = match self.renew_handles().await {
                Ok(next) => next,
                Err(error) => {
                    crate::error::report("renew_handles", &error);
                    self.config
                        .default_handle_renewal
                        .min(Duration::from_secs(1))
                }
            };
        }
    }
}

/// The node ID the kernel uses for the volume root.
pub const ROOT_NODE: u64 = ROOT_INO;

#[cfg(test)]
mod tests {
    use std::future::Future;

    use lease_client::{Error, Refusal};

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
        assert_eq!(
            reply.written as usize,
            3 * PART,
            "the parts before the failed one"
        );
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
        assert_eq!(reply.written as usize, data.len());
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
        assert_eq!(reply.unwrap().written as usize, PART);
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
        assert_eq!(reply.await.unwrap().written as usize, MAX_DATA_BYTES);
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
        assert_eq!(reply.unwrap().written as usize, data.len());
        assert_eq!(*lock(&fs.service().most), 1);
        assert_eq!(started(&fs), [0, whole, 2 * whole]);

        // O_APPEND only at open (after F_SETFL the kernel's writes may not say it).
        let fs = in_flight();
        let open = fs.open(caller(), ROOT_NODE, libc::O_WRONLY as u32 | append);
        let fh = open.await.unwrap().fh;
        let reply = fs.write(
            caller(),
            ROOT_NODE,
            fh,
            0,
            &data[..MAX_DATA_BYTES],
            WriteFlags::default(),
        );
        assert_eq!(reply.await.unwrap().written as usize, MAX_DATA_BYTES);
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
        assert_eq!(reply.unwrap().written as usize, data.len());
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
        assert_eq!(fs.open(user, ROOT_NODE, trunc).await.unwrap().fh, 3);
        assert_eq!(
            fs.open(user, ROOT_NODE, libc::O_WRONLY as u32)
                .await
                .unwrap()
                .fh,
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
        assert_eq!(write.unwrap().written as usize, data.len());
    }

    #[tokio::test]
    async fn a_read_is_reassembled_in_order_when_later_parts_finish_first() {
        let fs = in_flight();
        let read = fs
            .read(caller(), ROOT_NODE, 1, 0, MAX_DATA_BYTES as u32)
            .await;
        let expected: Vec<u8> = (0..8u8).flat_map(|i| vec![i; PART]).collect();
        assert!(read.unwrap().data[..] == expected[..]);
        assert_eq!(*lock(&fs.service().most), PARALLEL_CALLS);
    }

    #[tokio::test]
    async fn a_read_is_reassembled_in_order_ends_at_a_short_part_and_fails_on_a_failed_one() {
        let size = 8 * PART as u32;
        let fs = parts_of(PART, u64::MAX, u64::MAX);
        let read = fs.read(caller(), ROOT_NODE, 1, 0, size).await.unwrap();
        let expected: Vec<u8> = (0..8u8).flat_map(|i| vec![i; PART]).collect();
        assert!(read.data[..] == expected[..], "in order");

        // The end of the file inside the second part: what comes later does not matter.
        let end = (PART + PART / 2) as u64;
        let fs = parts_of(PART, end, 5 * PART as u64);
        let read = fs.read(caller(), ROOT_NODE, 1, 0, size).await.unwrap();
        assert_eq!(read.data.len() as u64, end);

        // A failed part before the end fails the whole read.
        let fs = parts_of(PART, u64::MAX, 5 * PART as u64);
        let failed = fs.read(caller(), ROOT_NODE, 1, 0, size).await;
        assert_eq!(failed.unwrap_err().errno().raw(), libc::EIO);

        // Parts of 1 MiB: one call for the whole read.
        let fs = parts_of(MAX_DATA_BYTES, u64::MAX, u64::MAX);
        let read = fs.read(caller(), ROOT_NODE, 1, 0, size).await.unwrap();
        assert_eq!(read.data.len(), size as usize);
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
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        fs.setattr(caller(), ROOT_NODE, None, chmod).await.unwrap();
        assert_eq!(
            *lock(&fs.service().handles_sent),
            [None, None, Some(7), None, Some(7)],
            "each request goes by inode first, then once more through the open handle"
        );
    }
}
