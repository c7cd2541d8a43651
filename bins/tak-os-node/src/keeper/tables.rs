//! A stage's node and handle tables as the keeper keeps them: the state the owner deposited,
//! with every change the owner wrote ahead since applied.

use std::collections::BTreeMap;

use fusefs::{ConnectionNonce, HandleState, MountState, NodeState, ROOT_NODE};
use lease_client::protocol::FileId;

use super::protocol::{Change, HANDLE_BYTES, MAX_STATE_BYTES, StageState};

/// The most nodes and handles one stage's tables hold: what fits in [`MAX_STATE_BYTES`] at the
/// largest entry (a handle with its opening request) after the 40-byte header, so that any
/// tables the keeper accepts encode to a state a successor reads.
pub const MAX_ENTRIES: usize = ((MAX_STATE_BYTES - 40) / HANDLE_BYTES as u64) as usize;

/// One stage's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    nonce: ConnectionNonce,
    nodes: BTreeMap<u64, NodeState>,
    handles: BTreeMap<u64, HandleState>,
}

/// Why a journal could not be applied; nothing of it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TablesError {
    /// More entries than [`MAX_ENTRIES`].
    #[error("the stage's tables would hold more than {MAX_ENTRIES} entries")]
    Full,
}

impl Tables {
    /// The tables of a deposited state.
    pub fn new(state: StageState) -> Tables {
        let StageState(state) = state;
        let nodes = state.nodes.iter().map(|n| (n.node, *n)).collect();
        let handles = state.handles.iter().map(|h| (h.handle, *h)).collect();
        Tables {
            nonce: state.nonce,
            nodes,
            handles,
        }
    }

    /// Applies `changes` in order, all or none. A node handed over again keeps its entry (a
    /// new generation replaces it, with one lookup); the root is never forgotten. A handle is
    /// undelivered from its opening until marked delivered; a mark for a handle no longer
    /// held (released before its mark came) changes nothing.
    pub fn apply(&mut self, changes: &[Change]) -> Result<(), TablesError> {
        let added = changes
            .iter()
            .filter(|c| matches!(c, Change::Node { .. } | Change::Opened { .. }))
            .count();
        if self.nodes.len() + self.handles.len() + added > MAX_ENTRIES {
            return Err(TablesError::Full);
        }
        for change in changes {
            match *change {
                Change::Node { node, generation } => {
                    let entry = self.nodes.entry(node).or_insert(NodeState {
                        node,
                        inode_generation: generation,
                        lookups: 1,
                    });
                    if entry.inode_generation != generation {
                        entry.inode_generation = generation;
                        entry.lookups = 1;
                    }
                }
                Change::Forgotten { node } if node != ROOT_NODE => {
                    self.nodes.remove(&node);
                }
                Change::Forgotten { .. } => {}
                Change::Opened {
                    handle,
                    ino,
                    generation,
                    flags,
                    unique,
                } => {
                    let file = FileId {
                        ino,
                        inode_generation: generation,
                    };
                    self.handles.insert(
                        handle,
                        HandleState {
                            handle,
                            file,
                            flags,
                            opened_by: Some(unique).filter(|&u| u != 0),
                        },
                    );
                }
                Change::Delivered { handle } => {
                    if let Some(entry) = self.handles.get_mut(&handle) {
                        entry.opened_by = None;
                    }
                }
                Change::Released { handle } => {
                    self.handles.remove(&handle);
                }
                // The keeper's resend rules, not the tables (`server.rs`).
                Change::FirstRead { .. } => {}
            }
        }
        Ok(())
    }

    /// The tables as a state, nodes and handles in ID order.
    pub fn state(&self) -> StageState {
        StageState(MountState {
            nonce: self.nonce,
            nodes: self.nodes.values().copied().collect(),
            handles: self.handles.values().copied().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(node: u64, inode_generation: u64, lookups: u64) -> NodeState {
        NodeState {
            node,
            inode_generation,
            lookups,
        }
    }

    #[test]
    fn changes_apply_in_order_over_the_deposited_state() {
        let deposited = StageState(MountState {
            nonce: ConnectionNonce([4; 16]),
            nodes: vec![node(1, 1, 1), node(7, 3, 2)],
            handles: Vec::new(),
        });
        let mut tables = Tables::new(deposited.clone());
        assert_eq!(tables.state(), deposited);
        tables
            .apply(&[
                Change::Node {
                    node: 9,
                    generation: 5,
                },
                Change::Node {
                    node: 7,
                    generation: 3,
                },
                Change::Opened {
                    handle: 4,
                    ino: 9,
                    generation: 5,
                    flags: 2,
                    unique: 80,
                },
                Change::Forgotten { node: 1 },
            ])
            .unwrap();
        let state = tables.state().0;
        assert_eq!(state.nonce, ConnectionNonce([4; 16]));
        assert_eq!(
            state.nodes,
            [node(1, 1, 1), node(7, 3, 2), node(9, 5, 1)],
            "the root stays; a node handed over again keeps its count"
        );
        assert_eq!(state.handles.len(), 1);
        assert_eq!(state.handles[0].opened_by, Some(80), "undelivered");

        // Delivered; a mark for a handle no longer held changes nothing.
        tables
            .apply(&[
                Change::Delivered { handle: 4 },
                Change::Delivered { handle: 77 },
            ])
            .unwrap();
        let state = tables.state().0;
        assert_eq!(state.handles.len(), 1);
        assert_eq!(state.handles[0].opened_by, None);

        // A reused inode number; a release; a forget.
        tables
            .apply(&[
                Change::Node {
                    node: 7,
                    generation: 8,
                },
                Change::Released { handle: 4 },
                Change::Forgotten { node: 9 },
            ])
            .unwrap();
        let state = tables.state().0;
        assert_eq!(state.nodes, [node(1, 1, 1), node(7, 8, 1)]);
        assert!(state.handles.is_empty());
    }

    #[test]
    fn a_journal_past_the_limit_changes_nothing() {
        let mut tables = Tables::new(StageState(MountState::default()));
        let many: Vec<Change> = (0..=MAX_ENTRIES as u64)
            .map(|node| Change::Node {
                node: node + 2,
                generation: 1,
            })
            .collect();
        assert_eq!(tables.apply(&many), Err(TablesError::Full));
        assert_eq!(tables.state(), StageState(MountState::default()));
    }
}
