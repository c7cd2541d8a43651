//! Open handles: opening, creating, closing, their renewal on the workers, and the mount's
//! state as data.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use fuse_wire::Unique;
use lease_client::protocol::FileId;
use lease_client::v1;
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;

use super::{Caller, ConnectionNonce, FOPEN_DIRECT_IO, Fs, TableChange, lock};
use crate::error::Error;
use crate::nodes::NodeState;
use crate::reply::{Created, Opened};
use crate::service::FileService;

/// A worker handle this mount holds: its file and the flags it was opened with.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpenFile {
    pub(super) file: FileId,
    pub(super) flags: u32,
}

/// One open handle the kernel holds (or may hold), as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleState {
    /// The FUSE file handle, which is the worker's handle.
    pub handle: u64,
    /// The file it is open on.
    pub file: FileId,
    /// The `open(2)` flags it was opened with.
    pub flags: u32,
    /// While the reply that hands the handle to the kernel is not known to have reached it:
    /// the ID of the kernel request (an OPEN or CREATE) that opened it, without its resend and
    /// interrupt bits. `None` once the kernel took the reply.
    ///
    /// An owner that dies between opening a handle and replying leaves the request to be
    /// resent to its successor, which repeats the open (the worker answers from its reply
    /// cache, with the same handle) and hands the handle over, or, if the repeat fails,
    /// releases the handle: nobody else holds it. An entry whose request is never resent was
    /// delivered (a request is resent unless its reply reached the kernel) and is kept.
    pub opened_by: Option<u64>,
}

/// What the kernel holds of a mounted volume, as data rather than private fields: every node
/// (with its inode generation and lookup count) and every open handle (with its file and open
/// flags), and the connection's nonce. A process taking over a live FUSE connection needs
/// exactly this to answer requests that name them, under the request IDs the previous owner
/// would have used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountState {
    /// The connection's nonce.
    pub nonce: ConnectionNonce,
    /// The nodes, root included, in node ID order.
    pub nodes: Vec<NodeState>,
    /// The open handles, in handle order, with those not known to be delivered yet.
    pub handles: Vec<HandleState>,
}

impl<S: FileService> Fs<S> {
    /// The nodes and open handles the kernel holds, as data.
    pub fn state(&self) -> MountState {
        let nodes = lock(&self.nodes).snapshot();
        let opened_by: HashMap<u64, u64> = lock(&self.undelivered)
            .iter()
            .map(|(&request, &handle)| (handle, request))
            .collect();
        let mut handles: Vec<HandleState> = lock(&self.handles)
            .iter()
            .map(|(&handle, open)| HandleState {
                handle,
                file: open.file,
                flags: open.flags,
                opened_by: opened_by.get(&handle).copied(),
            })
            .collect();
        handles.sort_unstable_by_key(|h| h.handle);
        MountState {
            nonce: self.nonce,
            nodes,
            handles,
        }
    }

    /// How many handles are open.
    pub fn open_handles(&self) -> usize {
        lock(&self.handles).len()
    }

    /// An open handle of `file`, for a request about a file that the kernel names without one.
    /// The lowest, so that the choice is the same whoever serves the request.
    pub(super) fn open_handle_of(&self, file: FileId) -> Option<u64> {
        lock(&self.handles)
            .iter()
            .filter(|(_, open)| open.file == file)
            .map(|(handle, _)| *handle)
            .min()
    }

    /// Keeps the handle kernel request `caller` opened, undelivered until the kernel takes
    /// the reply ([`Fs::replied`]); the change to write ahead, and a handle the same request
    /// opened under an owner that died, when the repeat got another (nobody holds that one).
    fn opened(
        &self,
        caller: Caller,
        file: FileId,
        flags: u32,
        handle: u64,
        lease_ms: u64,
    ) -> (TableChange, Option<u64>) {
        let request = Unique(caller.unique).id();
        lock(&self.handles).insert(handle, OpenFile { file, flags });
        let orphan = lock(&self.undelivered)
            .insert(request, handle)
            .filter(|&earlier| earlier != handle);
        if lease_ms > 0 {
            *lock(&self.handle_lease) = Some(Duration::from_millis(lease_ms));
        }
        let change = TableChange::Opened {
            handle: HandleState {
                handle,
                file,
                flags,
                opened_by: Some(request),
            },
        };
        (change, orphan)
    }

    /// The kernel took (`delivered`) or refused the reply to request `unique`. A handle the
    /// reply carried is noted delivered; one the kernel refused stays undelivered: the
    /// request may come again (resent), and it settles the handle then.
    pub fn replied(&self, unique: u64, delivered: bool) {
        if !delivered {
            return;
        }
        let handle = lock(&self.undelivered).remove(&Unique(unique).id());
        if let Some(handle) = handle {
            self.note(vec![TableChange::Delivered { handle }]);
        }
    }

    /// After an OPEN or CREATE failed: a handle the same request opened under an owner that
    /// died (the request was resent) is held by nobody, and is released.
    async fn open_failed(&self, caller: Caller) {
        let unique = Unique(caller.unique);
        if !unique.is_resend() {
            return;
        }
        let orphan = lock(&self.undelivered).remove(&unique.id());
        if let Some(handle) = orphan {
            self.release_orphan(handle).await;
        }
    }

    /// Releases a handle that was opened for the kernel but never reached it.
    async fn release_orphan(&self, handle: u64) {
        let open = {
            let mut handles = lock(&self.handles);
            let open = handles.remove(&handle);
            if open.is_some() {
                self.note(vec![TableChange::Released { handle }]);
            }
            open
        };
        let Some(open) = open else { return };
        tracing::info!(
            handle,
            ino = open.file.ino,
            "releasing a handle whose opening request never reached the kernel"
        );
        // Made for no kernel request: a random request ID.
        let op = Op::Release(v1::ReleaseRequest {
            file: Some(open.file.into()),
            handle,
            flags: open.flags,
        });
        if let Err(error) = self.send(None, None, op).await {
            // The worker drops it when its handle lease ends, as it would have without this.
            crate::error::report("release", &error);
        }
    }

    /// After the worker opened `handle` for `caller`: keeps it and writes it ahead; releases a
    /// handle an earlier owner opened for the same request, if the repeat got another.
    async fn keep_opened(
        &self,
        caller: Caller,
        file: FileId,
        flags: u32,
        (handle, lease_ms): (u64, u64),
        node: Option<TableChange>,
    ) {
        let (opened, orphan) = self.opened(caller, file, flags, handle, lease_ms);
        if let Some(orphan) = orphan {
            self.release_orphan(orphan).await;
        }
        self.write_ahead(node.into_iter().chain([opened]).collect())
            .await;
    }

    /// OPEN: every file is opened for direct I/O. An open that truncates (`O_TRUNC`: the
    /// kernel truncates through the open and sends no kill request of its own) names its
    /// caller, so that the worker drops the file's privileges as a truncation does.
    pub async fn open(&self, caller: Caller, node: u64, flags: u32) -> Result<Opened, Error> {
        let opened = self.open_file(caller, node, flags).await;
        if opened.is_err() {
            self.open_failed(caller).await;
        }
        opened
    }

    async fn open_file(&self, caller: Caller, node: u64, flags: u32) -> Result<Opened, Error> {
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
        let handle = (reply.handle, reply.handle_lease_ms);
        self.keep_opened(caller, file, flags, handle, None).await;
        Ok(Opened {
            handle: reply.handle,
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
    ) -> Result<Created, Error> {
        let created = self.create_file(caller, parent, name, mode, flags).await;
        if created.is_err() {
            self.open_failed(caller).await;
        }
        created
    }

    async fn create_file(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: u32,
    ) -> Result<Created, Error> {
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
        let (entry, node) =
            self.counted_entry(reply.entry.ok_or(Error::malformed("create", "no entry"))?)?;
        let file = FileId {
            ino: entry.attr.ino,
            inode_generation: entry.generation,
        };
        let handle = (reply.handle, reply.handle_lease_ms);
        self.keep_opened(caller, file, flags, handle, node).await;
        Ok(Created {
            entry,
            opened: Opened {
                handle: reply.handle,
                flags: FOPEN_DIRECT_IO,
            },
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
        let open = {
            // Noted under the table's lock: in order with a later open's record.
            let mut handles = lock(&self.handles);
            let open = handles.remove(&fh);
            if open.is_some() {
                self.note(vec![TableChange::Released { handle: fh }]);
            }
            open
        };
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

    /// Renews every open handle in one call and forgets those the worker says expired.
    /// Returns how long to wait before the next renewal (a third of the handle lease).
    pub async fn renew_handles(&self) -> Result<Duration, Error> {
        let handles: Vec<u64> = lock(&self.handles).keys().copied().collect();
        let default = self.config.default_handle_renewal;
        if handles.is_empty() {
            return Ok(lock(&self.handle_lease).map_or(default, |lease| lease / 3));
        }
        // Made for no kernel request: a random request ID.
        let op = Op::RenewHandles(v1::RenewHandlesRequest { handles });
        let reply = expect!(self.send(None, None, op).await?, RenewHandles);
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

    /// Renews open handles for as long as the future is polled. Handles taken over from
    /// another process ([`Fs::with_state`]) are renewed at once: their lease runs from that
    /// process's last renewal.
    pub async fn run_handle_renewal(&self) {
        let mut wait = match self.open_handles() {
            0 => self.config.default_handle_renewal,
            _ => Duration::ZERO,
        };
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
