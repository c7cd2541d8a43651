//! The fuse3 adapter: every method forwards to [`Fs`] and maps its errno. Nothing else.

use std::ffi::OsStr;
use std::num::NonZeroU32;
use std::sync::Arc;

use fuse3::raw::prelude::*;
use fuse3::{Inode, Result, SetAttr};
use futures_util::stream;
use lease_client::protocol::MAX_DATA_BYTES;

use crate::error::{self, Error};
use crate::fs::{Caller, Fs, WriteFlags};
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
            .setattr(caller(&req), inode, fh, set_attr)
            .await
            .map_err(failed("setattr"))
    }

    async fn readlink(&self, req: Request, inode: Inode) -> Result<ReplyData> {
        self.fs
            .readlink(caller(&req), inode)
            .await
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
            .map_err(failed("link"))
    }

    async fn open(&self, req: Request, inode: Inode, flags: u32) -> Result<ReplyOpen> {
        self.fs
            .open(caller(&req), inode, flags)
            .await
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
            .map_err(failed("write"))
    }

    async fn statfs(&self, req: Request, _inode: Inode) -> Result<ReplyStatFs> {
        self.fs.statfs(caller(&req)).await.map_err(failed("statfs"))
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
        // Directories are read statelessly by offset; no worker handle is needed.
        Ok(ReplyOpen { fh: 0, flags: 0 })
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
            entries: stream::iter(entries.into_iter().map(Ok)),
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
        // lookups of those it took.
        Ok(ReplyDirectoryPlus {
            entries: stream::iter(entries.map(Ok)),
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
            .map_err(failed("create"))
    }

    async fn interrupt(&self, _req: Request, unique: u64) -> Result<()> {
        self.fs.interrupt(unique);
        Ok(())
    }
}
