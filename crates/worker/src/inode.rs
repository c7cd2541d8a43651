//! Stable inode numbers and inode generations over the backing directory.
//!
//! The worker's inode number of a file is the backing filesystem's own `st_ino`, except that
//! the volume root and inode number [`ROOT_INO`] swap places (a bijection, so no two files
//! share a number and the root is always [`ROOT_INO`]). The inode generation comes from a
//! volume-wide counter persisted in the journal: the first time the worker names an inode it
//! records the inode's generation together with the filesystem's file handle for it
//! (`name_to_handle_at(2)`). Naming the same inode number again with a different file handle
//! means the number was reused by another file, which then gets the next generation. Both
//! survive a restart because they are journaled (fsynced) before any reply carries them.
//!
//! A file is opened by its inode number with `open_by_handle_at(2)` relative to the volume's
//! data directory, so renames and hard links need no bookkeeping, and no path is ever walked.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};

use rustix::fs::{OFlags, Stat};

use crate::fsops::OpError;
use crate::meta::{InodeEntry, MetaStore, Record};
use crate::sys::{self, FileHandle};

pub use worker_proto::ROOT_INO;

/// The inode generation of the volume root; it never changes.
pub const ROOT_GENERATION: u64 = 1;
/// The first inode generation handed to any other file.
pub(crate) const FIRST_GENERATION: u64 = 2;

/// A file named by the worker: inode number and inode generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ident {
    pub(crate) ino: u64,
    pub(crate) generation: u64,
}

#[derive(Debug)]
pub(crate) struct InodeTable {
    root: OwnedFd,
    root_real_ino: u64,
    entries: HashMap<u64, (u64, FileHandle)>,
    next_generation: u64,
}

impl InodeTable {
    /// `root` is an `O_PATH` descriptor of the volume's data directory.
    pub(crate) fn new(
        root: OwnedFd,
        entries: &HashMap<u64, InodeEntry>,
        next_generation: u64,
    ) -> io::Result<Self> {
        let root_real_ino = rustix::fs::fstat(&root)?.st_ino;
        // Refuse early when the filesystem cannot make file handles.
        sys::name_to_handle(root.as_fd())?;
        let entries = entries
            .values()
            .filter_map(|e| Some((e.ino, (e.generation, e.file_handle()?))))
            .collect();
        Ok(Self {
            root,
            root_real_ino,
            entries,
            next_generation: next_generation.max(FIRST_GENERATION),
        })
    }

    pub(crate) fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    pub(crate) fn next_generation(&self) -> u64 {
        self.next_generation
    }

    pub(crate) fn entries(&self) -> HashMap<u64, InodeEntry> {
        self.entries
            .iter()
            .map(|(&ino, (generation, handle))| (ino, InodeEntry::new(ino, *generation, handle)))
            .collect()
    }

    /// The worker's inode number for a backing `st_ino`.
    pub(crate) fn worker_ino(&self, real: u64) -> u64 {
        if real == self.root_real_ino {
            ROOT_INO
        } else if real == ROOT_INO {
            self.root_real_ino
        } else {
            real
        }
    }

    /// Names the file `fd` refers to (with `stat` already taken of it), recording a new
    /// generation durably when the inode number is new or was reused.
    pub(crate) fn identify(
        &mut self,
        fd: BorrowedFd<'_>,
        stat: &Stat,
        meta: &mut MetaStore,
    ) -> Result<Ident, OpError> {
        let ino = self.worker_ino(stat.st_ino);
        if ino == ROOT_INO {
            return Ok(Ident {
                ino,
                generation: ROOT_GENERATION,
            });
        }
        let handle = sys::name_to_handle(fd)?;
        let generation = self.generation_for(ino, handle, meta)?;
        Ok(Ident { ino, generation })
    }

    /// The generation of inode number `ino` whose file handle is `handle`: the recorded one
    /// when the handle matches, otherwise a new one, journaled before it is returned.
    fn generation_for(
        &mut self,
        ino: u64,
        handle: FileHandle,
        meta: &mut MetaStore,
    ) -> Result<u64, OpError> {
        if let Some((generation, known)) = self.entries.get(&ino)
            && *known == handle
        {
            return Ok(*generation);
        }
        let generation = self.next_generation;
        meta.append(&Record::Inode(InodeEntry::new(ino, generation, &handle)))
            .map_err(OpError::Journal)?;
        self.next_generation += 1;
        self.entries.insert(ino, (generation, handle));
        Ok(generation)
    }

    /// Forgets an inode number whose last link is gone (best effort: not fsynced, because a
    /// forgotten entry only saves memory; a later reuse is detected by its handle anyway).
    pub(crate) fn forget(&mut self, ino: u64, meta: &mut MetaStore) {
        if self.entries.remove(&ino).is_some() {
            let _ = meta.append_unsynced(&Record::Forget { ino });
        }
    }

    /// Opens the file `id` names with `flags` (add `O_PATH` for a reference only). A number
    /// the worker never issued, a wrong generation or a file that is gone give `ESTALE`.
    pub(crate) fn open(&self, id: Ident, flags: OFlags) -> io::Result<OwnedFd> {
        let stale = || io::Error::from_raw_os_error(libc::ESTALE);
        if id.ino == ROOT_INO {
            if id.generation != ROOT_GENERATION {
                return Err(stale());
            }
            return Ok(rustix::fs::openat(
                &self.root,
                c".",
                flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                rustix::fs::Mode::empty(),
            )?);
        }
        let (generation, handle) = self.entries.get(&id.ino).ok_or_else(stale)?;
        if *generation != id.generation {
            return Err(stale());
        }
        let flags = i32::try_from((flags | OFlags::NOFOLLOW).bits()).map_err(|_| stale())?;
        sys::open_by_handle(self.root.as_fd(), handle, flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(bytes: &[u8]) -> FileHandle {
        FileHandle {
            handle_type: 1,
            bytes: bytes.to_vec(),
        }
    }

    fn table(dir: &std::path::Path) -> InodeTable {
        let root = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        InodeTable::new(root, &HashMap::new(), FIRST_GENERATION).unwrap()
    }

    #[test]
    fn a_reused_inode_number_gets_a_new_generation_that_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let (mut meta, _) = MetaStore::open(dir.path()).unwrap();
        let mut inodes = table(data.path());
        let first = inodes
            .generation_for(77, handle(b"gen-a"), &mut meta)
            .unwrap();
        assert_eq!(first, FIRST_GENERATION);
        assert_eq!(
            inodes
                .generation_for(77, handle(b"gen-a"), &mut meta)
                .unwrap(),
            first
        );
        // The same number with another handle: the inode was freed and reused.
        let second = inodes
            .generation_for(77, handle(b"gen-b"), &mut meta)
            .unwrap();
        assert!(second > first);
        drop((meta, inodes));

        let (mut meta, snapshot) = MetaStore::open(dir.path()).unwrap();
        let root = rustix::fs::open(
            data.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let mut inodes = InodeTable::new(root, &snapshot.inodes, snapshot.next_generation).unwrap();
        assert_eq!(
            inodes
                .generation_for(77, handle(b"gen-b"), &mut meta)
                .unwrap(),
            second
        );
        let third = inodes
            .generation_for(78, handle(b"other"), &mut meta)
            .unwrap();
        assert!(third > second, "the counter survives the restart");
        assert!(
            inodes
                .open(
                    Ident {
                        ino: 77,
                        generation: first
                    },
                    OFlags::PATH
                )
                .is_err()
        );
    }

    #[test]
    fn the_root_swaps_places_with_inode_number_one() {
        let data = tempfile::tempdir().unwrap();
        let inodes = table(data.path());
        let real_root = inodes.root_real_ino;
        assert_eq!(inodes.worker_ino(real_root), ROOT_INO);
        assert_eq!(inodes.worker_ino(ROOT_INO), real_root);
        assert_eq!(inodes.worker_ino(real_root + 1), real_root + 1);
    }
}
