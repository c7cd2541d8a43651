//! Open handles: opening, creating, closing, their renewal on the workers, and the mount's
//! state as data.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

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
/// flags), and the connection's nonce. A process taking over a live FUSE connection needs
/// exactly this to answer requests that name them, under the request IDs the previous owner
/// would have used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountState {
    /// The connection's nonce.
    pub nonce: ConnectionNonce,
    /// The nodes, root included, in node ID order.
    pub nodes: Vec<NodeState>,
    /// The open handles, in handle order.
    pub handles: Vec<HandleState>,
}

impl<S: FileService> Fs<S> {
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

    /// Keeps the handle kernel request `caller` opened; the change to write ahead.
    fn opened(
        &self,
        caller: Caller,
        file: FileId,
        flags: u32,
        handle: u64,
        lease_ms: u64,
    ) -> TableChange {
        lock(&self.handles).insert(handle, OpenFile { file, flags });
        if lease_ms > 0 {
            *lock(&self.handle_lease) = Some(Duration::from_millis(lease_ms));
        }
        TableChange::Opened {
            handle: HandleState {
                handle,
                file,
                flags,
            },
            unique: caller.unique,
        }
    }

    /// OPEN: every file is opened for direct I/O. An open that truncates (`O_TRUNC`: the
    /// kernel truncates through the open and sends no kill request of its own) names its
    /// caller, so that the worker drops the file's privileges as a truncation does.
    pub async fn open(&self, caller: Caller, node: u64, flags: u32) -> Result<Opened, Error> {
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
        let opened = self.opened(caller, file, flags, reply.handle, reply.handle_lease_ms);
        self.write_ahead(vec![opened]).await;
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
        let opened = self.opened(caller, file, flags, reply.handle, reply.handle_lease_ms);
        self.write_ahead(node.into_iter().chain([opened]).collect())
            .await;
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
