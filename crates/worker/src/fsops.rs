//! The file operations, acting on the volume's backing directory.
//!
//! Every operation starts from a file the worker named (opened by handle, see
//! [`crate::inode`]) and acts relative to that descriptor with one validated name: no path is
//! walked, no symbolic link is followed (`O_NOFOLLOW` everywhere, and link targets are stored
//! verbatim and never resolved by the worker), and `.`/`..` are refused, so nothing outside
//! the volume is reachable.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileExt as _;

use bytes::Bytes;
use rustix::fs::{AtFlags, Mode, OFlags, Stat};
use worker_proto::MAX_DATA_BYTES;
use worker_proto::v1;
use worker_proto::v1::reply::Result as Done;

use crate::inode::{Ident, InodeTable};
use crate::volume::Volume;

/// Why an operation produced no result.
#[derive(Debug)]
pub(crate) enum OpError {
    /// The filesystem refused: a Linux errno.
    Errno(i32),
    /// The request is malformed in a way only the operation can tell.
    Invalid(&'static str),
    /// The journal could not be written: the volume's durable state is unknown.
    Journal(io::Error),
}

impl From<io::Error> for OpError {
    fn from(error: io::Error) -> Self {
        Self::Errno(error.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<rustix::io::Errno> for OpError {
    fn from(errno: rustix::io::Errno) -> Self {
        Self::Errno(errno.raw_os_error())
    }
}

type OpResult = Result<Done, OpError>;

/// The longest name a directory entry may have.
const NAME_MAX: usize = 255;
/// The longest symbolic link target.
const TARGET_MAX: usize = 4095;
/// The most entries one readdir reply carries.
const READDIR_MAX: usize = 1024;
/// The `open(2)` flags a client may pass through; creation and path flags are the worker's.
const OPEN_FLAGS: u32 = (libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_TRUNC
    | libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_NOATIME
    | libc::O_DIRECTORY) as u32;

/// What the privilege rule of [`kill_suidgid`] knows of whoever truncates a file by opening it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opener {
    /// Taken to hold CAP_FSETID: uid 0 (FUSE does not say whether an opener holds the
    /// capability, so this is an approximation).
    Privileged,
    /// Any other opener, with its group when the request names it (a plain `open` does not:
    /// such an opener counts as outside the file's group).
    Unprivileged(Option<u32>),
}

impl Opener {
    fn of(caller: Option<&v1::Caller>) -> Self {
        match caller {
            Some(caller) if caller.uid == 0 => Opener::Privileged,
            caller => Opener::Unprivileged(caller.map(|caller| caller.gid)),
        }
    }
}

/// The permission bits a write or truncation by a writer without CAP_FSETID leaves on a
/// regular file of mode `mode` owned by group `file_gid`, as Linux decides it for a local file
/// system: set-user-ID is cleared; set-group-ID is cleared when the group-execute bit is set or
/// the writer's group (`writer_gid`; `None` when unknown) is not the file's. Supplementary
/// groups are not known, so membership through one counts as outside (the conservative side).
pub(crate) fn mode_after_unprivileged_write(
    mode: u32,
    file_gid: u32,
    writer_gid: Option<u32>,
) -> u32 {
    let mut kept = mode & 0o7777;
    kept &= !libc::S_ISUID;
    if kept & libc::S_ISGID != 0 && (kept & libc::S_IXGRP != 0 || writer_gid != Some(file_gid)) {
        kept &= !libc::S_ISGID;
    }
    kept
}

/// Drops the set-user-ID and set-group-ID bits of the regular file `fd` as a write by an
/// unprivileged writer of group `writer_gid` does ([`mode_after_unprivileged_write`]); other
/// files and files without the bits are left alone, unchanged and unwritten.
fn kill_suidgid(fd: BorrowedFd<'_>, writer_gid: Option<u32>) -> Result<(), OpError> {
    let stat = rustix::fs::fstat(fd)?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    let kept = mode_after_unprivileged_write(stat.st_mode, stat.st_gid, writer_gid);
    if kept != stat.st_mode & 0o7777 {
        // Through /proc: `fd` may be an O_PATH descriptor, which fchmod(2) refuses.
        rustix::fs::chmodat(
            rustix::fs::CWD,
            proc_path(fd),
            Mode::from_raw_mode(kept),
            AtFlags::empty(),
        )?;
    }
    Ok(())
}

fn ident(file: Option<&v1::FileId>) -> Result<Ident, OpError> {
    let file = file.ok_or(OpError::Invalid("a file ID is missing"))?;
    Ok(Ident {
        ino: file.ino,
        generation: file.inode_generation,
    })
}

fn file_id(id: Ident) -> v1::FileId {
    v1::FileId {
        ino: id.ino,
        inode_generation: id.generation,
    }
}

/// Checks a name for one directory entry and returns it as a path component.
fn name(bytes: &[u8]) -> Result<&OsStr, OpError> {
    if bytes.is_empty() || bytes == b"." || bytes == b".." {
        return Err(OpError::Errno(libc::EINVAL));
    }
    if bytes.len() > NAME_MAX {
        return Err(OpError::Errno(libc::ENAMETOOLONG));
    }
    if bytes.iter().any(|&b| b == b'/' || b == 0) {
        return Err(OpError::Errno(libc::EINVAL));
    }
    Ok(OsStr::from_bytes(bytes))
}

fn timestamp(sec: i64, nsec: u64) -> v1::Timestamp {
    v1::Timestamp {
        sec,
        nsec: u32::try_from(nsec).unwrap_or(0),
    }
}

pub(crate) fn attr(stat: &Stat) -> v1::Attr {
    v1::Attr {
        mode: stat.st_mode,
        nlink: u32::try_from(stat.st_nlink).unwrap_or(u32::MAX),
        uid: stat.st_uid,
        gid: stat.st_gid,
        size: u64::try_from(stat.st_size).unwrap_or(0),
        blocks: u64::try_from(stat.st_blocks).unwrap_or(0),
        atime: Some(timestamp(stat.st_atime, stat.st_atime_nsec)),
        mtime: Some(timestamp(stat.st_mtime, stat.st_mtime_nsec)),
        ctime: Some(timestamp(stat.st_ctime, stat.st_ctime_nsec)),
        rdev: stat.st_rdev,
        blksize: u32::try_from(stat.st_blksize).unwrap_or(4096),
    }
}

fn proc_path(fd: BorrowedFd<'_>) -> String {
    use std::os::fd::AsRawFd as _;
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

fn is_dir(stat: &Stat) -> bool {
    stat.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn is_symlink(stat: &Stat) -> bool {
    stat.st_mode & libc::S_IFMT == libc::S_IFLNK
}

fn set_time(time: Option<&v1::SetTime>) -> rustix::fs::Timespec {
    match time.and_then(|t| t.time.as_ref()) {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(v1::set_time::Time::Now(_)) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(v1::set_time::Time::At(at)) => rustix::fs::Timespec {
            tv_sec: at.sec,
            tv_nsec: i64::from(at.nsec.min(999_999_999)),
        },
    }
}

impl Volume {
    fn path_fd(&self, id: Ident) -> Result<OwnedFd, OpError> {
        Ok(self.inodes.open(id, OFlags::PATH)?)
    }

    fn dir_fd(&self, file: Option<&v1::FileId>) -> Result<OwnedFd, OpError> {
        Ok(self
            .inodes
            .open(ident(file)?, OFlags::PATH | OFlags::DIRECTORY)?)
    }

    /// Names and describes the file `fd` refers to.
    fn entry(&mut self, fd: BorrowedFd<'_>) -> Result<v1::Entry, OpError> {
        let stat = rustix::fs::fstat(fd)?;
        let id = identify(&mut self.inodes, &mut self.meta, fd, &stat)?;
        Ok(v1::Entry {
            file: Some(file_id(id)),
            attr: Some(attr(&stat)),
        })
    }

    /// The file `id` names, to read or change its attributes: by its inode while it has a
    /// name (`true`), else through its open handle `handle` (`false`), because a file that is
    /// open but has no link left is no longer in the inode table, yet still has attributes.
    fn attr_fd(&self, id: Ident, handle: Option<u64>) -> Result<(OwnedFd, bool), OpError> {
        match self.path_fd(id) {
            Err(OpError::Errno(libc::ESTALE)) => {
                let open = handle
                    .and_then(|h| self.handles.get(h, id))
                    .ok_or(OpError::Errno(libc::ESTALE))?;
                Ok((open.file.as_fd().try_clone_to_owned()?, false))
            }
            other => Ok((other?, true)),
        }
    }

    /// Describes the file `id` that `fd` refers to; a file without a name keeps its identity
    /// (naming it again would record a new inode generation for a file about to vanish).
    fn entry_of(
        &mut self,
        id: Ident,
        fd: BorrowedFd<'_>,
        named: bool,
    ) -> Result<v1::Entry, OpError> {
        if named {
            return self.entry(fd);
        }
        Ok(v1::Entry {
            file: Some(file_id(id)),
            attr: Some(attr(&rustix::fs::fstat(fd)?)),
        })
    }

    fn entry_at(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<v1::Entry, OpError> {
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        self.entry(fd.as_fd())
    }

    /// Gives a file just created in `dir` as `name` its caller's ownership and exactly the
    /// permission bits `mode` (the client's umask already applied), then describes it.
    ///
    /// The worker creates as root under its own process umask, which would strip bits the
    /// client asked for, and a chown clears set-user-ID and set-group-ID: so ownership first,
    /// then the mode. In a set-group-ID directory the file keeps the directory's group (and a
    /// new directory the set-group-ID bit), as the kernel gave them. Whether a caller outside
    /// that group may create a set-group-ID executable is the client's kernel's decision (it
    /// strips the bit before sending, knowing the caller's supplementary groups, which the
    /// worker does not).
    fn finish_new(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        mode: u32,
        caller: Option<&v1::Caller>,
    ) -> Result<v1::Entry, OpError> {
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let parent = rustix::fs::fstat(dir)?;
        let inherits_group = parent.st_mode & libc::S_ISGID != 0;
        let stat = rustix::fs::fstat(&fd)?;
        if let Some(caller) = caller {
            rustix::fs::chownat(
                &fd,
                c"",
                Some(rustix::fs::Uid::from_raw(caller.uid)),
                (!inherits_group).then(|| rustix::fs::Gid::from_raw(caller.gid)),
                AtFlags::EMPTY_PATH,
            )?;
        }
        if !is_symlink(&stat) {
            let mut want = mode & 0o7777;
            if inherits_group && is_dir(&stat) {
                want |= libc::S_ISGID;
            }
            rustix::fs::chmodat(
                rustix::fs::CWD,
                proc_path(fd.as_fd()),
                Mode::from_raw_mode(want),
                AtFlags::empty(),
            )?;
        }
        self.entry(fd.as_fd())
    }

    /// Removes the entry `name` of `parent` (`unlinkat` with `flags`) and forgets its inode
    /// when that was its last link.
    fn remove(
        &mut self,
        parent: Option<&v1::FileId>,
        name_bytes: &[u8],
        flags: AtFlags,
    ) -> Result<(), OpError> {
        let dir = self.dir_fd(parent)?;
        let name = name(name_bytes)?;
        let victim = rustix::fs::openat(
            &dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        rustix::fs::unlinkat(&dir, name, flags)?;
        self.forget_if_unlinked(&victim);
        Ok(())
    }

    /// Forgets the inode behind `fd` when its last link is gone.
    fn forget_if_unlinked(&mut self, fd: &OwnedFd) {
        if let Ok(stat) = rustix::fs::fstat(fd)
            && stat.st_nlink == 0
        {
            let ino = self.inodes.worker_ino(stat.st_ino);
            self.inodes.forget(ino, &mut self.meta);
        }
    }

    fn handle_file(&self, file: Option<&v1::FileId>, handle: u64) -> Result<&File, OpError> {
        let id = ident(file)?;
        self.handles
            .get(handle, id)
            .map(|h| &h.file)
            .ok_or(OpError::Errno(libc::EBADF))
    }

    /// Runs one file operation (never a lease command) at lease time `at_ms`.
    pub(crate) fn file_op(&mut self, op: &v1::request::Op, at_ms: u64) -> OpResult {
        use v1::request::Op;
        match op {
            Op::Lookup(r) => {
                let dir = self.dir_fd(r.parent.as_ref())?;
                Ok(Done::Lookup(self.entry_at(&dir, name(&r.name)?)?))
            }
            Op::Getattr(r) => {
                let id = ident(r.file.as_ref())?;
                let (fd, named) = self.attr_fd(id, r.handle)?;
                Ok(Done::Getattr(self.entry_of(id, fd.as_fd(), named)?))
            }
            Op::Setattr(r) => self.setattr(r),
            Op::Mknod(r) => {
                let dir = self.dir_fd(r.parent.as_ref())?;
                let name = name(&r.name)?;
                let kind = rustix::fs::FileType::from_raw_mode(r.mode);
                let perm = r.mode & !r.umask & 0o7777;
                rustix::fs::mknodat(&dir, name, kind, Mode::from_raw_mode(perm), r.rdev)?;
                Ok(Done::Mknod(self.finish_new(
                    &dir,
                    name,
                    perm,
                    r.caller.as_ref(),
                )?))
            }
            Op::Create(r) => self.create(r, at_ms),
            Op::Mkdir(r) => {
                let dir = self.dir_fd(r.parent.as_ref())?;
                let name = name(&r.name)?;
                let perm = r.mode & !r.umask & 0o7777;
                rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(perm))?;
                Ok(Done::Mkdir(self.finish_new(
                    &dir,
                    name,
                    perm,
                    r.caller.as_ref(),
                )?))
            }
            Op::Unlink(r) => {
                self.remove(r.parent.as_ref(), &r.name, AtFlags::empty())?;
                Ok(Done::Unlink(v1::Empty {}))
            }
            Op::Rmdir(r) => {
                self.remove(r.parent.as_ref(), &r.name, AtFlags::REMOVEDIR)?;
                Ok(Done::Rmdir(v1::Empty {}))
            }
            Op::Rename(r) => {
                let flags = rustix::fs::RenameFlags::from_bits(r.flags)
                    .filter(|f| {
                        (rustix::fs::RenameFlags::NOREPLACE | rustix::fs::RenameFlags::EXCHANGE)
                            .contains(*f)
                    })
                    .ok_or(OpError::Errno(libc::EINVAL))?;
                let from = self.dir_fd(r.parent.as_ref())?;
                let to = self.dir_fd(r.new_parent.as_ref())?;
                let old_name = name(&r.name)?;
                let new_name = name(&r.new_name)?;
                let replaced = rustix::fs::openat(
                    &to,
                    new_name,
                    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .ok();
                rustix::fs::renameat_with(&from, old_name, &to, new_name, flags)?;
                if let Some(replaced) = replaced {
                    self.forget_if_unlinked(&replaced);
                }
                Ok(Done::Rename(v1::Empty {}))
            }
            Op::Link(r) => {
                let fd = self.path_fd(ident(r.file.as_ref())?)?;
                let dir = self.dir_fd(r.new_parent.as_ref())?;
                let new_name = name(&r.new_name)?;
                rustix::fs::linkat(&fd, c"", &dir, new_name, AtFlags::EMPTY_PATH)?;
                Ok(Done::Link(self.entry(fd.as_fd())?))
            }
            Op::Symlink(r) => {
                let dir = self.dir_fd(r.parent.as_ref())?;
                let name = name(&r.name)?;
                if r.target.is_empty() || r.target.contains(&0) {
                    return Err(OpError::Errno(libc::EINVAL));
                }
                if r.target.len() > TARGET_MAX {
                    return Err(OpError::Errno(libc::ENAMETOOLONG));
                }
                rustix::fs::symlinkat(OsStr::from_bytes(&r.target), &dir, name)?;
                Ok(Done::Symlink(self.finish_new(
                    &dir,
                    name,
                    0o777,
                    r.caller.as_ref(),
                )?))
            }
            Op::Readlink(r) => {
                let fd = self.path_fd(ident(r.file.as_ref())?)?;
                let target = rustix::fs::readlinkat(&fd, c"", Vec::new())?;
                Ok(Done::Readlink(v1::ReadlinkReply {
                    target: target.into_bytes(),
                }))
            }
            Op::Readdir(r) => self.readdir(r),
            Op::Open(r) => Ok(Done::Open(self.open_handle(r, Opener::of(None), at_ms)?)),
            Op::OpenKillSuidgid(r) => {
                let (open, caller) =
                    r.open
                        .as_ref()
                        .zip(r.caller.as_ref())
                        .ok_or(OpError::Invalid(
                            "open_kill_suidgid needs an open and a caller",
                        ))?;
                Ok(Done::OpenKillSuidgid(self.open_handle(
                    open,
                    Opener::of(Some(caller)),
                    at_ms,
                )?))
            }
            Op::Read(r) => {
                let size = usize::try_from(r.size).unwrap_or(usize::MAX);
                if size > MAX_DATA_BYTES {
                    return Err(OpError::Invalid("a read is over the data limit"));
                }
                let file = self.handle_file(r.file.as_ref(), r.handle)?;
                let mut data = vec![0; size];
                let mut done = 0;
                while done < size {
                    let n =
                        file.read_at(&mut data[done..], r.offset.saturating_add(done as u64))?;
                    if n == 0 {
                        break;
                    }
                    done += n;
                }
                data.truncate(done);
                Ok(Done::Read(v1::ReadReply {
                    data: Bytes::from(data),
                }))
            }
            Op::Write(r) => Ok(Done::Write(self.write(r, None)?)),
            Op::WriteKillSuidgid(r) => {
                let (write, caller) =
                    r.write
                        .as_ref()
                        .zip(r.caller.as_ref())
                        .ok_or(OpError::Invalid(
                            "write_kill_suidgid needs a write and a caller",
                        ))?;
                Ok(Done::WriteKillSuidgid(self.write(write, Some(caller))?))
            }
            Op::Flush(r) => {
                self.handle_file(r.file.as_ref(), r.handle)?;
                Ok(Done::Flush(v1::Empty {}))
            }
            Op::Fsync(r) => {
                let file = self.handle_file(r.file.as_ref(), r.handle)?;
                if r.datasync {
                    file.sync_data()?;
                } else {
                    file.sync_all()?;
                }
                Ok(Done::Fsync(v1::Empty {}))
            }
            Op::Release(r) => {
                self.handles.remove(r.handle);
                Ok(Done::Release(v1::Empty {}))
            }
            Op::RenewHandles(r) => {
                let expires = at_ms.saturating_add(self.handle_lease_ms());
                let expired = r
                    .handles
                    .iter()
                    .copied()
                    .filter(|&h| !self.handles.renew(h, expires))
                    .collect();
                Ok(Done::RenewHandles(v1::RenewHandlesReply {
                    handle_lease_ms: self.handle_lease_ms(),
                    expired,
                }))
            }
            Op::Statfs(_) => {
                let st = rustix::fs::fstatvfs(self.inodes.root())?;
                Ok(Done::Statfs(v1::StatfsReply {
                    blocks: st.f_blocks,
                    blocks_free: st.f_bfree,
                    blocks_available: st.f_bavail,
                    files: st.f_files,
                    files_free: st.f_ffree,
                    block_size: u32::try_from(st.f_bsize).unwrap_or(4096),
                    name_max: u32::try_from(st.f_namemax).unwrap_or(255),
                    fragment_size: u32::try_from(st.f_frsize).unwrap_or(4096),
                }))
            }
            Op::ClaimMount(_) | Op::RenewMount(_) | Op::ReleaseMount(_) => {
                Err(OpError::Invalid("a lease command is not a file operation"))
            }
        }
    }

    /// Opens `file` for a new handle. An open with `O_TRUNC` first drops the file's
    /// privileges as `opener` calls for ([`kill_suidgid`]), then truncates.
    fn open_handle(
        &mut self,
        r: &v1::OpenRequest,
        opener: Opener,
        at_ms: u64,
    ) -> Result<v1::OpenReply, OpError> {
        let id = ident(r.file.as_ref())?;
        if r.flags & libc::O_TRUNC as u32 != 0
            && let Opener::Unprivileged(writer_gid) = opener
        {
            kill_suidgid(self.path_fd(id)?.as_fd(), writer_gid)?;
        }
        let flags = OFlags::from_bits_retain(r.flags & OPEN_FLAGS);
        let fd = self.inodes.open(id, flags)?;
        let expires = at_ms.saturating_add(self.handle_lease_ms());
        let handle = self.handles.insert(File::from(fd), id, r.flags, expires);
        Ok(v1::OpenReply {
            handle,
            handle_lease_ms: self.handle_lease_ms(),
        })
    }

    /// Writes through an open handle; for a writer without CAP_FSETID (`kill` names it) the
    /// file's privileges are dropped first, in this same step of the volume's order, so no
    /// reader ever sees the new data under the old set-user-ID mode.
    fn write(
        &mut self,
        r: &v1::WriteRequest,
        kill: Option<&v1::Caller>,
    ) -> Result<v1::WriteReply, OpError> {
        if r.data.len() > MAX_DATA_BYTES {
            return Err(OpError::Invalid("a write is over the data limit"));
        }
        let file = self.handle_file(r.file.as_ref(), r.handle)?;
        if let Some(caller) = kill {
            kill_suidgid(file.as_fd(), Some(caller.gid))?;
        }
        file.write_all_at(&r.data, r.offset)?;
        Ok(v1::WriteReply {
            written: u32::try_from(r.data.len()).unwrap_or(u32::MAX),
        })
    }

    fn setattr(&mut self, r: &v1::SetattrRequest) -> OpResult {
        let id = ident(r.file.as_ref())?;
        let (fd, named) = self.attr_fd(id, r.handle)?;
        let stat = rustix::fs::fstat(&fd)?;
        if let Some(mode) = r.mode
            && !is_symlink(&stat)
        {
            rustix::fs::chmodat(
                rustix::fs::CWD,
                proc_path(fd.as_fd()),
                Mode::from_raw_mode(mode & 0o7777),
                AtFlags::empty(),
            )?;
        }
        if r.uid.is_some() || r.gid.is_some() {
            rustix::fs::chownat(
                &fd,
                c"",
                r.uid.map(rustix::fs::Uid::from_raw),
                r.gid.map(rustix::fs::Gid::from_raw),
                AtFlags::EMPTY_PATH,
            )?;
        }
        if let Some(size) = r.size {
            if is_dir(&stat) {
                return Err(OpError::Errno(libc::EISDIR));
            }
            match r.handle.and_then(|h| self.handles.get(h, id)) {
                Some(open) if open.flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32 => {
                    open.file.set_len(size)?;
                }
                _ => {
                    let writable = self.inodes.open(id, OFlags::WRONLY)?;
                    rustix::fs::ftruncate(&writable, size)?;
                }
            }
        }
        if r.atime.is_some() || r.mtime.is_some() {
            let times = rustix::fs::Timestamps {
                last_access: set_time(r.atime.as_ref()),
                last_modification: set_time(r.mtime.as_ref()),
            };
            if is_symlink(&stat) {
                rustix::fs::utimensat(&fd, c"", &times, AtFlags::EMPTY_PATH)?;
            } else {
                rustix::fs::utimensat(
                    rustix::fs::CWD,
                    proc_path(fd.as_fd()),
                    &times,
                    AtFlags::empty(),
                )?;
            }
        }
        Ok(Done::Setattr(self.entry_of(id, fd.as_fd(), named)?))
    }

    fn create(&mut self, r: &v1::CreateRequest, at_ms: u64) -> OpResult {
        let dir = self.dir_fd(r.parent.as_ref())?;
        let name = name(&r.name)?;
        let existed = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok();
        // Made by another client since the kernel looked: truncating it is an open with
        // O_TRUNC, and drops privileges as one (with O_EXCL the open fails and changes nothing).
        if existed
            && r.flags & libc::O_TRUNC as u32 != 0
            && r.flags & libc::O_EXCL as u32 == 0
            && let Opener::Unprivileged(writer_gid) = Opener::of(r.caller.as_ref())
        {
            let fd = rustix::fs::openat(
                &dir,
                name,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            kill_suidgid(fd.as_fd(), writer_gid)?;
        }
        let flags = OFlags::from_bits_retain(
            r.flags & (libc::O_ACCMODE | libc::O_EXCL | libc::O_TRUNC | libc::O_APPEND) as u32,
        ) | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(
            &dir,
            name,
            flags,
            Mode::from_raw_mode(r.mode & !r.umask & 0o7777),
        )?;
        let entry = if existed {
            self.entry(fd.as_fd())?
        } else {
            self.finish_new(&dir, name, r.mode & !r.umask, r.caller.as_ref())?
        };
        let id = ident(entry.file.as_ref())?;
        let expires = at_ms.saturating_add(self.handle_lease_ms());
        let handle = self.handles.insert(File::from(fd), id, r.flags, expires);
        Ok(Done::Create(v1::CreateReply {
            entry: Some(entry),
            handle,
            handle_lease_ms: self.handle_lease_ms(),
        }))
    }

    /// A directory listing in cookie order. An entry's cookie is derived from its name alone
    /// ([`dir_cookie`]), so removing or adding other entries never moves it: a reader that
    /// unlinks as it lists resumes exactly after the last entry it saw.
    fn readdir(&mut self, r: &v1::ReaddirRequest) -> OpResult {
        let id = ident(r.dir.as_ref())?;
        let fd = self.inodes.open(id, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let limit = match usize::try_from(r.max_entries).unwrap_or(READDIR_MAX) {
            0 => READDIR_MAX,
            n => n.min(READDIR_MAX),
        };
        // A listing from the start scans the directory; the batches after it resume in the
        // names it found (`listing.rs`).
        let names = match self.listings.get(id) {
            Some(names) if r.offset != 0 => names,
            _ => self.listings.keep(id, scan(&fd)?),
        };
        let from = names.partition_point(|(cookie, _)| *cookie <= r.offset);
        let mut entries = Vec::new();
        let mut end = true;
        let mut iter = names[from..].iter().peekable();
        while let Some((cookie, raw)) = iter.next() {
            let (cookie, raw) = (*cookie, raw.to_vec());
            let child = match rustix::fs::openat(
                &fd,
                OsStr::from_bytes(&raw),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(child) => child,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let entry = self.entry(child.as_fd())?;
            let attr = entry.attr.unwrap_or_default();
            entries.push(v1::DirEntry {
                file: entry.file,
                name: raw,
                file_type: attr.mode & libc::S_IFMT,
                next_offset: cookie,
                attr: r.plus.then_some(attr),
            });
            // A batch never ends between two names of the same cookie (a hash collision), so
            // resuming after a cookie skips nothing.
            if entries.len() >= limit && iter.peek().is_some_and(|(next, _)| *next != cookie) {
                end = false;
                break;
            }
        }
        Ok(Done::Readdir(v1::ReaddirReply { entries, end }))
    }
}

/// The names in the directory `fd`, but `.` and `..`, with their cookies, in cookie order.
fn scan(fd: &OwnedFd) -> Result<Vec<crate::listing::Named>, OpError> {
    let mut names = Vec::new();
    let mut dir = rustix::fs::Dir::read_from(fd)?;
    while let Some(item) = dir.read() {
        let item = item?;
        let raw = item.file_name().to_bytes();
        if raw == b"." || raw == b".." {
            continue;
        }
        names.push((dir_cookie(raw), raw.into()));
    }
    names.sort_unstable();
    Ok(names)
}

/// The cookie of a directory entry: 62 bits of the SHA-256 of its name, plus one (0 means "from
/// the start"). Stable across restarts and upgrades, independent of other entries, and small
/// enough that a client may add a few offsets of its own (FUSE offsets are `i64`).
pub(crate) fn dir_cookie(name: &[u8]) -> u64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(name);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) >> 2) + 1
}

/// [`InodeTable::identify`] with journal failures told apart from filesystem errors.
fn identify(
    inodes: &mut InodeTable,
    meta: &mut crate::meta::MetaStore,
    fd: BorrowedFd<'_>,
    stat: &Stat,
) -> Result<Ident, OpError> {
    inodes.identify(fd, stat, meta)
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;
    use std::os::unix::fs::PermissionsExt;

    use rustix::fs::inotify;
    use worker_proto::v1;
    use worker_proto::v1::request::Op;
    use worker_proto::{
        AccessMode, ROOT_INO, ROOT_INODE_GENERATION, RequestId, decode_reply, decode_request,
        encode_request,
    };

    use super::{mode_after_unprivileged_write, name};
    use crate::config::VolumeSpec;
    use crate::volume::{Volume, VolumeOptions};
    use crate::{dedup, meta};

    #[test]
    fn an_unprivileged_write_keeps_set_group_id_only_without_group_execute_in_the_group() {
        // (mode, file's group, writer's group) -> what stays
        let cases = [
            (0o4777, 0, Some(7), 0o0777),
            (0o2777, 0, Some(7), 0o0777),
            (0o6777, 0, Some(7), 0o0777),
            (0o2767, 0, Some(7), 0o0767),
            (0o2767, 7, Some(7), 0o2767),
            (0o2777, 7, Some(7), 0o0777),
            (0o6767, 7, Some(7), 0o2767),
            (0o2767, 7, None, 0o0767),
            (0o0755, 0, Some(7), 0o0755),
            (0o1777, 0, None, 0o1777),
        ];
        for (mode, file_gid, writer_gid, kept) in cases {
            assert_eq!(
                mode_after_unprivileged_write(0o100_000 | mode, file_gid, writer_gid),
                kept,
                "{mode:o} of group {file_gid} written by {writer_gid:?}"
            );
        }
    }

    /// One volume of the reference worker on a temporary directory, driven through its apply
    /// step as the apply loop drives it.
    struct Applied {
        _state: tempfile::TempDir,
        volume: Volume,
        data: std::path::PathBuf,
        next_id: u8,
    }

    impl Applied {
        fn new() -> Self {
            let state = tempfile::tempdir().unwrap();
            let spec = VolumeSpec {
                volume_id: "v".into(),
                volume_generation: 1,
                access_mode: crate::AccessMode::Rwx,
            };
            let dir = meta::volume_dir(state.path(), &spec.volume_id);
            meta::create(&dir, &spec).unwrap();
            let options = VolumeOptions {
                lease_ms: 90_000,
                handle_lease_ms: 60_000,
                dedup_capacity: 64,
                dedup_retention_ms: 30_000,
                compact_after: 1000,
                reopen: crate::inode::reopen_for_tests(),
            };
            let volume = Volume::open(state.path(), &spec, options).unwrap();
            Applied {
                data: dir.join(meta::DATA),
                _state: state,
                volume,
                next_id: 0,
            }
        }

        fn apply(&mut self, op: Op) -> v1::reply::Result {
            self.next_id += 1;
            let body = encode_request(&v1::Request {
                volume_id: "v".into(),
                volume_generation: 1,
                request_id: RequestId([self.next_id; 16]).0.to_vec(),
                mount_epoch: Vec::new(),
                access_mode: AccessMode::Rwx.into(),
                op: Some(op),
            });
            let request = decode_request(&body[..]).unwrap();
            let (reply, _) = self.volume.apply(&request, dedup::digest(&body), 1);
            decode_reply(reply).unwrap().result.unwrap()
        }

        /// Makes the file `name` with `mode` on the backing disk and opens it for writing.
        fn open(&mut self, name: &str, mode: u32) -> (v1::FileId, u64) {
            std::fs::write(self.data.join(name), [b'.'; 64]).unwrap();
            std::fs::set_permissions(self.data.join(name), PermissionsExt::from_mode(mode))
                .unwrap();
            let parent = Some(v1::FileId {
                ino: ROOT_INO,
                inode_generation: ROOT_INODE_GENERATION,
            });
            let lookup = Op::Lookup(v1::LookupRequest {
                parent,
                name: name.as_bytes().to_vec(),
            });
            let v1::reply::Result::Lookup(entry) = self.apply(lookup) else {
                panic!("lookup of {name} failed");
            };
            let file = entry.file.unwrap();
            let open = Op::Open(v1::OpenRequest {
                file: Some(file),
                flags: libc::O_WRONLY as u32,
            });
            let v1::reply::Result::Open(open) = self.apply(open) else {
                panic!("open of {name} failed");
            };
            (file, open.handle)
        }

        fn mode(&self, name: &str) -> u32 {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata(self.data.join(name)).unwrap().mode() & 0o7777
        }
    }

    /// The attribute changes and modifications of the watched files, in the order they
    /// happened.
    fn changes(inotify_fd: &std::os::fd::OwnedFd) -> Vec<&'static str> {
        let mut buf = [MaybeUninit::uninit(); 4096];
        let mut events = inotify::Reader::new(inotify_fd, &mut buf);
        let mut seen = Vec::new();
        while let Ok(event) = events.next() {
            if event.events().contains(inotify::ReadFlags::ATTRIB) {
                seen.push("mode");
            }
            if event.events().contains(inotify::ReadFlags::MODIFY) {
                seen.push("data");
            }
        }
        seen
    }

    #[test]
    fn a_killing_write_changes_the_mode_before_the_data_in_one_apply_step() {
        if !test_support::requires_root(
            "a_killing_write_changes_the_mode_before_the_data_in_one_apply_step",
            "without CAP_FSETID the kernel itself clears set-ID bits on the worker's plain write",
        ) {
            return;
        }
        let mut volume = Applied::new();
        let watch =
            inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC).unwrap();
        let watched = inotify::WatchFlags::ATTRIB | inotify::WatchFlags::MODIFY;

        // A plain write (a writer with CAP_FSETID) changes the data only.
        let (file, handle) = volume.open("plain", 0o4777);
        inotify::add_watch(&watch, volume.data.join("plain"), watched).unwrap();
        let write = |data: &'static [u8]| v1::WriteRequest {
            file: Some(file),
            handle,
            offset: 0,
            data: bytes::Bytes::from_static(data),
            flags: 0,
        };
        let reply = volume.apply(Op::Write(write(b"root")));
        assert!(matches!(reply, v1::reply::Result::Write(w) if w.written == 4));
        assert_eq!(changes(&watch), ["data"]);
        assert_eq!(volume.mode("plain"), 0o4777);

        // A killing write: the mode first, then the data, both before the reply.
        let kill = Op::WriteKillSuidgid(v1::WriteKillSuidgidRequest {
            write: Some(write(b"user")),
            caller: Some(v1::Caller {
                uid: 1000,
                gid: 1000,
            }),
        });
        let reply = volume.apply(kill);
        assert!(matches!(reply, v1::reply::Result::WriteKillSuidgid(w) if w.written == 4));
        assert_eq!(changes(&watch), ["mode", "data"]);
        assert_eq!(volume.mode("plain"), 0o777);
        assert_eq!(
            &std::fs::read(volume.data.join("plain")).unwrap()[..4],
            b"user"
        );

        // A truncating open by a user: the mode, then the truncation. By uid 0: no mode change.
        let (file, _) = volume.open("truncated", 0o6777);
        inotify::add_watch(&watch, volume.data.join("truncated"), watched).unwrap();
        let open_trunc = |uid| {
            Op::OpenKillSuidgid(v1::OpenKillSuidgidRequest {
                open: Some(v1::OpenRequest {
                    file: Some(file),
                    flags: (libc::O_WRONLY | libc::O_TRUNC) as u32,
                }),
                caller: Some(v1::Caller { uid, gid: 1000 }),
            })
        };
        let reply = volume.apply(open_trunc(0));
        assert!(matches!(reply, v1::reply::Result::OpenKillSuidgid(_)));
        assert_eq!(changes(&watch), ["data"]);
        assert_eq!(volume.mode("truncated"), 0o6777, "uid 0 keeps the bits");
        let reply = volume.apply(open_trunc(1000));
        assert!(matches!(reply, v1::reply::Result::OpenKillSuidgid(_)));
        assert_eq!(changes(&watch), ["mode", "data"]);
        assert_eq!(volume.mode("truncated"), 0o777);

        // Without a caller the request is malformed, and nothing changes.
        let (file, handle) = volume.open("refused", 0o4777);
        let reply = volume.apply(Op::WriteKillSuidgid(v1::WriteKillSuidgidRequest {
            write: Some(v1::WriteRequest {
                file: Some(file),
                handle,
                data: bytes::Bytes::from_static(b"x"),
                ..Default::default()
            }),
            caller: None,
        }));
        assert!(
            matches!(&reply, v1::reply::Result::Error(e) if e.kind == i32::from(v1::ErrorKind::InvalidRequest)),
            "{reply:?}"
        );
        assert_eq!(volume.mode("refused"), 0o4777);
        assert_eq!(
            std::fs::read(volume.data.join("refused")).unwrap(),
            [b'.'; 64]
        );
    }

    #[test]
    fn directory_cookies_are_stable_nonzero_and_leave_room_for_client_offsets() {
        let a = super::dir_cookie(b"a");
        assert_eq!(a, super::dir_cookie(b"a"));
        assert_ne!(a, super::dir_cookie(b"b"));
        for name in [&b""[..], b"x", &[0xff; 255]] {
            let cookie = super::dir_cookie(name);
            assert!((1..=(u64::MAX >> 2) + 1).contains(&cookie), "{cookie}");
            assert!(i64::try_from(cookie + 2).is_ok());
        }
    }

    #[test]
    fn names_are_single_components() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b", &[b'x'; 256]] {
            assert!(name(bad).is_err(), "{bad:?}");
        }
        assert!(name(b"ok name").is_ok());
        assert!(name(&[0xff, 0xfe]).is_ok(), "names are bytes, not UTF-8");
    }
}
