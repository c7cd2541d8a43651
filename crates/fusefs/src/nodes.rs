//! The kernel's view of the worker's files: node IDs, their inode generations and lookup
//! counts.
//!
//! A FUSE node ID *is* the worker's inode number (the volume root is inode 1 on the worker and
//! node 1 in FUSE), and the FUSE generation is the worker's inode generation. Nothing here is a
//! per-process counter or an address, so another process holding the same table could answer
//! the same kernel connection.

use std::collections::HashMap;

use lease_client::protocol::{FileId, ROOT_INO};

/// A known node: its inode generation and how many lookups the kernel holds on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Node {
    inode_generation: u64,
    lookups: u64,
}

/// One node the kernel holds, as data: what a process taking over the connection must know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeState {
    /// The FUSE node ID, which is the worker's inode number.
    pub node: u64,
    /// The worker's inode generation, which is the FUSE generation.
    pub inode_generation: u64,
    /// How many lookups of it the kernel holds (FORGET counts them down).
    pub lookups: u64,
}

/// The nodes the kernel knows about.
#[derive(Debug)]
pub(crate) struct Nodes {
    nodes: HashMap<u64, Node>,
}

impl Nodes {
    /// A table holding only the root, which the kernel never forgets.
    pub(crate) fn new(root_generation: u64) -> Self {
        let root = Node {
            inode_generation: root_generation,
            lookups: 1,
        };
        Nodes {
            nodes: HashMap::from([(ROOT_INO, root)]),
        }
    }

    /// The table a previous server of the connection held ([`crate::Fs::state`]), with its
    /// lookup counts. The root is always there, with the given generation.
    pub(crate) fn restore(root_generation: u64, states: &[NodeState]) -> Self {
        let mut table = Nodes::new(root_generation);
        for state in states.iter().filter(|s| s.node != ROOT_INO) {
            table.nodes.insert(
                state.node,
                Node {
                    inode_generation: state.inode_generation,
                    lookups: state.lookups,
                },
            );
        }
        table
    }

    /// The worker file behind a node ID, if the kernel may use that ID.
    pub(crate) fn file(&self, node: u64) -> Option<FileId> {
        self.nodes.get(&node).map(|n| FileId {
            ino: node,
            inode_generation: n.inode_generation,
        })
    }

    /// Records one more kernel lookup of `file` (a reply that hands the kernel an entry);
    /// `true` when the kernel did not hold the node with this generation before.
    ///
    /// A new inode generation for a known number means the worker reused the number: the
    /// kernel will see the new generation and treat it as another file, so the count restarts.
    pub(crate) fn looked_up(&mut self, file: FileId) -> bool {
        let node = self.nodes.entry(file.ino).or_insert(Node {
            inode_generation: file.inode_generation,
            lookups: 0,
        });
        if node.inode_generation != file.inode_generation {
            *node = Node {
                inode_generation: file.inode_generation,
                lookups: 0,
            };
        }
        let new = node.lookups == 0;
        node.lookups = node.lookups.saturating_add(1);
        new
    }

    /// Whether the kernel holds `file`'s node with its generation.
    pub(crate) fn holds(&self, file: FileId) -> bool {
        self.file(file.ino) == Some(file)
    }

    /// The kernel drops `count` lookups of `node`; the entry goes when none are left, and
    /// then the answer is `true`.
    pub(crate) fn forget(&mut self, node: u64, count: u64) -> bool {
        if node == ROOT_INO {
            return false;
        }
        let Some(n) = self.nodes.get_mut(&node) else {
            return false;
        };
        n.lookups = n.lookups.saturating_sub(count);
        if n.lookups == 0 {
            self.nodes.remove(&node);
            return true;
        }
        false
    }

    /// Every known node as data, in node ID order.
    pub(crate) fn snapshot(&self) -> Vec<NodeState> {
        let mut nodes: Vec<NodeState> = self
            .nodes
            .iter()
            .map(|(&node, n)| NodeState {
                node,
                inode_generation: n.inode_generation,
                lookups: n.lookups,
            })
            .collect();
        nodes.sort_unstable_by_key(|n| n.node);
        nodes
    }

    /// How many nodes are known (the root included).
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_count_up_and_forget_counts_down() {
        let mut nodes = Nodes::new(1);
        let file = FileId {
            ino: 42,
            inode_generation: 7,
        };
        assert!(nodes.looked_up(file), "new to the kernel");
        assert!(!nodes.looked_up(file), "held already");
        assert_eq!(nodes.file(42), Some(file));
        assert!(!nodes.forget(42, 1));
        assert_eq!(nodes.file(42), Some(file));
        assert!(nodes.forget(42, 1), "the last lookup went");
        assert_eq!(nodes.file(42), None);
        assert!(!nodes.forget(42, 1), "not held");
        assert!(!nodes.forget(ROOT_INO, 100));
        assert_eq!(
            nodes.file(ROOT_INO),
            Some(FileId {
                ino: ROOT_INO,
                inode_generation: 1
            })
        );
        assert_eq!(nodes.len(), 1);
    }

    #[test]
    fn a_restored_table_is_the_snapshot_it_came_from() {
        let mut nodes = Nodes::new(1);
        for ino in [5, 9, 9, 12] {
            nodes.looked_up(FileId {
                ino,
                inode_generation: ino * 10,
            });
        }
        let snapshot = nodes.snapshot();
        let restored = Nodes::restore(1, &snapshot);
        assert_eq!(restored.snapshot(), snapshot);
        // A snapshot without the root still has it; a root in it keeps the table's own.
        let without_root: Vec<_> = snapshot.iter().copied().filter(|n| n.node != 1).collect();
        assert_eq!(Nodes::restore(1, &without_root).snapshot(), snapshot);
        let mut restored = Nodes::restore(1, &snapshot);
        restored.forget(9, 1);
        assert!(restored.file(9).is_some(), "two lookups were restored");
        restored.forget(9, 1);
        assert!(restored.file(9).is_none());
    }

    #[test]
    fn a_reused_inode_number_restarts_the_count() {
        let mut nodes = Nodes::new(1);
        nodes.looked_up(FileId {
            ino: 9,
            inode_generation: 1,
        });
        nodes.looked_up(FileId {
            ino: 9,
            inode_generation: 1,
        });
        let reused = FileId {
            ino: 9,
            inode_generation: 2,
        };
        assert!(!nodes.holds(reused));
        assert!(nodes.looked_up(reused), "a new generation is a new node");
        assert!(nodes.holds(reused));
        assert_eq!(nodes.file(9).map(|f| f.inode_generation), Some(2));
        nodes.forget(9, 1);
        assert_eq!(nodes.file(9), None, "the new generation had one lookup");
    }
}
