//! Writing ahead the tables a successor needs: every node and open handle the kernel is
//! handed reaches a safe place (the node's keeper) before the reply that hands it over.
//!
//! When the process serving a connection dies, the kernel keeps the nodes and handles it was
//! given and names them in its next requests: a working directory, an open file, a file
//! unlinked while open. Whoever serves the connection next must know what they stand for.
//! [`Fs`](crate::Fs) tells a [`WriteAhead`] about every change: a new node or open handle
//! before the reply that hands it to the kernel ([`WriteAhead::record`], which the reply
//! waits for), a delivered, forgotten or released one afterwards ([`WriteAhead::note`]). The
//! tables written ahead may hold more than the kernel does (an entry of a READDIRPLUS reply
//! that did not fit in the kernel's buffer, a handle whose OPEN reply never reached the
//! kernel), never less.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use super::handles::HandleState;

/// One change to the tables of nodes and open handles the kernel holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableChange {
    /// The kernel is handed node `node` with this inode generation: a node it did not hold,
    /// or a reused inode number with a new generation.
    Node {
        /// The node ID (the worker's inode number).
        node: u64,
        /// The worker's inode generation.
        inode_generation: u64,
    },
    /// The kernel forgot every lookup of `node`.
    Forgotten {
        /// The node ID.
        node: u64,
    },
    /// A kernel request (an OPEN or CREATE) opened `handle`; its reply is not sent yet.
    Opened {
        /// The handle, its file and open flags, and the request
        /// ([`HandleState::opened_by`], always set here).
        handle: HandleState,
    },
    /// The kernel took the reply that handed it `handle`.
    Delivered {
        /// The FUSE file handle.
        handle: u64,
    },
    /// The kernel released `handle`.
    Released {
        /// The FUSE file handle.
        handle: u64,
    },
    /// The first request this owner read that was not resent, after it took the connection
    /// over from an owner that died ([`ResendRule`](crate::ResendRule)'s boundary).
    FirstRead {
        /// The request's ID without its resend and interrupt bits.
        unique: u64,
    },
}

impl TableChange {
    /// The kernel is handed `file`'s node.
    pub fn node(file: lease_client::protocol::FileId) -> TableChange {
        TableChange::Node {
            node: file.ino,
            inode_generation: file.inode_generation,
        }
    }
}

/// The future [`WriteAhead::record`] returns.
pub type Recorded<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Where the tables are written ahead. The node's mount owner sends them to its keeper.
pub trait WriteAhead: Send + Sync + fmt::Debug + 'static {
    /// Records `changes` that a reply about to be sent depends on; the reply waits until the
    /// future resolves. It should resolve once the changes are safe, or once they cannot be
    /// made safe (with no keeper to hold them, a crash ends the connection anyway, so the
    /// reply need not wait longer).
    fn record(&self, changes: Vec<TableChange>) -> Recorded<'_>;

    /// Records `changes` no reply waits for (delivered handles, forgotten nodes, released
    /// handles), after any change recorded before.
    fn note(&self, changes: Vec<TableChange>);
}
