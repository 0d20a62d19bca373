//! One radix-tree node: a run of pages that every request below it shares.

use std::collections::HashMap;

use super::hash::BuildTokenHasher;

pub(crate) type NodeId = u32;
pub(crate) const ROOT: NodeId = 0;

/// Position of a node in an LRU index: oldest first, then the flag (false first), then id.
pub(crate) type LruKey = (u64, bool, NodeId);

#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub parent: NodeId,
    /// Children keyed by the tokens of their first page.
    pub children: HashMap<Box<[u32]>, NodeId, BuildTokenHasher>,
    /// Tokens of this node's pages (a whole number of pages).
    pub tokens: Vec<u32>,
    /// Full-pool pages, one per `page_size` tokens; owned by the tree.
    pub pages: Vec<u32>,
    /// How many of `pages` still have a window page.
    pub window_pages: usize,
    /// Running requests whose reused prefix passes through this node.
    pub lock_ref: u32,
    pub last_access: u64,
    /// Key under which the node sits in the evictable-leaf index, if it does.
    pub leaf_key: Option<LruKey>,
}

impl Node {
    pub fn new(parent: NodeId, tokens: Vec<u32>, pages: Vec<u32>, now: u64) -> Self {
        Node {
            parent,
            children: HashMap::default(),
            tokens,
            pages,
            window_pages: 0,
            lock_ref: 0,
            last_access: now,
            leaf_key: None,
        }
    }

    pub fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }
}
