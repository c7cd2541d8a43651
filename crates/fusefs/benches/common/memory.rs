//! What the benchmarks' in-memory workers answer with: entries of a tree that lives nowhere.

use lease_client::protocol::{ROOT_INO, ROOT_INODE_GENERATION};
use lease_client::v1;

/// The entry of `ino`: a directory (mode 0755, two links) or a regular file of `size` bytes
/// (mode 0644, one link), of generation 1 (the root's own generation for the root).
pub(crate) fn entry(ino: u64, directory: bool, size: u64) -> v1::Entry {
    v1::Entry {
        file: Some(v1::FileId {
            ino,
            inode_generation: if ino == ROOT_INO {
                ROOT_INODE_GENERATION
            } else {
                1
            },
        }),
        attr: Some(v1::Attr {
            mode: if directory {
                libc::S_IFDIR | 0o755
            } else {
                libc::S_IFREG | 0o644
            },
            nlink: if directory { 2 } else { 1 },
            size: if directory { 0 } else { size },
            blksize: 4096,
            ..v1::Attr::default()
        }),
    }
}
