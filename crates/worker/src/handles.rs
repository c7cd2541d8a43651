//! Open handles and their leases.
//!
//! An open handle is an open file description on the worker, named by a 64-bit handle ID. The
//! high 32 bits of every ID are a random number drawn when the volume is opened, so an ID
//! from before a restart never names a handle opened after it. Each handle has a lease that
//! the holder renews; handles whose lease has run out are reclaimed (closed) in the order of
//! their expiry, oldest first, whenever the apply loop runs.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;

use crate::inode::Ident;

/// One open handle.
#[derive(Debug)]
pub(crate) struct OpenHandle {
    pub(crate) file: File,
    pub(crate) ident: Ident,
    pub(crate) flags: u32,
    expires_at_ms: u64,
}

#[derive(Debug)]
pub(crate) struct HandleTable {
    prefix: u64,
    next: u32,
    open: HashMap<u64, OpenHandle>,
    by_expiry: BTreeSet<(u64, u64)>,
}

impl HandleTable {
    pub(crate) fn new(boot_nonce: u32) -> Self {
        Self {
            prefix: u64::from(boot_nonce) << 32,
            next: 1,
            open: HashMap::new(),
            by_expiry: BTreeSet::new(),
        }
    }

    /// Registers a new handle that expires at `expires_at_ms`, returning its ID.
    pub(crate) fn insert(
        &mut self,
        file: File,
        ident: Ident,
        flags: u32,
        expires_at_ms: u64,
    ) -> u64 {
        let id = self.prefix | u64::from(self.next);
        self.next = self.next.wrapping_add(1).max(1);
        self.open.insert(
            id,
            OpenHandle {
                file,
                ident,
                flags,
                expires_at_ms,
            },
        );
        self.by_expiry.insert((expires_at_ms, id));
        id
    }

    /// The handle `id`, when it is open and belongs to `ident`.
    pub(crate) fn get(&self, id: u64, ident: Ident) -> Option<&OpenHandle> {
        self.open.get(&id).filter(|h| h.ident == ident)
    }

    /// Extends the lease of `id`; false when the handle is unknown.
    pub(crate) fn renew(&mut self, id: u64, expires_at_ms: u64) -> bool {
        let Some(handle) = self.open.get_mut(&id) else {
            return false;
        };
        self.by_expiry.remove(&(handle.expires_at_ms, id));
        handle.expires_at_ms = handle.expires_at_ms.max(expires_at_ms);
        self.by_expiry.insert((handle.expires_at_ms, id));
        true
    }

    /// Closes the handle `id`; releasing an unknown handle is not an error.
    pub(crate) fn remove(&mut self, id: u64) -> Option<OpenHandle> {
        let handle = self.open.remove(&id)?;
        self.by_expiry.remove(&(handle.expires_at_ms, id));
        Some(handle)
    }

    /// Closes every handle whose lease ended at or before `now_ms`, oldest first, and returns
    /// their IDs in that order.
    pub(crate) fn reclaim(&mut self, now_ms: u64) -> Vec<u64> {
        let mut reclaimed = Vec::new();
        while let Some(&(expires_at_ms, id)) = self.by_expiry.first() {
            if expires_at_ms > now_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.open.remove(&id);
            reclaimed.push(id);
        }
        reclaimed
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> File {
        tempfile::tempfile().unwrap()
    }

    const ID: Ident = Ident {
        ino: 5,
        generation: 2,
    };

    #[test]
    fn reclaims_in_expiry_order_and_renewal_defers() {
        let mut table = HandleTable::new(7);
        let a = table.insert(file(), ID, 0, 100);
        let b = table.insert(file(), ID, 0, 50);
        let c = table.insert(file(), ID, 0, 300);
        assert_eq!(a >> 32, 7);
        assert!(table.renew(b, 200));
        assert_eq!(table.reclaim(250), vec![a, b]);
        assert!(!table.renew(a, 1000), "a reclaimed handle does not renew");
        assert!(table.get(c, ID).is_some());
        assert!(
            table
                .get(
                    c,
                    Ident {
                        ino: 5,
                        generation: 3
                    }
                )
                .is_none()
        );
        assert!(table.remove(c).is_some());
        assert!(table.remove(c).is_none());
        assert_eq!(table.len(), 0);
    }
}
