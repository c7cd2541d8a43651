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
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use lease_client::protocol::{FileId, ROOT_INO};
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;
use lease_client::v1::{self, set_time};

use crate::attr::{file_attr, timestamp};
use crate::error::Error;
use crate::nodes::Nodes;
use crate::reply::{Entry, SetAttrs, Stat, StatFs, Timestamp};
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
mod io;
#[cfg(test)]
mod tests;

pub use dir::PlusListing;
use handles::OpenFile;
pub use handles::{HandleState, MountState};
pub use io::{FUSE_WRITE_KILL_SUIDGID, PARALLEL_CALLS, WriteFlags};

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

    /// A filesystem that serves a connection another `Fs` served before: it takes over the
    /// nodes (with their lookup counts) and open handles of `state`, that `Fs`'s
    /// [`Fs::state`] at the moment it stopped serving. The handles are renewed from the next
    /// renewal on ([`Fs::run_handle_renewal`]).
    pub fn with_state(service: S, config: FsConfig, state: &MountState) -> Self {
        let fs = Fs::new(service, config);
        *lock(&fs.nodes) = Nodes::restore(config.root_generation, &state.nodes);
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

    /// How many nodes the kernel holds (the root included).
    pub fn node_count(&self) -> usize {
        lock(&self.nodes).len()
    }

    pub(super) fn file(&self, node: u64) -> Result<FileId, Error> {
        lock(&self.nodes)
            .file(node)
            .ok_or(Error::StaleNode { node })
    }

    /// Sends `op` on behalf of `caller`, unless the kernel interrupted the request before it
    /// could be sent. Once sent, a call runs to its outcome: an `EINTR` after sending would
    /// invite the application to repeat a mutation under a new request ID.
    pub(super) async fn call(&self, caller: Caller, op: Op) -> Result<ReplyResult, Error> {
        self.not_interrupted(caller)?;
        self.send(op).await
    }

    /// `EINTR` if the kernel interrupted `caller`'s request (which is then forgotten).
    pub(super) fn not_interrupted(&self, caller: Caller) -> Result<(), Error> {
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
    pub(super) async fn send(&self, op: Op) -> Result<ReplyResult, Error> {
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

    pub(super) fn entry(&self, entry: v1::Entry) -> Result<Entry, Error> {
        let (Some(file), Some(attr)) = (entry.file, entry.attr) else {
            return Err(Error::malformed("entry", "no file or no attributes"));
        };
        let file = FileId::from(file);
        lock(&self.nodes).looked_up(file);
        Ok(Entry {
            attr: file_attr(file.ino, &attr),
            generation: file.inode_generation,
            ttl: TTL,
        })
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
    }

    /// FORGET (and each item of BATCH_FORGET).
    pub fn forget(&self, node: u64, count: u64) {
        lock(&self.nodes).forget(node, count);
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
        let time = |t: Option<Timestamp>| {
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
    }

    /// STATFS.
    pub async fn statfs(&self, caller: Caller) -> Result<StatFs, Error> {
        let reply = expect!(
            self.call(caller, Op::Statfs(v1::StatfsRequest {})).await?,
            Statfs
        );
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
