//! The fuse3 adapter: every method forwards to [`Fs`], converts its answer to fuse3's types
//! and maps its errno. Nothing else; the conversions are the functions at the end, the only
//! place the core's types meet fuse3's.

use std::ffi::OsStr;
use std::num::NonZeroU32;
use std::sync::Arc;

use fuse3::raw::prelude::*;
use fuse3::{Inode, Result, SetAttr};
use futures_util::stream;
use lease_client::protocol::MAX_DATA_BYTES;

use crate::errno::Errno;
use crate::error::{self, Error};
use crate::fs::{Caller, Fs, WriteFlags};
use crate::reply::{
    Attributes, Created, DirEntry, DirEntryPlus, Entry, FileKind, Opened, SetAttrs, Stat, StatFs,
    Timestamp,
};
use crate::service::FileService;

/// Serves an [`Fs`] to the kernel through fuse3.
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

fn caller(req: &Request) -> Caller {
    Caller {
        unique: req.unique,
        uid: req.uid,
        gid: req.gid,
    }
}

impl From<Errno> for fuse3::Errno {
    fn from(errno: Errno) -> Self {
        fuse3::Errno::from(errno.raw())
    }
}

/// Answers a failed request: logs and counts its error once ([`error::report`]) and gives the
/// kernel its errno.
fn failed(operation: &'static str) -> impl Fn(Error) -> fuse3::Errno {
    move |error| error::report(operation, &error).into()
}

impl<S: FileService> Filesystem for FuseAdapter<S> {
    async fn init(&self, _req: Request) -> Result<ReplyInit> {
        let max_write = NonZeroU32::new(MAX_DATA_BYTES as u32).unwrap_or(NonZeroU32::MIN);
        Ok(ReplyInit::new(max_write))
    }

    async fn destroy(&self, _req: Request) {}

    async fn lookup(&self, req: Request, parent: Inode, name: &OsStr) -> Result<ReplyEntry> {
        self.fs
            .lookup(caller(&req), parent, name)
            .await
            .map(reply_entry)
            .map_err(failed("lookup"))
    }

    async fn forget(&self, _req: Request, inode: Inode, nlookup: u64) {
        self.fs.forget(inode, nlookup);
    }

    async fn batch_forget(&self, _req: Request, inodes: &[(Inode, u64)]) {
        for (inode, nlookup) in inodes {
            self.fs.forget(*inode, *nlookup);
        }
    }

    async fn getattr(
        &self,
        req: Request,
        inode: Inode,
        fh: Option<u64>,
        _flags: u32,
    ) -> Result<ReplyAttr> {
        self.fs
            .getattr(caller(&req), inode, fh)
            .await
            .map(reply_attr)
            .map_err(failed("getattr"))
    }

    async fn setattr(
        &self,
        req: Request,
        inode: Inode,
        fh: Option<u64>,
        set_attr: SetAttr,
    ) -> Result<ReplyAttr> {
        self.fs
            .setattr(caller(&req), inode, fh, set_attrs(set_attr))
            .await
            .map(reply_attr)
            .map_err(failed("setattr"))
    }

    async fn readlink(&self, req: Request, inode: Inode) -> Result<ReplyData> {
        self.fs
            .readlink(caller(&req), inode)
            .await
            .map(|data| ReplyData { data })
            .map_err(failed("readlink"))
    }

    async fn symlink(
        &self,
        req: Request,
        parent: Inode,
        name: &OsStr,
        link: &OsStr,
    ) -> Result<ReplyEntry> {
        self.fs
            .symlink(caller(&req), parent, name, link)
            .await
            .map(reply_entry)
            .map_err(failed("symlink"))
    }

    async fn mknod(
        &self,
        req: Request,
        parent: Inode,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<ReplyEntry> {
        self.fs
            .mknod(caller(&req), parent, name, mode, rdev)
            .await
            .map(reply_entry)
            .map_err(failed("mknod"))
    }

    async fn mkdir(
        &self,
        req: Request,
        parent: Inode,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<ReplyEntry> {
        self.fs
            .mkdir(caller(&req), parent, name, mode, umask)
            .await
            .map(reply_entry)
            .map_err(failed("mkdir"))
    }

    async fn unlink(&self, req: Request, parent: Inode, name: &OsStr) -> Result<()> {
        self.fs
            .unlink(caller(&req), parent, name)
            .await
            .map_err(failed("unlink"))
    }

    async fn rmdir(&self, req: Request, parent: Inode, name: &OsStr) -> Result<()> {
        self.fs
            .rmdir(caller(&req), parent, name)
            .await
            .map_err(failed("rmdir"))
    }

    async fn rename(
        &self,
        req: Request,
        parent: Inode,
        name: &OsStr,
        new_parent: Inode,
        new_name: &OsStr,
    ) -> Result<()> {
        self.fs
            .rename(caller(&req), parent, name, new_parent, new_name, 0)
            .await
            .map_err(failed("rename"))
    }

    async fn rename2(
        &self,
        req: Request,
        parent: Inode,
        name: &OsStr,
        new_parent: Inode,
        new_name: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.fs
            .rename(caller(&req), parent, name, new_parent, new_name, flags)
            .await
            .map_err(failed("rename"))
    }

    async fn link(
        &self,
        req: Request,
        inode: Inode,
        new_parent: Inode,
        new_name: &OsStr,
    ) -> Result<ReplyEntry> {
        self.fs
            .link(caller(&req), inode, new_parent, new_name)
            .await
            .map(reply_entry)
            .map_err(failed("link"))
    }

    async fn open(&self, req: Request, inode: Inode, flags: u32) -> Result<ReplyOpen> {
        self.fs
            .open(caller(&req), inode, flags)
            .await
            .map(reply_open)
            .map_err(failed("open"))
    }

    async fn read(
        &self,
        req: Request,
        inode: Inode,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<ReplyData> {
        self.fs
            .read(caller(&req), inode, fh, offset, size)
            .await
            .map(|data| ReplyData { data })
            .map_err(failed("read"))
    }

    async fn write(
        &self,
        req: Request,
        inode: Inode,
        fh: u64,
        offset: u64,
        data: &[u8],
        write_flags: u32,
        flags: u32,
    ) -> Result<ReplyWrite> {
        let flags = WriteFlags::from_request(flags, write_flags);
        self.fs
            .write(caller(&req), inode, fh, offset, data, flags)
            .await
            .map(|written| ReplyWrite { written })
            .map_err(failed("write"))
    }

    async fn statfs(&self, req: Request, _inode: Inode) -> Result<ReplyStatFs> {
        self.fs
            .statfs(caller(&req))
            .await
            .map(reply_statfs)
            .map_err(failed("statfs"))
    }

    async fn release(
        &self,
        req: Request,
        inode: Inode,
        fh: u64,
        flags: u32,
        _lock_owner: u64,
        _flush: bool,
    ) -> Result<()> {
        self.fs
            .release(caller(&req), inode, fh, flags)
            .await
            .map_err(failed("release"))
    }

    async fn fsync(&self, req: Request, inode: Inode, fh: u64, datasync: bool) -> Result<()> {
        self.fs
            .fsync(caller(&req), inode, fh, datasync)
            .await
            .map_err(failed("fsync"))
    }

    async fn flush(&self, req: Request, inode: Inode, fh: u64, lock_owner: u64) -> Result<()> {
        self.fs
            .flush(caller(&req), inode, fh, lock_owner)
            .await
            .map_err(failed("flush"))
    }

    async fn opendir(&self, _req: Request, _inode: Inode, _flags: u32) -> Result<ReplyOpen> {
        Ok(reply_open(self.fs.opendir()))
    }

    async fn readdir<'a>(
        &'a self,
        req: Request,
        parent: Inode,
        _fh: u64,
        offset: i64,
    ) -> Result<ReplyDirectory<impl futures_util::Stream<Item = Result<DirectoryEntry>> + Send + 'a>>
    {
        let offset = u64::try_from(offset).unwrap_or(0);
        let entries = self
            .fs
            .readdir(caller(&req), parent, offset)
            .await
            .map_err(failed("readdir"))?;
        Ok(ReplyDirectory {
            entries: stream::iter(entries.into_iter().map(|e| Ok(directory_entry(e)))),
        })
    }

    async fn readdirplus<'a>(
        &'a self,
        req: Request,
        parent: Inode,
        _fh: u64,
        offset: u64,
        _lock_owner: u64,
    ) -> Result<
        ReplyDirectoryPlus<
            impl futures_util::Stream<Item = Result<DirectoryEntryPlus>> + Send + 'a,
        >,
    > {
        let entries = self
            .fs
            .readdirplus(caller(&req), parent, offset)
            .await
            .map_err(failed("readdirplus"))?;
        // fuse3 pulls entries until the kernel's buffer is full; the listing counts the
        // lookups of those it took. Each is converted as it is pulled, which keeps that count.
        Ok(ReplyDirectoryPlus {
            entries: stream::iter(entries.map(|e| Ok(directory_entry_plus(e)))),
        })
    }

    async fn releasedir(&self, _req: Request, _inode: Inode, _fh: u64, _flags: u32) -> Result<()> {
        Ok(())
    }

    async fn create(
        &self,
        req: Request,
        parent: Inode,
        name: &OsStr,
        mode: u32,
        flags: u32,
    ) -> Result<ReplyCreated> {
        self.fs
            .create(caller(&req), parent, name, mode, flags)
            .await
            .map(reply_created)
            .map_err(failed("create"))
    }

    async fn interrupt(&self, _req: Request, unique: u64) -> Result<()> {
        self.fs.interrupt(unique);
        Ok(())
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

fn timestamp(t: Timestamp) -> fuse3::Timestamp {
    fuse3::Timestamp::new(t.sec, t.nsec)
}

fn file_attr(attr: Attributes) -> FileAttr {
    FileAttr {
        ino: attr.ino,
        size: attr.size,
        blocks: attr.blocks,
        atime: timestamp(attr.atime),
        mtime: timestamp(attr.mtime),
        ctime: timestamp(attr.ctime),
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
    }
}

fn reply_entry(entry: Entry) -> ReplyEntry {
    ReplyEntry {
        ttl: entry.ttl,
        attr: file_attr(entry.attr),
        generation: entry.generation,
    }
}

fn reply_attr(stat: Stat) -> ReplyAttr {
    ReplyAttr {
        ttl: stat.ttl,
        attr: file_attr(stat.attr),
    }
}

fn reply_open(opened: Opened) -> ReplyOpen {
    ReplyOpen {
        fh: opened.handle,
        flags: opened.flags,
    }
}

fn reply_created(created: Created) -> ReplyCreated {
    ReplyCreated {
        ttl: created.entry.ttl,
        attr: file_attr(created.entry.attr),
        generation: created.entry.generation,
        fh: created.opened.handle,
        flags: created.opened.flags,
    }
}

/// fuse3's directory offsets are signed; the core's never exceed `i64::MAX`.
fn directory_offset(offset: u64) -> i64 {
    i64::try_from(offset).unwrap_or(i64::MAX)
}

fn directory_entry(entry: DirEntry) -> DirectoryEntry {
    DirectoryEntry {
        inode: entry.ino,
        kind: file_type(entry.kind),
        name: entry.name,
        offset: directory_offset(entry.offset),
    }
}

fn directory_entry_plus(plus: DirEntryPlus) -> DirectoryEntryPlus {
    DirectoryEntryPlus {
        inode: plus.dirent.ino,
        generation: plus.entry.generation,
        kind: file_type(plus.dirent.kind),
        name: plus.dirent.name,
        offset: directory_offset(plus.dirent.offset),
        attr: file_attr(plus.entry.attr),
        entry_ttl: plus.entry.ttl,
        attr_ttl: plus.entry.ttl,
    }
}

fn reply_statfs(statfs: StatFs) -> ReplyStatFs {
    ReplyStatFs {
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
/// neither.
fn set_attrs(set: SetAttr) -> SetAttrs {
    SetAttrs {
        mode: set.mode,
        uid: set.uid,
        gid: set.gid,
        size: set.size,
        atime: set.atime.map(set_time),
        mtime: set.mtime.map(set_time),
    }
}

/// A time a SETATTR asks for, unchanged.
fn set_time(t: fuse3::Timestamp) -> Timestamp {
    Timestamp {
        sec: t.sec,
        nsec: t.nsec,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lease_client::v1;

    use super::*;
    use crate::attr::file_attr as core_attr;

    #[test]
    fn every_file_kind_is_the_fuse3_type_of_its_mode() {
        let kinds = [
            (FileKind::Regular, libc::S_IFREG),
            (FileKind::Directory, libc::S_IFDIR),
            (FileKind::Symlink, libc::S_IFLNK),
            (FileKind::BlockDevice, libc::S_IFBLK),
            (FileKind::CharDevice, libc::S_IFCHR),
            (FileKind::Fifo, libc::S_IFIFO),
            (FileKind::Socket, libc::S_IFSOCK),
        ];
        for (kind, mode) in kinds {
            assert_eq!(file_type(kind).const_into_mode_t(), mode, "{kind:?}");
            // A worker's mode, through the core, comes out as the same type and permissions.
            let attr = v1::Attr {
                mode: mode | 0o4755,
                ..v1::Attr::default()
            };
            let converted = file_attr(core_attr(3, &attr));
            assert_eq!(converted.kind.const_into_mode_t(), mode, "{kind:?}");
            assert_eq!(converted.perm, 0o4755);
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
        let converted = file_attr(core_attr(9, &attr));
        assert_eq!(converted.atime, fuse3::Timestamp::new(0, 0));
        assert_eq!(converted.mtime, fuse3::Timestamp::new(-5, 999_999_999));
        assert_eq!(
            converted.ctime,
            fuse3::Timestamp::new(1_700_000_000, 999_999_999)
        );
        assert_eq!(
            (
                converted.ino,
                converted.size,
                converted.blocks,
                converted.nlink
            ),
            (9, 12, 8, 2)
        );
        assert_eq!((converted.uid, converted.gid), (1000, 100));
        assert_eq!(converted.rdev, 0, "a device number too large for 32 bits");
        assert_eq!(converted.blksize, 4096);
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
        let replied = reply_entry(entry);
        assert_eq!(
            (replied.attr.ino, replied.generation, replied.ttl),
            (11, 4, entry.ttl)
        );
        let stat = reply_attr(Stat {
            attr: entry.attr,
            ttl: entry.ttl,
        });
        assert_eq!((stat.attr, stat.ttl), (replied.attr, entry.ttl));
        let opened = Opened {
            handle: 77,
            flags: 1,
        };
        assert_eq!(reply_open(opened), ReplyOpen { fh: 77, flags: 1 });
        let created = reply_created(Created { entry, opened });
        assert_eq!(
            (created.attr, created.generation, created.ttl),
            (replied.attr, 4, entry.ttl)
        );
        assert_eq!((created.fh, created.flags), (77, 1));

        let plus = directory_entry_plus(DirEntryPlus {
            dirent: DirEntry {
                ino: 11,
                kind: FileKind::Symlink,
                name: "l".into(),
                offset: u64::MAX,
            },
            entry,
        });
        assert_eq!((plus.inode, plus.generation), (11, 4));
        assert_eq!(plus.kind, FileType::Symlink, "the listing's type");
        assert_eq!(
            plus.attr.kind,
            FileType::RegularFile,
            "the attributes' type"
        );
        assert_eq!((plus.entry_ttl, plus.attr_ttl), (entry.ttl, entry.ttl));
        assert_eq!(plus.offset, i64::MAX);
        let listed = directory_entry(DirEntry {
            ino: 1,
            kind: FileKind::Directory,
            name: "..".into(),
            offset: 2,
        });
        assert_eq!((listed.inode, listed.offset), (1, 2));
        assert_eq!(
            (listed.kind, listed.name),
            (FileType::Directory, "..".into())
        );
    }

    #[test]
    fn statfs_and_setattr_carry_every_field() {
        let statfs = reply_statfs(StatFs {
            blocks: 1,
            blocks_free: 2,
            blocks_available: 3,
            files: 4,
            files_free: 5,
            block_size: 6,
            name_max: 7,
            fragment_size: 8,
        });
        assert_eq!(
            (statfs.blocks, statfs.bfree, statfs.bavail, statfs.files),
            (1, 2, 3, 4)
        );
        assert_eq!(
            (statfs.ffree, statfs.bsize, statfs.namelen, statfs.frsize),
            (5, 6, 7, 8)
        );

        let set = SetAttr {
            mode: Some(libc::S_IFREG | 0o6755),
            uid: Some(1),
            gid: Some(2),
            size: Some(3),
            lock_owner: Some(4),
            atime: Some(fuse3::Timestamp::new(-1, 5)),
            mtime: Some(fuse3::Timestamp::new(6, 7)),
            ctime: Some(fuse3::Timestamp::new(8, 9)),
        };
        assert_eq!(
            set_attrs(set),
            SetAttrs {
                mode: Some(libc::S_IFREG | 0o6755),
                uid: Some(1),
                gid: Some(2),
                size: Some(3),
                atime: Some(Timestamp { sec: -1, nsec: 5 }),
                mtime: Some(Timestamp { sec: 6, nsec: 7 }),
            }
        );
        assert_eq!(set_attrs(SetAttr::default()), SetAttrs::default());
    }
}
