//! The filesystem's logic: each kernel request becomes one or more protocol calls. No FUSE
//! session is needed to use it, and it answers with the core's own types (`reply.rs`); the
//! adapter only forwards to it and converts them.
//!
//! This module holds the core (the `Fs` type, how a call is sent, interrupts, nodes) and the
//! metadata requests; `io` splits reads and writes into calls, `handles` keeps the open
//! handles and their renewal, `dir` lists directories.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lease_client::protocol::{FileId, ROOT_INO, RandomUnavailable, RequestId};
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;
use lease_client::v1::{self, set_time};

use crate::attr::{file_attr, timestamp};
use crate::error::Error;
use crate::nodes::Nodes;
use crate::reply::{Entry, SetAttrs, SetTime, Stat, StatFs};
use crate::service::FileService;

/// `FOPEN_DIRECT_IO`: the kernel sends every read and write to us, caching nothing.
const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// Lifetime of every entry, attribute and negative entry the kernel may cache: none, so that a
/// write through another mount is visible at once.
pub const TTL: Duration = Duration::ZERO;
/// How many interrupts are remembered for requests that have not started yet.
const MAX_PENDING_INTERRUPTS: usize = 1024;

/// Who asks: the kernel's request ID (for interrupts and the request IDs of the worker calls
/// made for it) and the caller's credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The kernel's unique request ID, with its resend bit when the kernel sent it again.
    /// The kernel numbers requests in steps of two: bit 0 marks an INTERRUPT and is not part
    /// of the ID, so requests `2n` and `2n + 1` make their calls under the same request IDs.
    pub unique: u64,
    /// The caller's user ID.
    pub uid: u32,
    /// The caller's group ID.
    pub gid: u32,
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
    /// The client's call budget. A kernel request starts no worker call later than this after
    /// its first (a write's parts not started by then end it short), so that a dead owner's
    /// replies are at most two budgets old when it dies (the node's HANDOFF.md, section 7).
    pub call_budget: Duration,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            root_generation: lease_client::protocol::ROOT_INODE_GENERATION,
            readdir_batch: 256,
            default_handle_renewal: Duration::from_secs(10),
            call_data_bytes: 128 << 10,
            call_budget: Duration::from_secs(15),
        }
    }
}

/// The filesystem of one mounted volume.
#[derive(Debug)]
pub struct Fs<S> {
    service: S,
    config: FsConfig,
    /// The connection's nonce, from which every call's request ID is derived.
    nonce: ConnectionNonce,
    nodes: Mutex<Nodes>,
    /// Open worker handles (the FUSE file handle *is* the worker's handle) and their files.
    handles: Mutex<HashMap<u64, OpenFile>>,
    /// Handles whose OPEN or CREATE reply the kernel has not been seen to take, by the ID of
    /// that request ([`HandleState::opened_by`]).
    undelivered: Mutex<HashMap<u64, u64>>,
    /// The handle lease the workers last stated.
    handle_lease: Mutex<Option<Duration>>,
    /// Interrupts for requests that have not been sent yet.
    interrupts: Mutex<VecDeque<u64>>,
    /// Where new nodes and handles are written ahead, once set.
    write_ahead: OnceLock<Arc<dyn WriteAhead>>,
    /// Told of every call made for a kernel request, once set.
    observer: OnceLock<Arc<dyn CallObserver>>,
    /// Until when mutations the kernel resends may be sent again (`resend.rs`).
    resend_rules: Mutex<Vec<ResendRule>>,
    /// Set while this owner's resend rule waits for the first request read first-hand.
    first_hand_pending: AtomicBool,
    /// Set by the one [`Fs::resend_until`].
    resend_set: AtomicBool,
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

mod dir;
mod handles;
mod ids;
mod io;
mod observe;
mod resend;
#[cfg(test)]
mod tests;
mod write_ahead;

pub use dir::PlusListing;
use handles::OpenFile;
pub use handles::{HandleState, MountState};
pub use ids::ConnectionNonce;
pub use io::{FUSE_WRITE_KILL_SUIDGID, PARALLEL_CALLS, WriteFlags};
pub use observe::{CallObserver, ObservedCall};
pub use resend::{MAX_RESEND_RULES, ResendRule};
pub use write_ahead::{Recorded, TableChange, WriteAhead};

impl<S: FileService> Fs<S> {
    /// A filesystem for a new connection that sends its calls to `service`, with a fresh
    /// [`ConnectionNonce`]. Fails only when the operating system has no random bytes to give.
    pub fn new(service: S, config: FsConfig) -> Result<Self, RandomUnavailable> {
        Ok(Fs::with_nonce(service, config, ConnectionNonce::random()?))
    }

    fn with_nonce(service: S, config: FsConfig, nonce: ConnectionNonce) -> Self {
        Fs {
            service,
            nodes: Mutex::new(Nodes::new(config.root_generation)),
            config,
            nonce,
            handles: Mutex::new(HashMap::new()),
            undelivered: Mutex::new(HashMap::new()),
            handle_lease: Mutex::new(None),
            interrupts: Mutex::new(VecDeque::new()),
            write_ahead: OnceLock::new(),
            observer: OnceLock::new(),
            resend_rules: Mutex::new(Vec::new()),
            first_hand_pending: AtomicBool::new(false),
            resend_set: AtomicBool::new(false),
        }
    }

    /// A filesystem that serves a connection another `Fs` served before: it takes over the
    /// connection's nonce, the nodes (with their lookup counts) and open handles of `state`,
    /// that `Fs`'s [`Fs::state`] at the moment it stopped serving. The handles are renewed at
    /// once when the renewal starts ([`Fs::run_handle_renewal`]); one not known to be
    /// delivered is settled if its opening request comes again ([`HandleState::opened_by`]).
    pub fn with_state(service: S, config: FsConfig, state: &MountState) -> Self {
        let fs = Fs::with_nonce(service, config, state.nonce);
        *lock(&fs.nodes) = Nodes::restore(config.root_generation, &state.nodes);
        lock(&fs.undelivered).extend(
            state
                .handles
                .iter()
                .filter_map(|h| Some((h.opened_by?, h.handle))),
        );
        lock(&fs.handles).extend(state.handles.iter().map(|h| {
            (
                h.handle,
                OpenFile {
                    file: h.file,
                    flags: h.flags,
                },
            )
        }));
        fs
    }

    /// The file service.
    pub fn service(&self) -> &S {
        &self.service
    }

    /// The connection's nonce.
    pub fn nonce(&self) -> ConnectionNonce {
        self.nonce
    }

    /// From now on, tells `write_ahead` of every change to the nodes and open handles the
    /// kernel holds, new ones before the reply that hands them over (see [`WriteAhead`]).
    /// Changes made before are in [`Fs::state`]. Set once; `false` if one was set before.
    pub fn write_ahead_to(&self, write_ahead: Arc<dyn WriteAhead>) -> bool {
        self.write_ahead.set(write_ahead).is_ok()
    }

    /// Records `changes` with the write-ahead, if one is set, before a reply that needs them.
    pub(super) async fn write_ahead(&self, changes: Vec<TableChange>) {
        if let (false, Some(write_ahead)) = (changes.is_empty(), self.write_ahead.get()) {
            write_ahead.record(changes).await;
        }
    }

    /// Notes `changes` no reply waits for with the write-ahead, if one is set.
    pub(super) fn note(&self, changes: Vec<TableChange>) {
        if let Some(write_ahead) = self.write_ahead.get() {
            write_ahead.note(changes);
        }
    }

    /// How many nodes the kernel holds (the root included).
    pub fn node_count(&self) -> usize {
        lock(&self.nodes).len()
    }

    pub(super) fn file(&self, node: u64) -> Result<FileId, Error> {
        lock(&self.nodes)
            .file(node)
            .ok_or(Error::StaleNode { node })
    }

    /// Sends `op` as the first call made for `caller`'s request ([`Fs::call_at`] index 0).
    pub(super) async fn call(&self, caller: Caller, op: Op) -> Result<ReplyResult, Error> {
        self.call_at(caller, 0, op).await
    }

    /// Sends `op` as call `index` of `caller`'s request, unless the kernel interrupted the
    /// request before it could be sent. Once sent, a call runs to its outcome: an `EINTR`
    /// after sending would invite the application to repeat a mutation under a new request ID.
    ///
    /// The index numbers the request's calls in a fixed sequence (the parts of a split read
    /// or write, then one more per extra call), so that the request served again by another
    /// owner makes the same calls under the same IDs.
    pub(super) async fn call_at(
        &self,
        caller: Caller,
        index: u32,
        op: Op,
    ) -> Result<ReplyResult, Error> {
        self.not_interrupted(caller)?;
        let until = self.may_send(caller, &op)?;
        self.send_for(caller, index, until, op).await
    }

    /// Sends `op` as call `index` of `caller`'s request, under the call's derived request ID,
    /// starting no attempt after `until`; tells the observer, if one is set.
    pub(super) async fn send_for(
        &self,
        caller: Caller,
        index: u32,
        until: Option<Instant>,
        op: Op,
    ) -> Result<ReplyResult, Error> {
        let request_id = self.request_id(caller, index);
        let Some(observer) = self.observer.get() else {
            return self.send(Some(request_id), until, op).await;
        };
        let unique = fuse_wire::Unique(caller.unique);
        let mut call = ObservedCall {
            nonce: self.nonce,
            unique: unique.id(),
            resent: unique.is_resend(),
            index,
            request_id,
            op: op.name(),
            mutation: !op.is_read_only(),
            succeeded: None,
        };
        observer.observed(&call);
        let result = self.send(Some(request_id), until, op).await;
        call.succeeded = Some(result.is_ok());
        observer.observed(&call);
        result
    }

    /// The request ID of call `index` of `caller`'s request.
    pub(super) fn request_id(&self, caller: Caller, index: u32) -> RequestId {
        self.nonce.request_id(caller.unique, index)
    }

    /// `EINTR` if the kernel interrupted `caller`'s request (which is then forgotten). A
    /// request the kernel sent again after an owner died was sent to the workers already, as
    /// far as anyone knows: it is never interrupted.
    pub(super) fn not_interrupted(&self, caller: Caller) -> Result<(), Error> {
        if fuse_wire::Unique(caller.unique).is_resend() {
            return Ok(());
        }
        let mut interrupts = lock(&self.interrupts);
        match interrupts.iter().position(|u| *u == caller.unique) {
            Some(at) => {
                interrupts.remove(at);
                Err(Error::Interrupted)
            }
            None => Ok(()),
        }
    }

    /// Sends `op` under `request_id` (a random one when `None`), starting no attempt after
    /// `until`, whatever the kernel may have interrupted meanwhile.
    pub(super) async fn send(
        &self,
        request_id: Option<RequestId>,
        until: Option<Instant>,
        op: Op,
    ) -> Result<ReplyResult, Error> {
        let (name, read_only) = (op.name(), op.is_read_only());
        self.service
            .call(request_id, until, op)
            .await
            .map_err(|source| Error::call(name, read_only, source))
    }

    /// The kernel interrupts request `unique`. Honoured only if it has not been sent yet.
    pub fn interrupt(&self, unique: u64) {
        let mut interrupts = lock(&self.interrupts);
        if interrupts.len() == MAX_PENDING_INTERRUPTS {
            interrupts.pop_front();
        }
        interrupts.push_back(unique);
    }

    /// The entry of a reply that hands the kernel a node, counted as one more lookup and
    /// written ahead when the kernel did not hold the node.
    pub(super) async fn entry(&self, entry: v1::Entry) -> Result<Entry, Error> {
        let (entry, change) = self.counted_entry(entry)?;
        self.write_ahead(change.into_iter().collect()).await;
        Ok(entry)
    }

    /// [`Fs::entry`] without the write-ahead: the entry and the change to write ahead.
    pub(super) fn counted_entry(
        &self,
        entry: v1::Entry,
    ) -> Result<(Entry, Option<TableChange>), Error> {
        let (Some(file), Some(attr)) = (entry.file, entry.attr) else {
            return Err(Error::malformed("entry", "no file or no attributes"));
        };
        let file = FileId::from(file);
        let new = lock(&self.nodes).looked_up(file);
        let entry = Entry {
            attr: file_attr(file.ino, &attr),
            generation: file.inode_generation,
            ttl: TTL,
        };
        Ok((entry, new.then_some(TableChange::node(file))))
    }

    pub(super) fn attr(node: u64, entry: v1::Entry) -> Result<Stat, Error> {
        let attr = entry
            .attr
            .ok_or(Error::malformed("entry", "no attributes"))?;
        Ok(Stat {
            attr: file_attr(node, &attr),
            ttl: TTL,
        })
    }

    pub(super) fn caller_of(caller: Caller) -> Option<v1::Caller> {
        Some(v1::Caller {
            uid: caller.uid,
            gid: caller.gid,
        })
    }

    /// LOOKUP.
    pub async fn lookup(&self, caller: Caller, parent: u64, name: &OsStr) -> Result<Entry, Error> {
        let parent = self.file(parent)?;
        let op = Op::Lookup(v1::LookupRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
        });
        self.entry(expect!(self.call(caller, op).await?, Lookup))
            .await
    }

    /// FORGET (and each item of BATCH_FORGET). The change is noted under the table's lock, so
    /// that it reaches the write-ahead before a later lookup's of the same node.
    pub fn forget(&self, node: u64, count: u64) {
        let mut nodes = lock(&self.nodes);
        if nodes.forget(node, count) {
            self.note(vec![TableChange::Forgotten { node }]);
        }
    }

    /// Sends the attribute request `op(handle)`. A file that is open but has no name left
    /// (unlinked while open) is only reachable through an open handle, and the kernel sends
    /// `fstat`, `fchmod` and the like without one: on `ESTALE` the request is sent again (call
    /// index 1) with the lowest handle this mount holds for the file. The worker refuses
    /// `ESTALE` before it changes anything, so the second call is safe.
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
                    Some(handle) => self.call_at(caller, 1, op(Some(handle))).await,
                    None => Err(error),
                }
            }
            other => other,
        }
    }

    /// GETATTR.
    pub async fn getattr(&self, caller: Caller, node: u64, fh: Option<u64>) -> Result<Stat, Error> {
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
        set: SetAttrs,
    ) -> Result<Stat, Error> {
        let file = self.file(node)?;
        let time = |t: Option<SetTime>| {
            t.map(|t| v1::SetTime {
                time: Some(match t {
                    SetTime::At(at) => set_time::Time::At(timestamp(at)),
                    SetTime::Now => set_time::Time::Now(true),
                }),
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
    pub async fn readlink(&self, caller: Caller, node: u64) -> Result<Bytes, Error> {
        let file = self.file(node)?;
        let op = Op::Readlink(v1::ReadlinkRequest {
            file: Some(file.into()),
        });
        let reply = expect!(self.call(caller, op).await?, Readlink);
        Ok(Bytes::from(reply.target))
    }

    /// SYMLINK.
    pub async fn symlink(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<Entry, Error> {
        let parent = self.file(parent)?;
        let op = Op::Symlink(v1::SymlinkRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
            target: target.as_bytes().to_vec(),
            caller: Self::caller_of(caller),
        });
        self.entry(expect!(self.call(caller, op).await?, Symlink))
            .await
    }

    /// MKNOD. The kernel has applied the umask already.
    pub async fn mknod(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<Entry, Error> {
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
            .await
    }

    /// MKDIR.
    pub async fn mkdir(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<Entry, Error> {
        let parent = self.file(parent)?;
        let op = Op::Mkdir(v1::MkdirRequest {
            parent: Some(parent.into()),
            name: name.as_bytes().to_vec(),
            mode,
            umask,
            caller: Self::caller_of(caller),
        });
        self.entry(expect!(self.call(caller, op).await?, Mkdir))
            .await
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
    ) -> Result<Entry, Error> {
        let (file, new_parent) = (self.file(node)?, self.file(new_parent)?);
        let op = Op::Link(v1::LinkRequest {
            file: Some(file.into()),
            new_parent: Some(new_parent.into()),
            new_name: new_name.as_bytes().to_vec(),
        });
        self.entry(expect!(self.call(caller, op).await?, Link))
            .await
    }

    /// STATFS.
    pub async fn statfs(&self, caller: Caller) -> Result<StatFs, Error> {
        let reply = self.call(caller, Op::Statfs(v1::StatfsRequest {})).await?;
        Self::stat_fs(reply)
    }

    /// The volume's usage, asked for no kernel request (a random request ID): for the node's
    /// volume statistics.
    pub async fn volume_statfs(&self) -> Result<StatFs, Error> {
        let reply = self
            .send(None, None, Op::Statfs(v1::StatfsRequest {}))
            .await?;
        Self::stat_fs(reply)
    }

    fn stat_fs(reply: ReplyResult) -> Result<StatFs, Error> {
        let reply = expect!(reply, Statfs);
        Ok(StatFs {
            blocks: reply.blocks,
            blocks_free: reply.blocks_free,
            blocks_available: reply.blocks_available,
            files: reply.files,
            files_free: reply.files_free,
            block_size: reply.block_size,
            name_max: reply.name_max,
            fragment_size: reply.fragment_size,
        })
    }
}

/// The node ID the kernel uses for the volume root.
pub const ROOT_NODE: u64 = ROOT_INO;
