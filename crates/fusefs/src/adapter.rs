//! The session adapter: the [`fuse_session::Handler`] that serves an [`Fs`]. Each request is
//! decoded by the session; the adapter calls the one `Fs` method it names, encodes the answer
//! with [`fuse_wire::reply`] and maps a failure to its errno (logged and counted once). The
//! conversions are the functions at the end, the only place the core's types meet the wire's.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use fuse_session::{Handler, Reply, RequestContext};
use fuse_wire::{
    Attr, AttrOut, DirBuffer, DirPlusBuffer, EntryOut, FopenFlags, FsyncFlags, GetattrFlags,
    Opcode, OpenOut, Operation, Request, SetattrIn, SetattrValid, StatfsOut, Unique, WriteOut,
    reply,
};

use crate::error::{self, Error};
use crate::fs::{Caller, Fs, WriteFlags};
use crate::reply::{
    Attributes, DirEntry, Entry, FileKind, Opened, SetAttrs, SetTime, Stat, StatFs, Timestamp,
};
use crate::service::FileService;

/// Serves an [`Fs`] to the kernel through a [`fuse_session::Session`].
#[derive(Debug)]
pub struct FuseAdapter<S> {
    fs: Arc<Fs<S>>,
}

impl<S> FuseAdapter<S> {
    /// An adapter over `fs`.
    pub fn new(fs: Arc<Fs<S>>) -> Self {
        FuseAdapter { fs }
    }
}

impl<S: FileService> Handler for FuseAdapter<S> {
    /// Serves one request. An INTERRUPT for it is passed to the core, which honours it only
    /// while nothing has been sent for the request ([`Fs::interrupt`]). A request the kernel
    /// resends after `FUSE_NOTIFY_RESEND` was sent by a previous owner already: it runs to
    /// its outcome, whatever the interrupts.
    async fn handle<'a>(&'a self, context: RequestContext, request: Request<'a>) -> Reply {
        let unique = request.header.unique;
        if !matches!(request.header.opcode, Opcode::FORGET | Opcode::BATCH_FORGET) {
            self.fs.read_request(unique.raw());
        }
        let work = self.dispatch(request);
        if unique.is_resend() {
            return work.await;
        }
        let mut work = std::pin::pin!(work);
        tokio::select! {
            biased;
            reply = &mut work => reply,
            () = context.interrupted() => {
                self.fs.interrupt(unique.raw());
                work.await
            }
        }
    }

    /// Marks the handle an OPEN or CREATE reply carried delivered ([`Fs::replied`]).
    fn replied(&self, unique: Unique, opcode: Opcode, delivered: bool) {
        if matches!(opcode, Opcode::OPEN | Opcode::CREATE) {
            self.fs.replied(unique.raw(), delivered);
        }
    }
}

impl<S: FileService> FuseAdapter<S> {
    async fn dispatch(&self, request: Request<'_>) -> Reply {
        let header = request.header;
        let unique = header.unique;
        let node = header.nodeid;
        let caller = Caller {
            unique: unique.raw(),
            uid: header.uid,
            gid: header.gid,
        };
        let fs = &self.fs;
        match request.op {
            Operation::Lookup { name } => {
                entry(unique, "lookup", fs.lookup(caller, node, name).await)
            }
            Operation::Forget(forget) => {
                fs.forget(node, forget.nlookup);
                Reply::none()
            }
            Operation::BatchForget(list) => {
                for one in list.iter() {
                    fs.forget(one.nodeid, one.nlookup);
                }
                Reply::none()
            }
            Operation::Getattr(arg) => {
                let fh = arg
                    .getattr_flags
                    .contains(GetattrFlags::FH)
                    .then_some(arg.fh);
                attr(unique, "getattr", fs.getattr(caller, node, fh).await)
            }
            Operation::Setattr(arg) => {
                let fh = arg.valid.contains(SetattrValid::FH).then_some(arg.fh);
                let set = set_attrs(&arg);
                attr(unique, "setattr", fs.setattr(caller, node, fh, set).await)
            }
            Operation::Readlink => match fs.readlink(caller, node).await {
                Ok(target) => Reply::bytes(unique, target),
                Err(e) => failed(unique, "readlink", &e),
            },
            Operation::Symlink { name, target } => entry(
                unique,
                "symlink",
                fs.symlink(caller, node, name, target).await,
            ),
            Operation::Mknod { arg, name } => entry(
                unique,
                "mknod",
                fs.mknod(caller, node, name, arg.mode, arg.rdev).await,
            ),
            Operation::Mkdir { arg, name } => entry(
                unique,
                "mkdir",
                fs.mkdir(caller, node, name, arg.mode, arg.umask).await,
            ),
            Operation::Unlink { name } => {
                empty(unique, "unlink", fs.unlink(caller, node, name).await)
            }
            Operation::Rmdir { name } => empty(unique, "rmdir", fs.rmdir(caller, node, name).await),
            Operation::Rename {
                arg,
                name,
                new_name,
            } => {
                self.rename(unique, caller, (node, name), (arg.newdir, new_name), 0)
                    .await
            }
            Operation::Rename2 {
                arg,
                name,
                new_name,
            } => {
                let to = (arg.newdir, new_name);
                self.rename(unique, caller, (node, name), to, arg.flags)
                    .await
            }
            Operation::Link { arg, name } => entry(
                unique,
                "link",
                fs.link(caller, arg.oldnodeid, node, name).await,
            ),
            Operation::Open(arg) => match fs.open(caller, node, arg.flags).await {
                Ok(opened) => Reply::encode(|out| reply::open(out, unique, &open_out(opened))),
                Err(e) => failed(unique, "open", &e),
            },
            Operation::Opendir(_) => {
                let opened = open_out(fs.opendir());
                Reply::encode(|out| reply::open(out, unique, &opened))
            }
            Operation::Create { arg, name } => {
                match fs.create(caller, node, name, arg.mode, arg.flags).await {
                    Ok(created) => Reply::encode(|out| {
                        let entry = entry_out(&created.entry);
                        reply::create(out, unique, &entry, &open_out(created.opened));
                    }),
                    Err(e) => failed(unique, "create", &e),
                }
            }
            Operation::Read(arg) => {
                match fs.read(caller, node, arg.fh, arg.offset, arg.size).await {
                    Ok(data) => Reply::bytes(unique, data),
                    Err(e) => failed(unique, "read", &e),
                }
            }
            Operation::Write { arg, data } => {
                let flags = WriteFlags::from_request(arg.flags, arg.write_flags.bits());
                match fs
                    .write(caller, node, arg.fh, arg.offset, data, flags)
                    .await
                {
                    Ok(size) => Reply::encode(|out| reply::write(out, unique, &WriteOut { size })),
                    Err(e) => failed(unique, "write", &e),
                }
            }
            Operation::Readdir(arg) => match fs.readdir(caller, node, arg.offset).await {
                Ok(entries) => listing(unique, "readdir", arg.size, entries),
                Err(e) => failed(unique, "readdir", &e),
            },
            Operation::Readdirplus(arg) => match fs.readdirplus(caller, node, arg.offset).await {
                Ok(listing) => listing_plus(unique, arg.size, listing),
                Err(e) => failed(unique, "readdirplus", &e),
            },
            Operation::Statfs => match fs.statfs(caller).await {
                Ok(statfs) => Reply::encode(|out| reply::statfs(out, unique, &statfs_out(statfs))),
                Err(e) => failed(unique, "statfs", &e),
            },
            Operation::Release(arg) => empty(
                unique,
                "release",
                fs.release(caller, node, arg.fh, arg.flags).await,
            ),
            Operation::Releasedir(_) => Reply::empty(unique),
            Operation::Flush(arg) => empty(
                unique,
                "flush",
                fs.flush(caller, node, arg.fh, arg.lock_owner).await,
            ),
            Operation::Fsync(arg) => {
                let datasync = arg.fsync_flags.contains(FsyncFlags::FDATASYNC);
                empty(
                    unique,
                    "fsync",
                    fs.fsync(caller, node, arg.fh, datasync).await,
                )
            }
            // A directory holds nothing to sync on this side: the kernel takes ENOSYS as
            // "nothing to do" and stops asking. The session answers INIT, DESTROY and
            // INTERRUPT itself, and never passes them on.
            Operation::Fsyncdir(_)
            | Operation::Init(_)
            | Operation::Destroy
            | Operation::Interrupt(_)
            | Operation::Unknown { .. } => Reply::error(unique, fuse_wire::Errno::ENOSYS),
        }
    }

    async fn rename(
        &self,
        unique: Unique,
        caller: Caller,
        (parent, name): (u64, &OsStr),
        (new_parent, new_name): (u64, &OsStr),
        flags: u32,
    ) -> Reply {
        let renamed = self
            .fs
            .rename(caller, parent, name, new_parent, new_name, flags)
            .await;
        empty(unique, "rename", renamed)
    }
}

/// Answers a failed request: logs and counts its error once ([`error::report`]) and gives the
/// kernel its errno.
fn failed(unique: Unique, operation: &'static str, error: &Error) -> Reply {
    let errno = error::report(operation, error);
    Reply::error(unique, fuse_wire::Errno::new_or_eio(errno.raw()))
}

fn empty(unique: Unique, operation: &'static str, result: Result<(), Error>) -> Reply {
    match result {
        Ok(()) => Reply::empty(unique),
        Err(e) => failed(unique, operation, &e),
    }
}

fn entry(unique: Unique, operation: &'static str, result: Result<Entry, Error>) -> Reply {
    match result {
        Ok(entry) => Reply::encode(|out| reply::entry(out, unique, &entry_out(&entry))),
        Err(e) => failed(unique, operation, &e),
    }
}

fn attr(unique: Unique, operation: &'static str, result: Result<Stat, Error>) -> Reply {
    match result {
        Ok(stat) => Reply::encode(|out| reply::attr(out, unique, &attr_out(stat))),
        Err(e) => failed(unique, operation, &e),
    }
}

/// A READDIR reply: as many entries as fit in the kernel's `size` bytes. The kernel comes
/// back for the rest at the offset of the last one it got.
fn listing(unique: Unique, operation: &'static str, size: u32, entries: Vec<DirEntry>) -> Reply {
    let mut buffer = DirBuffer::new(size);
    for entry in &entries {
        match buffer.push(&dirent(entry)) {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => return failed(unique, operation, &bad_name(operation)),
        }
    }
    Reply::bytes(unique, buffer.into_bytes().into())
}

/// A READDIRPLUS reply. Entries are pulled one at a time and pulling stops at the first that
/// does not fit, so the listing counts as lookups exactly the entries the reply carries
/// ([`crate::PlusListing`]).
fn listing_plus<S: FileService>(
    unique: Unique,
    size: u32,
    listing: crate::PlusListing<'_, S>,
) -> Reply {
    let mut buffer = DirPlusBuffer::new(size);
    for plus in listing {
        match buffer.push(&dirent(&plus.dirent), &entry_out(&plus.entry)) {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => return failed(unique, "readdirplus", &bad_name("readdirplus")),
        }
    }
    Reply::bytes(unique, buffer.into_bytes().into())
}

/// A worker listed a name the kernel would refuse (empty, too long, holding `/` or NUL).
fn bad_name(operation: &'static str) -> Error {
    Error::MalformedReply {
        op: operation,
        problem: "a listed name the kernel refuses",
    }
}

/// The `S_IFMT` bits of a file kind.
fn type_bits(kind: FileKind) -> u32 {
    match kind {
        FileKind::Regular => libc::S_IFREG,
        FileKind::Directory => libc::S_IFDIR,
        FileKind::Symlink => libc::S_IFLNK,
        FileKind::BlockDevice => libc::S_IFBLK,
        FileKind::CharDevice => libc::S_IFCHR,
        FileKind::Fifo => libc::S_IFIFO,
        FileKind::Socket => libc::S_IFSOCK,
    }
}

/// A lifetime as the wire's seconds and nanoseconds.
fn valid(ttl: Duration) -> (u64, u32) {
    (ttl.as_secs(), ttl.subsec_nanos())
}

fn wire_attr(attr: &Attributes) -> Attr {
    Attr {
        ino: attr.ino,
        size: attr.size,
        blocks: attr.blocks,
        // The kernel reads these fields as signed: a time before the epoch keeps its bits.
        atime: attr.atime.sec.cast_unsigned(),
        mtime: attr.mtime.sec.cast_unsigned(),
        ctime: attr.ctime.sec.cast_unsigned(),
        atimensec: attr.atime.nsec,
        mtimensec: attr.mtime.nsec,
        ctimensec: attr.ctime.nsec,
        mode: type_bits(attr.kind) | u32::from(attr.perm),
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        ..Attr::default()
    }
}

fn entry_out(entry: &Entry) -> EntryOut {
    let (secs, nsecs) = valid(entry.ttl);
    EntryOut {
        nodeid: entry.attr.ino,
        generation: entry.generation,
        entry_valid: secs,
        attr_valid: secs,
        entry_valid_nsec: nsecs,
        attr_valid_nsec: nsecs,
        attr: wire_attr(&entry.attr),
    }
}

fn attr_out(stat: Stat) -> AttrOut {
    let (secs, nsecs) = valid(stat.ttl);
    AttrOut {
        attr_valid: secs,
        attr_valid_nsec: nsecs,
        attr: wire_attr(&stat.attr),
    }
}

fn open_out(opened: Opened) -> OpenOut {
    OpenOut {
        fh: opened.handle,
        open_flags: FopenFlags(opened.flags),
        ..OpenOut::default()
    }
}

fn dirent(entry: &DirEntry) -> fuse_wire::DirEntry<'_> {
    fuse_wire::DirEntry {
        ino: entry.ino,
        off: entry.offset,
        kind: fuse_wire::dirent_type(type_bits(entry.kind)),
        name: &entry.name,
    }
}

fn statfs_out(statfs: StatFs) -> StatfsOut {
    StatfsOut {
        blocks: statfs.blocks,
        bfree: statfs.blocks_free,
        bavail: statfs.blocks_available,
        files: statfs.files,
        ffree: statfs.files_free,
        bsize: statfs.block_size,
        namelen: statfs.name_max,
        frsize: statfs.fragment_size,
    }
}

/// The changes a SETATTR asks for. Its ctime and lock owner are dropped: the core applies
/// neither. `UTIME_NOW` (`FATTR_ATIME_NOW`, `FATTR_MTIME_NOW`) becomes [`SetTime::Now`], the
/// worker's clock, as the kernel leaves the time to the filesystem.
fn set_attrs(arg: &SetattrIn) -> SetAttrs {
    let valid = arg.valid;
    let has = |flag| valid.contains(flag);
    let time = |now_flag, set_flag, sec: u64, nsec| {
        if has(now_flag) {
            Some(SetTime::Now)
        } else if has(set_flag) {
            Some(SetTime::At(Timestamp {
                sec: sec.cast_signed(),
                nsec,
            }))
        } else {
            None
        }
    };
    SetAttrs {
        mode: has(SetattrValid::MODE).then_some(arg.mode),
        uid: has(SetattrValid::UID).then_some(arg.uid),
        gid: has(SetattrValid::GID).then_some(arg.gid),
        size: has(SetattrValid::SIZE).then_some(arg.size),
        atime: time(
            SetattrValid::ATIME_NOW,
            SetattrValid::ATIME,
            arg.atime,
            arg.atimensec,
        ),
        mtime: time(
            SetattrValid::MTIME_NOW,
            SetattrValid::MTIME,
            arg.mtime,
            arg.mtimensec,
        ),
    }
}

#[cfg(test)]
mod tests {
    use lease_client::v1;

    use super::*;
    use crate::attr::file_attr as core_attr;

    #[test]
    fn every_file_kind_reaches_the_kernel_as_the_type_of_its_mode() {
        let kinds = [
            (FileKind::Regular, libc::S_IFREG, libc::DT_REG),
            (FileKind::Directory, libc::S_IFDIR, libc::DT_DIR),
            (FileKind::Symlink, libc::S_IFLNK, libc::DT_LNK),
            (FileKind::BlockDevice, libc::S_IFBLK, libc::DT_BLK),
            (FileKind::CharDevice, libc::S_IFCHR, libc::DT_CHR),
            (FileKind::Fifo, libc::S_IFIFO, libc::DT_FIFO),
            (FileKind::Socket, libc::S_IFSOCK, libc::DT_SOCK),
        ];
        for (kind, mode, dt) in kinds {
            // A worker's mode, through the core, comes out as the same type and permissions.
            let attr = v1::Attr {
                mode: mode | 0o4755,
                ..v1::Attr::default()
            };
            assert_eq!(
                wire_attr(&core_attr(3, &attr)).mode,
                mode | 0o4755,
                "{kind:?}"
            );
            let entry = DirEntry {
                ino: 3,
                kind,
                name: "n".into(),
                offset: 4,
            };
            let listed = dirent(&entry);
            assert_eq!(listed.kind, u32::from(dt), "{kind:?}");
        }
    }

    #[test]
    fn worker_times_reach_the_kernel_with_nanoseconds_clamped() {
        let attr = v1::Attr {
            atime: None,
            mtime: Some(v1::Timestamp {
                sec: -5,
                nsec: 2_000_000_000,
            }),
            ctime: Some(v1::Timestamp {
                sec: 1_700_000_000,
                nsec: 999_999_999,
            }),
            size: 12,
            blocks: 8,
            nlink: 2,
            uid: 1000,
            gid: 100,
            rdev: u64::from(u32::MAX) + 1,
            blksize: 4096,
            mode: libc::S_IFREG | 0o644,
        };
        let wire = wire_attr(&core_attr(9, &attr));
        assert_eq!((wire.atime, wire.atimensec), (0, 0));
        assert_eq!(
            (wire.mtime.cast_signed(), wire.mtimensec),
            (-5, 999_999_999),
            "a time before the epoch keeps its sign"
        );
        assert_eq!((wire.ctime, wire.ctimensec), (1_700_000_000, 999_999_999));
        assert_eq!(
            (wire.ino, wire.size, wire.blocks, wire.nlink),
            (9, 12, 8, 2)
        );
        assert_eq!((wire.uid, wire.gid, wire.blksize), (1000, 100, 4096));
        assert_eq!(wire.rdev, 0, "a device number too large for 32 bits");
    }

    fn entry(ino: u64) -> Entry {
        let attr = v1::Attr {
            mode: libc::S_IFREG | 0o600,
            ..v1::Attr::default()
        };
        Entry {
            attr: core_attr(ino, &attr),
            generation: 4,
            ttl: Duration::from_millis(1500),
        }
    }

    #[test]
    fn replies_keep_generations_lifetimes_handles_and_flags() {
        let entry = entry(11);
        let out = entry_out(&entry);
        assert_eq!((out.nodeid, out.generation), (11, 4));
        assert_eq!((out.entry_valid, out.entry_valid_nsec), (1, 500_000_000));
        assert_eq!((out.attr_valid, out.attr_valid_nsec), (1, 500_000_000));
        assert_eq!(out.attr, wire_attr(&entry.attr));
        let stat = attr_out(Stat {
            attr: entry.attr,
            ttl: entry.ttl,
        });
        assert_eq!(
            (stat.attr, stat.attr_valid, stat.attr_valid_nsec),
            (out.attr, 1, 500_000_000)
        );
        let opened = open_out(Opened {
            handle: 77,
            flags: 1,
        });
        assert_eq!((opened.fh, opened.open_flags), (77, FopenFlags::DIRECT_IO));
        assert_eq!(opened.backing_id, 0);
        let dots = DirEntry {
            ino: 1,
            kind: FileKind::Directory,
            name: "..".into(),
            offset: 2,
        };
        let listed = dirent(&dots);
        assert_eq!(
            (listed.ino, listed.off, listed.name),
            (1, 2, OsStr::new(".."))
        );
    }

    #[test]
    fn statfs_carries_every_field() {
        let out = statfs_out(StatFs {
            blocks: 1,
            blocks_free: 2,
            blocks_available: 3,
            files: 4,
            files_free: 5,
            block_size: 6,
            name_max: 7,
            fragment_size: 8,
        });
        assert_eq!((out.blocks, out.bfree, out.bavail, out.files), (1, 2, 3, 4));
        assert_eq!(
            (out.ffree, out.bsize, out.namelen, out.frsize),
            (5, 6, 7, 8)
        );
    }

    #[test]
    fn setattr_takes_only_the_fields_it_names() {
        let arg = SetattrIn {
            valid: SetattrValid::MODE
                | SetattrValid::UID
                | SetattrValid::GID
                | SetattrValid::SIZE
                | SetattrValid::ATIME
                | SetattrValid::MTIME
                | SetattrValid::CTIME
                | SetattrValid::LOCKOWNER,
            mode: libc::S_IFREG | 0o6755,
            uid: 1,
            gid: 2,
            size: 3,
            lock_owner: 4,
            atime: (-1i64).cast_unsigned(),
            atimensec: 5,
            mtime: 6,
            mtimensec: 7,
            ctime: 8,
            ctimensec: 9,
            ..SetattrIn::default()
        };
        assert_eq!(
            set_attrs(&arg),
            SetAttrs {
                mode: Some(libc::S_IFREG | 0o6755),
                uid: Some(1),
                gid: Some(2),
                size: Some(3),
                atime: Some(SetTime::At(Timestamp { sec: -1, nsec: 5 })),
                mtime: Some(SetTime::At(Timestamp { sec: 6, nsec: 7 })),
            }
        );
        // Fields without their bit are not applied, whatever they hold.
        let none = SetattrIn {
            valid: SetattrValid::FH,
            ..arg
        };
        assert_eq!(set_attrs(&none), SetAttrs::default());
    }

    #[test]
    fn utime_now_is_the_workers_now_whatever_the_times_given() {
        let arg = SetattrIn {
            valid: SetattrValid::ATIME_NOW
                | SetattrValid::MTIME_NOW
                | SetattrValid::ATIME
                | SetattrValid::MTIME,
            atime: 1,
            mtime: 2,
            ..SetattrIn::default()
        };
        let set = set_attrs(&arg);
        assert_eq!(
            (set.atime, set.mtime),
            (Some(SetTime::Now), Some(SetTime::Now))
        );
    }
}
