//! Reads and writes: one kernel request split into calls of `FsConfig::call_data_bytes`, several
//! in flight, reassembled in order; appending writes and writes that must drop set-ID bits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt as _;
use lease_client::protocol::MAX_DATA_BYTES;
use lease_client::v1;
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;

use super::{Caller, Fs, FsConfig, lock};
use crate::error::Error;
use crate::service::FileService;

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

/// How many calls of one read or write may be in flight at once.
pub const PARALLEL_CALLS: usize = 8;

impl FsConfig {
    pub(super) fn part_size(&self) -> usize {
        self.call_data_bytes.clamp(4 << 10, MAX_DATA_BYTES)
    }
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

/// The bytes a write call's result says were written; `None` for a result of another kind
/// than the call (`write_kill_suidgid` when `kill_suidgid`, else `write`).
fn written_by(result: &ReplyResult, kill_suidgid: bool) -> Option<usize> {
    match (result, kill_suidgid) {
        (ReplyResult::Write(reply), false) | (ReplyResult::WriteKillSuidgid(reply), true) => {
            Some(reply.written as usize)
        }
        _ => None,
    }
}

impl<S: FileService> Fs<S> {
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
    ) -> Result<Bytes, Error> {
        let file = self.file(node)?;
        self.not_interrupted(caller)?;
        let part = self.config.part_size();
        let calls = (0..size as usize)
            .step_by(part)
            .zip(0..)
            .map(|(start, index)| {
                let len = part.min(size as usize - start);
                let op = Op::Read(v1::ReadRequest {
                    file: Some(file.into()),
                    handle: fh,
                    offset: offset.saturating_add(start as u64),
                    size: len as u32,
                });
                async move { (len, self.send_for(caller, index, None, op).await) }
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
        Ok(concat(parts))
    }

    /// WRITE: one call per [`FsConfig::call_data_bytes`], several in flight, each run to its
    /// outcome once sent; after a part fails or comes back short, no further part starts.
    /// It answers the count of bytes before the first part that failed or was short, and is
    /// an error when that is the first part; parts sent after it may have been written too (no
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
    ) -> Result<u32, Error> {
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
        // No part starts later than one call budget after the first (see `FsConfig`).
        let last_start = Instant::now() + self.config.call_budget;
        let calls = (0..data.len()).step_by(part).zip(0..).map(|(start, index)| async move {
            let chunk = &data[start..data.len().min(start + part)];
            if stopped.load(Ordering::Acquire) || (index > 0 && Instant::now() >= last_start) {
                return (chunk.len(), None);
            }
            // Copied out of the request's buffer when the call starts, so the connection encrypts
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
            let reply = match self.may_send(caller, &op) {
                Ok(until) => self.send_for(caller, index, until, op).await,
                Err(late) => Err(late),
            };
            let whole = matches!(&reply, Ok(result) if written_by(result, flags.kill_suidgid) == Some(chunk.len()));
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
                Some(Ok(reply)) => written_by(&reply, flags.kill_suidgid)
                    .ok_or(Error::malformed("write", "it answers another operation"))?,
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
        Ok(u32::try_from(written).unwrap_or(u32::MAX))
    }
}
