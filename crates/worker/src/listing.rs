//! Directory listings kept between the batches of one readdir.
//!
//! A client lists a directory in batches, each resuming after the cookie of the last entry it
//! got ([`dir_cookie`](crate::fsops::dir_cookie): stable across restarts, so no state is
//! needed to resume). Finding where to resume takes the directory's names in cookie order;
//! scanning, hashing and sorting the whole directory for every batch makes a listing cost the
//! square of the directory's size. Instead, a listing from the start (offset 0: an `opendir` or
//! `rewinddir`) scans once and keeps the sorted names; the batches after it resume in them by
//! binary search. This is exactly what POSIX asks of a listing: an entry neither added nor
//! removed since the listing started is returned once; whether one added or removed since is
//! returned is unspecified (a removed one is skipped here when it cannot be opened). A batch
//! whose directory is not kept (evicted, or the worker restarted) scans again, which returns
//! every entry present then: still each unchanged entry once, since cookies do not move.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::inode::Ident;

/// A name with its cookie.
pub(crate) type Named = (u64, Box<[u8]>);

/// One directory's names in cookie order, with their cookies.
pub(crate) type Names = Arc<[Named]>;

/// How many directories' listings are kept.
const DIRECTORIES: usize = 16;
/// How many bytes of names all kept listings hold at most; a larger directory is listed
/// without keeping it (each batch scans it again).
const BYTES: usize = 64 << 20;

/// Recently started listings, most recent last.
#[derive(Debug, Default)]
pub(crate) struct Listings {
    kept: VecDeque<(Ident, Names, usize)>,
    bytes: usize,
}

impl Listings {
    /// The names of `dir` as a listing started earlier found them.
    pub(crate) fn get(&self, dir: Ident) -> Option<Names> {
        self.kept
            .iter()
            .find(|(id, _, _)| *id == dir)
            .map(|(_, names, _)| Arc::clone(names))
    }

    /// Keeps `names` (sorted by cookie) as `dir`'s listing, replacing an earlier one, and
    /// returns them.
    pub(crate) fn keep(&mut self, dir: Ident, names: Vec<Named>) -> Names {
        self.forget(dir);
        let size: usize = names.iter().map(|(_, name)| name.len() + 24).sum();
        let names: Names = names.into();
        if size > BYTES {
            return names;
        }
        while self.kept.len() == DIRECTORIES || self.bytes + size > BYTES {
            match self.kept.pop_front() {
                Some((_, _, dropped)) => self.bytes -= dropped,
                None => break,
            }
        }
        self.bytes += size;
        self.kept.push_back((dir, Arc::clone(&names), size));
        names
    }

    /// Drops `dir`'s listing, if kept.
    pub(crate) fn forget(&mut self, dir: Ident) {
        if let Some(at) = self.kept.iter().position(|(id, _, _)| *id == dir)
            && let Some((_, _, size)) = self.kept.remove(at)
        {
            self.bytes -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(ino: u64) -> Ident {
        Ident { ino, generation: 1 }
    }

    fn names(count: u64) -> Vec<Named> {
        (0..count)
            .map(|n| (n, format!("f{n}").into_bytes().into_boxed_slice()))
            .collect()
    }

    #[test]
    fn the_most_recent_listings_are_kept_within_their_bounds() {
        let mut listings = Listings::default();
        assert!(listings.get(dir(1)).is_none());
        let kept = listings.keep(dir(1), names(3));
        assert_eq!(listings.get(dir(1)).unwrap(), kept);
        // Started again: replaced, not doubled.
        listings.keep(dir(1), names(2));
        assert_eq!(listings.get(dir(1)).unwrap().len(), 2);
        assert_eq!(listings.kept.len(), 1);

        for ino in 2..=DIRECTORIES as u64 + 1 {
            listings.keep(dir(ino), names(1));
        }
        assert!(listings.get(dir(1)).is_none(), "the oldest went first");
        assert_eq!(listings.kept.len(), DIRECTORIES);
        let bytes: usize = listings.kept.iter().map(|k| k.2).sum();
        assert_eq!(listings.bytes, bytes);

        // Too large to keep: returned, not kept.
        let huge = vec![(1, vec![0u8; BYTES].into_boxed_slice())];
        assert_eq!(listings.keep(dir(99), huge).len(), 1);
        assert!(listings.get(dir(99)).is_none());
        listings.forget(dir(2));
        assert!(listings.get(dir(2)).is_none());
        assert_eq!(
            listings.bytes,
            listings.kept.iter().map(|k| k.2).sum::<usize>()
        );
    }
}
