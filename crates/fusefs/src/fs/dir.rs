//! Directory listings: READDIR and READDIRPLUS from worker batches, and the lookups a
//! READDIRPLUS reply hands the kernel.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use lease_client::protocol::FileId;
use lease_client::v1;
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;

use super::{Caller, Fs, TTL, TableChange, lock};
use crate::attr::{file_attr, kind_of_entry};
use crate::error::Error;
use crate::reply::{DirEntry, DirEntryPlus, Entry, FileKind, Opened};
use crate::service::FileService;

impl<S: FileService> Fs<S> {
    /// One worker readdir batch after FUSE offset `offset`: `.` and `..` take the FUSE offsets
    /// 1 and 2, and the worker's cookie `c` is FUSE offset `c + 2`.
    async fn readdir_batch(
        &self,
        caller: Caller,
        dir: FileId,
        offset: u64,
        plus: bool,
    ) -> Result<(Vec<v1::DirEntry>, bool), Error> {
        let op = Op::Readdir(v1::ReaddirRequest {
            dir: Some(dir.into()),
            handle: None,
            offset: offset.saturating_sub(2),
            max_entries: self.config.readdir_batch,
            plus,
        });
        // READDIRPLUS may have asked for the directory's attributes first (call 0, and 1 for
        // its retry through an open handle): its listing is call 2.
        let index = if plus { 2 } else { 0 };
        let reply = expect!(self.call_at(caller, index, op).await?, Readdir);
        Ok((reply.entries, reply.end))
    }

    /// The FUSE offset after the entry with worker cookie `cookie`; the kernel's directory
    /// offsets are signed, so it is at most `i64::MAX`.
    fn fuse_offset(cookie: u64) -> Result<u64, Error> {
        cookie
            .checked_add(2)
            .filter(|o| i64::try_from(*o).is_ok())
            .ok_or(Error::malformed(
                "readdir",
                "a directory offset out of range",
            ))
    }

    /// OPENDIR: directories are read statelessly by offset, so no worker handle is opened and
    /// the handle is 0.
    pub fn opendir(&self) -> Opened {
        Opened {
            handle: 0,
            flags: 0,
        }
    }

    /// READDIR from FUSE offset `offset`: one worker batch (the kernel asks again for more).
    pub async fn readdir(
        &self,
        caller: Caller,
        node: u64,
        offset: u64,
    ) -> Result<Vec<DirEntry>, Error> {
        let dir = self.file(node)?;
        let mut out = Vec::new();
        for (at, name) in [(0u64, "."), (1, "..")] {
            if offset <= at {
                out.push(DirEntry {
                    ino: dir.ino,
                    kind: FileKind::Directory,
                    name: name.into(),
                    offset: at + 1,
                });
            }
        }
        let (entries, _end) = self
            .readdir_batch(caller, dir, offset.max(2), false)
            .await?;
        for e in entries {
            let ino = e.file.map_or(0, |f| f.ino);
            out.push(DirEntry {
                ino,
                kind: kind_of_entry(e.file_type),
                name: OsStr::from_bytes(&e.name).to_owned(),
                offset: Self::fuse_offset(e.next_offset)?,
            });
        }
        Ok(out)
    }

    /// READDIRPLUS from FUSE offset `offset`: entries with attributes, as a [`PlusListing`]
    /// that counts each entry the kernel takes as a lookup (except `.` and `..`), and only
    /// those: the kernel's buffer may take fewer entries than were read.
    pub async fn readdirplus(
        &self,
        caller: Caller,
        node: u64,
        offset: u64,
    ) -> Result<PlusListing<'_, S>, Error> {
        let dir = self.file(node)?;
        let mut out = Vec::new();
        if offset < 2 {
            let attr = self.getattr(caller, node, None).await?.attr;
            for (at, name) in [(0u64, "."), (1, "..")] {
                if offset <= at {
                    out.push(DirEntryPlus {
                        dirent: DirEntry {
                            ino: dir.ino,
                            kind: FileKind::Directory,
                            name: name.into(),
                            offset: at + 1,
                        },
                        entry: Entry {
                            attr,
                            generation: dir.inode_generation,
                            ttl: TTL,
                        },
                    });
                }
            }
        }
        let (entries, _end) = self.readdir_batch(caller, dir, offset.max(2), true).await?;
        for e in entries {
            let (Some(file), Some(attr)) = (e.file, e.attr) else {
                return Err(Error::malformed(
                    "readdir",
                    "an entry without file or attributes",
                ));
            };
            let file = FileId::from(file);
            out.push(DirEntryPlus {
                dirent: DirEntry {
                    ino: file.ino,
                    kind: kind_of_entry(e.file_type),
                    name: OsStr::from_bytes(&e.name).to_owned(),
                    offset: Self::fuse_offset(e.next_offset)?,
                },
                entry: Entry {
                    attr: file_attr(file.ino, &attr),
                    generation: file.inode_generation,
                    ttl: TTL,
                },
            });
        }
        // Written ahead before the reply, every entry the kernel may take and does not hold
        // yet (those that will not fit in its buffer too: more than it holds, never less).
        let written: Vec<FileId> = {
            let nodes = lock(&self.nodes);
            out.iter()
                .filter(|e| e.dirent.name != "." && e.dirent.name != "..")
                .map(|e| FileId {
                    ino: e.dirent.ino,
                    inode_generation: e.entry.generation,
                })
                .filter(|file| !nodes.holds(*file))
                .collect()
        };
        self.write_ahead(written.iter().copied().map(TableChange::node).collect())
            .await;
        Ok(PlusListing {
            fs: self,
            entries: out.into_iter(),
            pulled: None,
            written,
        })
    }

    /// The kernel took `entry` from a READDIRPLUS reply: it now holds one lookup of it.
    /// `written` are the entries written ahead for the reply.
    fn delivered(&self, taken: &DirEntryPlus, written: &[FileId]) {
        if taken.dirent.name != "." && taken.dirent.name != ".." {
            let file = FileId {
                ino: taken.dirent.ino,
                inode_generation: taken.entry.generation,
            };
            // Written ahead by `readdirplus` already, if the kernel did not hold it then. If it
            // did and a FORGET took its last lookup since (noted), it is new again and was not
            // written ahead: noted after the FORGET.
            let mut nodes = lock(&self.nodes);
            if nodes.looked_up(file) && !written.contains(&file) {
                self.note(vec![TableChange::node(file)]);
            }
        }
    }
}

/// The entries of one READDIRPLUS reply, handed out one at a time to whatever fills the
/// kernel's reply buffer (the session layer), with the lookup accounting that needs.
///
/// The filler pulls an entry, then checks whether it fits in the kernel's buffer and, when it
/// does not, stops without sending it. So an entry counts as a lookup the kernel holds only
/// once the next one is pulled, or the listing is found to be finished: counting on the pull
/// itself leaked one lookup, and so one node forever, per full reply. An entry pulled last and
/// never followed by another pull is not counted; dropping the listing early counts nothing
/// more.
#[derive(Debug)]
pub struct PlusListing<'a, S> {
    fs: &'a Fs<S>,
    entries: std::vec::IntoIter<DirEntryPlus>,
    /// The entry handed out last, not yet known to have been taken.
    pulled: Option<DirEntryPlus>,
    /// The entries written ahead for the reply (those the kernel did not hold).
    written: Vec<FileId>,
}

impl<S: FileService> Iterator for PlusListing<'_, S> {
    type Item = DirEntryPlus;

    fn next(&mut self) -> Option<DirEntryPlus> {
        if let Some(taken) = self.pulled.take() {
            self.fs.delivered(&taken, &self.written);
        }
        let entry = self.entries.next()?;
        self.pulled = Some(entry.clone());
        Some(entry)
    }
}
