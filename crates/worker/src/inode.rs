//! Stable inode numbers and inode generations over the backing directory.
//!
//! The worker's inode number of a file is the backing filesystem's own `st_ino`, except that
//! the volume root and inode number [`ROOT_INO`] swap places (a bijection, so no two files
//! share a number and the root is always [`ROOT_INO`]). The inode generation comes from a
//! volume-wide counter persisted in the journal: the first time the worker names an inode it
//! records the inode's generation together with the filesystem's file handle for it
//! (`name_to_handle_at(2)`, which needs no privilege). Naming the same inode number again with
//! a different file handle means the number was reused by another file, which then gets the
//! next generation. Both survive a restart because they are journaled (fsynced) before any
//! reply carries them.
//!
//! A file is opened again by its inode number in one of two ways ([`Reopen`]); generations and
//! the `ESTALE` answer for a reused number are the same in both:
//!
//! - **By handle** (the default, and production's): `open_by_handle_at(2)` relative to the
//!   volume's data directory, so renames and hard links need no bookkeeping, no path is ever
//!   walked, and nothing is held open per file. It needs `CAP_DAC_READ_SEARCH`; a volume
//!   refuses to open without it, rather than failing on its first file. References survive a
//!   restart. An inode whose last link is gone opens only while something else keeps it
//!   alive (an open handle, say), and is `ESTALE` once the filesystem has freed it.
//! - **By descriptor** (tests and unprivileged experiments): the table keeps an `O_PATH`
//!   descriptor of every inode it names (taken in [`InodeTable::identify`], never a readable or
//!   writable one) and opens it again through its magic link `/proc/self/fd/<n>`. That link
//!   leads to the inode itself, not to a path walked anew, so no name is resolved and no
//!   symbolic link is followed. `O_NOFOLLOW` cannot be passed there (it would stop at the
//!   magic link), so the table refuses any open of a link without `O_PATH` with `ELOOP`
//!   itself, exactly as by handle. The costs:
//!   - One descriptor per named inode, until [`InodeTable::forget`] (the last link removed
//!     through the worker) drops it. The process's `RLIMIT_NOFILE` therefore bounds how many
//!     files a volume can name at once; the worker does not raise it. Past it, the operation
//!     that names one more fails with `EMFILE`, and the inode's entry stays without a
//!     descriptor (as after a restart) until a later naming finds room.
//!   - The descriptor keeps its inode alive: a file whose last link went away outside the
//!     worker still opens (and keeps its disk space) until the worker forgets it or stops.
//!     Through the worker, the last unlink forgets it, so it is `ESTALE` as by handle.
//!   - A restart (a new table loaded from the journal) has no descriptors: an inode named
//!     before it is `ESTALE` until it is named again (looked up, listed, created), after which
//!     it opens with its recorded generation, because its file handle has not changed.
//!
//! The volume root is never in the table: it is the data directory's own descriptor.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};

use rustix::fs::{FileType, Mode, OFlags, Stat};

use crate::config::Reopen;
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

/// What the table knows of one named inode.
#[derive(Debug)]
struct Named {
    generation: u64,
    handle: FileHandle,
    /// By descriptor, an `O_PATH` descriptor of the inode; `None` by handle, and by descriptor
    /// for an inode not named again since the table was loaded.
    path: Option<OwnedFd>,
}

/// How the table opens a named inode again.
#[derive(Debug)]
enum Reopening {
    ByHandle,
    /// `proc_fds` is `/proc/self/fd`, where the kept descriptors are opened again.
    ByDescriptor {
        proc_fds: OwnedFd,
    },
}

/// Why a volume's files cannot be named or opened in the configured way.
#[derive(Debug)]
pub(crate) struct SetupError {
    /// What could not be done to the data directory, as `Error::Io` words it.
    pub(crate) action: &'static str,
    pub(crate) source: io::Error,
}

#[derive(Debug)]
pub(crate) struct InodeTable {
    root: OwnedFd,
    root_real_ino: u64,
    entries: HashMap<u64, Named>,
    next_generation: u64,
    reopening: Reopening,
}

impl InodeTable {
    /// `root` is a descriptor of the volume's data directory, not `O_PATH`
    /// (`open_by_handle_at(2)` refuses one as its mount descriptor). Fails when the filesystem
    /// makes no file handles, or when files cannot be opened again the way `reopen` says (no
    /// `CAP_DAC_READ_SEARCH`, no `/proc`).
    pub(crate) fn new(
        root: OwnedFd,
        entries: &HashMap<u64, InodeEntry>,
        next_generation: u64,
        reopen: Reopen,
    ) -> Result<Self, SetupError> {
        let failed = |action| move |source: io::Error| SetupError { action, source };
        let root_real_ino = rustix::fs::fstat(&root)
            .map_err(|e| failed("inspect")(e.into()))?
            .st_ino;
        let root_handle =
            sys::name_to_handle(root.as_fd()).map_err(failed("make file handles in"))?;
        let reopening = match reopen {
            Reopen::ByHandle => {
                sys::open_by_handle(root.as_fd(), &root_handle, libc::O_PATH).map_err(failed(
                    "open files by handle (which needs CAP_DAC_READ_SEARCH) in",
                ))?;
                Reopening::ByHandle
            }
            Reopen::ByDescriptor => {
                let through_proc = failed("open files through /proc/self/fd in");
                let proc_fds = rustix::fs::open(
                    "/proc/self/fd",
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| through_proc(e.into()))?;
                reopen_through(&proc_fds, root.as_fd(), OFlags::PATH).map_err(through_proc)?;
                Reopening::ByDescriptor { proc_fds }
            }
        };
        let entries = entries
            .values()
            .filter_map(|e| {
                let named = Named {
                    generation: e.generation,
                    handle: e.file_handle()?,
                    path: None,
                };
                Some((e.ino, named))
            })
            .collect();
        Ok(Self {
            root,
            root_real_ino,
            entries,
            next_generation: next_generation.max(FIRST_GENERATION),
            reopening,
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
            .map(|(&ino, named)| (ino, InodeEntry::new(ino, named.generation, &named.handle)))
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
    /// generation durably when the inode number is new or was reused. By descriptor it also
    /// keeps an `O_PATH` descriptor of the inode, unless one is kept already.
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
        self.keep_descriptor(ino, fd)?;
        Ok(Ident { ino, generation })
    }

    /// The generation of inode number `ino` whose file handle is `handle`: the recorded one
    /// when the handle matches, otherwise a new one, journaled before it is returned (and
    /// replacing the old entry with its descriptor, if any).
    fn generation_for(
        &mut self,
        ino: u64,
        handle: FileHandle,
        meta: &mut MetaStore,
    ) -> Result<u64, OpError> {
        if let Some(named) = self.entries.get(&ino)
            && named.handle == handle
        {
            return Ok(named.generation);
        }
        let generation = self.next_generation;
        meta.append(&Record::Inode(InodeEntry::new(ino, generation, &handle)))
            .map_err(OpError::Journal)?;
        self.next_generation += 1;
        let named = Named {
            generation,
            handle,
            path: None,
        };
        self.entries.insert(ino, named);
        Ok(generation)
    }

    /// By descriptor, keeps an `O_PATH` descriptor of the inode `fd` refers to (named `ino`)
    /// when none is kept yet. A new descriptor, not a duplicate of `fd`, which may be open for
    /// reading or writing. When it cannot be made (`EMFILE`) the entry stays without one, as
    /// after a restart, and the caller's operation fails.
    fn keep_descriptor(&mut self, ino: u64, fd: BorrowedFd<'_>) -> io::Result<()> {
        let Reopening::ByDescriptor { proc_fds } = &self.reopening else {
            return Ok(());
        };
        if let Some(named) = self.entries.get_mut(&ino)
            && named.path.is_none()
        {
            named.path = Some(reopen_through(proc_fds, fd, OFlags::PATH)?);
        }
        Ok(())
    }

    /// Forgets an inode number whose last link is gone, closing its descriptor by descriptor
    /// (best effort: not fsynced, because a forgotten entry only saves memory; a later reuse
    /// is detected by its handle anyway).
    pub(crate) fn forget(&mut self, ino: u64, meta: &mut MetaStore) {
        if self.entries.remove(&ino).is_some() {
            let _ = meta.append_unsynced(&Record::Forget { ino });
        }
    }

    /// Opens the file `id` names with `flags` (add `O_PATH` for a reference only); symbolic
    /// links are never followed. A number the worker never issued, a wrong generation or a
    /// file that is gone give `ESTALE`, and so does, by descriptor, a file not named again
    /// since a restart.
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
                Mode::empty(),
            )?);
        }
        let named = self
            .entries
            .get(&id.ino)
            .filter(|named| named.generation == id.generation)
            .ok_or_else(stale)?;
        match &self.reopening {
            Reopening::ByHandle => {
                let flags =
                    i32::try_from((flags | OFlags::NOFOLLOW).bits()).map_err(|_| stale())?;
                sys::open_by_handle(self.root.as_fd(), &named.handle, flags)
            }
            Reopening::ByDescriptor { proc_fds } => {
                let path = named.path.as_ref().ok_or_else(stale)?;
                // What O_NOFOLLOW does by handle, whatever else `flags` asks: a symbolic link
                // opens as a reference only.
                if !flags.contains(OFlags::PATH)
                    && FileType::from_raw_mode(rustix::fs::fstat(path)?.st_mode)
                        == FileType::Symlink
                {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                reopen_through(proc_fds, path.as_fd(), flags)
            }
        }
    }

    /// How many `O_PATH` descriptors the table keeps.
    #[cfg(test)]
    fn kept_descriptors(&self) -> usize {
        self.entries.values().filter(|n| n.path.is_some()).count()
    }
}

/// Opens the inode `fd` refers to anew with `flags`, through its magic link in `/proc/self/fd`
/// (`proc_fds`). The link leads to the inode itself, so nothing is resolved by name and no
/// symbolic link is followed: a link opens as itself with `O_PATH`, and fails otherwise.
/// `O_NOFOLLOW` is dropped, because it would stop at the magic link itself; so that a link
/// fails as it does by handle (`ELOOP`, whatever else the flags say), [`InodeTable::open`]
/// refuses it before calling this.
fn reopen_through(proc_fds: &OwnedFd, fd: BorrowedFd<'_>, flags: OFlags) -> io::Result<OwnedFd> {
    let name = fd.as_raw_fd().to_string();
    Ok(rustix::fs::openat(
        proc_fds,
        name.as_str(),
        flags.difference(OFlags::NOFOLLOW) | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The way this crate's tests open files again: by handle, production's way, as root (as CI
/// runs), else by descriptor, which needs no privilege.
#[cfg(test)]
pub(crate) fn reopen_for_tests() -> Reopen {
    if rustix::process::geteuid().is_root() {
        Reopen::ByHandle
    } else {
        Reopen::ByDescriptor
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::path::Path;

    use super::*;

    fn handle(bytes: &[u8]) -> FileHandle {
        FileHandle {
            handle_type: 1,
            bytes: bytes.to_vec(),
        }
    }

    fn data_dir(dir: &Path) -> OwnedFd {
        rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    fn table(dir: &Path, reopen: Reopen) -> InodeTable {
        InodeTable::new(data_dir(dir), &HashMap::new(), FIRST_GENERATION, reopen).unwrap()
    }

    /// The ways this process can test: by descriptor always, by handle too as root.
    fn ways() -> Vec<Reopen> {
        let mut ways = vec![Reopen::ByDescriptor];
        if reopen_for_tests() == Reopen::ByHandle {
            ways.push(Reopen::ByHandle);
        }
        ways
    }

    /// A data directory, its inode table and a journal, as a volume holds them.
    struct Fixture {
        data: tempfile::TempDir,
        state: tempfile::TempDir,
        meta: MetaStore,
        inodes: InodeTable,
    }

    impl Fixture {
        fn new(reopen: Reopen) -> Self {
            let data = tempfile::tempdir().unwrap();
            let state = tempfile::tempdir().unwrap();
            let (meta, _) = MetaStore::open(state.path()).unwrap();
            let inodes = table(data.path(), reopen);
            Fixture {
                data,
                state,
                meta,
                inodes,
            }
        }

        fn path(&self, name: &str) -> std::path::PathBuf {
            self.data.path().join(name)
        }

        /// Names the file at `name` as a lookup does: from an `O_PATH` descriptor.
        fn name(&mut self, name: &str) -> Ident {
            let fd = rustix::fs::open(
                self.path(name),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            let stat = rustix::fs::fstat(&fd).unwrap();
            self.inodes
                .identify(fd.as_fd(), &stat, &mut self.meta)
                .unwrap()
        }

        fn read(&self, id: Ident) -> io::Result<String> {
            let mut text = String::new();
            std::fs::File::from(self.inodes.open(id, OFlags::RDONLY)?).read_to_string(&mut text)?;
            Ok(text)
        }

        /// The table a restarted worker loads from the journal.
        fn restart(&mut self, reopen: Reopen) {
            let (meta, snapshot) = MetaStore::open(self.state.path()).unwrap();
            self.meta = meta;
            self.inodes = InodeTable::new(
                data_dir(self.data.path()),
                &snapshot.inodes,
                snapshot.next_generation,
                reopen,
            )
            .unwrap();
        }
    }

    fn errno(result: io::Result<impl std::fmt::Debug>) -> Option<i32> {
        result.err().and_then(|e| e.raw_os_error())
    }

    #[test]
    fn a_reused_inode_number_gets_a_new_generation_that_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let (mut meta, _) = MetaStore::open(dir.path()).unwrap();
        let mut inodes = table(data.path(), reopen_for_tests());
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
        let mut inodes = InodeTable::new(
            data_dir(data.path()),
            &snapshot.inodes,
            snapshot.next_generation,
            reopen_for_tests(),
        )
        .unwrap();
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
        let inodes = table(data.path(), reopen_for_tests());
        let real_root = inodes.root_real_ino;
        assert_eq!(inodes.worker_ino(real_root), ROOT_INO);
        assert_eq!(inodes.worker_ino(ROOT_INO), real_root);
        assert_eq!(inodes.worker_ino(real_root + 1), real_root + 1);
    }

    #[test]
    fn a_renamed_file_opens_by_its_inode() {
        for way in ways() {
            let mut fx = Fixture::new(way);
            std::fs::create_dir(fx.path("a")).unwrap();
            std::fs::create_dir(fx.path("b")).unwrap();
            std::fs::write(fx.path("a/file"), "contents").unwrap();
            let id = fx.name("a/file");
            std::fs::rename(fx.path("a/file"), fx.path("b/moved")).unwrap();
            assert_eq!(fx.read(id).unwrap(), "contents", "{way:?}");
            let mut writable = std::fs::File::from(fx.inodes.open(id, OFlags::WRONLY).unwrap());
            io::Write::write_all(&mut writable, b"CONTENTS").unwrap();
            assert_eq!(std::fs::read(fx.path("b/moved")).unwrap(), b"CONTENTS");
        }
    }

    #[test]
    fn a_reused_inode_number_is_stale() {
        for way in ways() {
            let mut fx = Fixture::new(way);
            std::fs::write(fx.path("old"), "old").unwrap();
            std::fs::write(fx.path("new"), "new").unwrap();
            let old = fx.name("old");
            // "new" as it would be named had it got the number of "old": same number, another
            // file handle.
            let fd = rustix::fs::open(fx.path("new"), OFlags::PATH, Mode::empty()).unwrap();
            let mut stat = rustix::fs::fstat(&fd).unwrap();
            stat.st_ino = rustix::fs::stat(fx.path("old")).unwrap().st_ino;
            let new = fx.inodes.identify(fd.as_fd(), &stat, &mut fx.meta).unwrap();
            assert_eq!(new.ino, old.ino);
            assert!(new.generation > old.generation, "{way:?}");
            assert_eq!(errno(fx.read(old)), Some(libc::ESTALE), "{way:?}");
            assert_eq!(fx.read(new).unwrap(), "new", "{way:?}");
        }
    }

    #[test]
    fn every_kind_of_file_reopens_with_the_flags_the_worker_uses() {
        for way in ways() {
            let mut fx = Fixture::new(way);
            std::fs::create_dir(fx.path("dir")).unwrap();
            std::fs::write(fx.path("dir/inside"), "").unwrap();
            std::fs::write(fx.path("file"), "").unwrap();
            // A link to a directory of the volume: following it would open "dir".
            std::os::unix::fs::symlink("dir", fx.path("link")).unwrap();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                fx.path("fifo"),
                FileType::Fifo,
                Mode::from_raw_mode(0o644),
                0,
            )
            .unwrap();
            let [dir, file, link, fifo] = ["dir", "file", "link", "fifo"].map(|n| fx.name(n));
            let kind =
                |fd: OwnedFd| FileType::from_raw_mode(rustix::fs::fstat(&fd).unwrap().st_mode);
            let open = |id, flags| fx.inodes.open(id, flags);

            // path_fd and dir_fd
            assert_eq!(kind(open(link, OFlags::PATH).unwrap()), FileType::Symlink);
            assert_eq!(kind(open(fifo, OFlags::PATH).unwrap()), FileType::Fifo);
            assert_eq!(
                kind(open(dir, OFlags::PATH | OFlags::DIRECTORY).unwrap()),
                FileType::Directory
            );
            for not_a_dir in [file, link, fifo] {
                assert_eq!(
                    errno(open(not_a_dir, OFlags::PATH | OFlags::DIRECTORY)),
                    Some(libc::ENOTDIR),
                    "{way:?}"
                );
            }
            let target =
                rustix::fs::readlinkat(open(link, OFlags::PATH).unwrap(), c"", Vec::new()).unwrap();
            assert_eq!(target.as_bytes(), b"dir");

            // readdir
            let listing = open(dir, OFlags::RDONLY | OFlags::DIRECTORY).unwrap();
            let names: Vec<_> = rustix::fs::Dir::read_from(&listing)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_bytes().to_vec())
                .collect();
            assert!(names.contains(&b"inside".to_vec()), "{way:?}");

            // open_handle and setattr's truncation
            assert_eq!(
                errno(open(link, OFlags::RDONLY)),
                Some(libc::ELOOP),
                "{way:?}"
            );
            assert_eq!(
                errno(open(link, OFlags::RDONLY | OFlags::DIRECTORY)),
                Some(libc::ELOOP),
                "{way:?}"
            );
            assert_eq!(
                errno(open(dir, OFlags::WRONLY)),
                Some(libc::EISDIR),
                "{way:?}"
            );
            assert_eq!(
                kind(open(fifo, OFlags::RDONLY | OFlags::NONBLOCK).unwrap()),
                FileType::Fifo
            );
            std::fs::write(fx.path("file"), "longer").unwrap();
            rustix::fs::ftruncate(open(file, OFlags::WRONLY).unwrap(), 2).unwrap();
            assert_eq!(std::fs::read(fx.path("file")).unwrap(), b"lo");
        }
    }

    #[test]
    fn by_descriptor_a_file_unlinked_behind_the_worker_opens_until_forgotten() {
        let mut fx = Fixture::new(Reopen::ByDescriptor);
        std::fs::write(fx.path("doomed"), "still here").unwrap();
        let id = fx.name("doomed");
        assert_eq!(fx.inodes.kept_descriptors(), 1);
        std::fs::remove_file(fx.path("doomed")).unwrap();
        // The kept descriptor holds the inode, so it still opens.
        assert_eq!(fx.read(id).unwrap(), "still here");
        fx.inodes.forget(id.ino, &mut fx.meta);
        assert_eq!(
            fx.inodes.kept_descriptors(),
            0,
            "forget closes the descriptor"
        );
        assert_eq!(errno(fx.read(id)), Some(libc::ESTALE));
    }

    #[test]
    fn by_handle_an_unlinked_file_opens_only_while_something_holds_it() {
        if !test_support::requires_root(
            "by_handle_an_unlinked_file_opens_only_while_something_holds_it",
            "opening by handle needs CAP_DAC_READ_SEARCH",
        ) {
            return;
        }
        let mut fx = Fixture::new(Reopen::ByHandle);
        std::fs::write(fx.path("doomed"), "still here").unwrap();
        let id = fx.name("doomed");
        assert_eq!(fx.inodes.kept_descriptors(), 0, "by handle nothing is held");
        let held = std::fs::File::open(fx.path("doomed")).unwrap();
        std::fs::remove_file(fx.path("doomed")).unwrap();
        assert_eq!(fx.read(id).unwrap(), "still here");
        drop(held);
        assert_eq!(errno(fx.read(id)), Some(libc::ESTALE));
    }

    #[test]
    fn forget_drops_the_descriptor_and_the_file_id() {
        let mut fx = Fixture::new(Reopen::ByDescriptor);
        std::fs::write(fx.path("a"), "a").unwrap();
        std::fs::write(fx.path("b"), "b").unwrap();
        let a = fx.name("a");
        let b = fx.name("b");
        assert_eq!(fx.name("a"), a, "naming again keeps the one descriptor");
        assert_eq!(fx.inodes.kept_descriptors(), 2);
        fx.inodes.forget(a.ino, &mut fx.meta);
        assert_eq!(fx.inodes.kept_descriptors(), 1);
        assert_eq!(errno(fx.inodes.open(a, OFlags::PATH)), Some(libc::ESTALE));
        assert_eq!(fx.read(b).unwrap(), "b");
    }

    #[test]
    fn by_descriptor_a_restart_loses_references_until_the_file_is_named_again() {
        let mut fx = Fixture::new(Reopen::ByDescriptor);
        std::fs::write(fx.path("file"), "kept").unwrap();
        let id = fx.name("file");
        fx.restart(Reopen::ByDescriptor);
        assert_eq!(fx.inodes.kept_descriptors(), 0);
        assert_eq!(errno(fx.read(id)), Some(libc::ESTALE));
        assert_eq!(fx.name("file"), id, "the same handle keeps its generation");
        assert_eq!(fx.read(id).unwrap(), "kept");
    }
}
