//! Eviction, least recently used first.
//!
//! Full eviction removes whole leaves (their full and window pages); because a node is
//! touched whenever any request passes through it, parents are never older than their
//! children. Window eviction takes idle window pages one at a time, least recently read
//! first, from cached prefixes and running requests alike (`SlotPools`); a leaf left without
//! window pages can serve no match (every endpoint in it needs its own last pages), so it is
//! removed as well.

use super::{NodeId, RadixTree, ROOT};
use crate::window_map::SlotPools;

impl RadixTree {
    /// Frees at least `need` full pages if unlocked leaves allow; returns how many it freed.
    pub fn evict_full(&mut self, need: usize, pools: &mut SlotPools) -> usize {
        let mut freed = 0;
        while freed < need {
            let Some(&(_, _, id)) = self.leaves.first() else {
                break;
            };
            freed += self.remove_leaf(id, pools);
        }
        freed
    }

    /// Frees at least `need` window pages if idle ones allow, least recently read first;
    /// returns how many. A node's page losing its window page is counted off the node, and
    /// an unlocked leaf left with no window page (it can serve no match) is removed.
    pub fn evict_window(&mut self, need: usize, pools: &mut SlotPools) -> usize {
        let mut freed = 0;
        while freed < need {
            let Some(page) = pools.evict_idle() else {
                break;
            };
            freed += 1;
            let Some(id) = self.owner_of(page) else {
                continue;
            };
            let n = self.node_mut(id);
            n.window_pages -= 1;
            if n.window_pages == 0 && n.is_leaf() && n.lock_ref == 0 {
                self.remove_leaf(id, pools);
            }
        }
        freed
    }

    /// Removes an unlocked leaf and frees its pages, then any parent left as a leaf that
    /// can no longer serve a match. Returns the full pages freed.
    fn remove_leaf(&mut self, mut id: NodeId, pools: &mut SlotPools) -> usize {
        let mut freed = 0;
        loop {
            let n = self.node(id);
            debug_assert!(id != ROOT && n.is_leaf() && n.lock_ref == 0);
            if let Some(k) = n.leaf_key {
                self.leaves.remove(&k);
            }
            let Some(node) = self.nodes[id as usize].take() else {
                break;
            };
            self.free_ids.push(id);
            for &p in &node.pages {
                self.page_owner[p as usize] = super::NO_NODE;
                pools.free_page(p);
            }
            freed += node.pages.len();
            self.cached_tokens -= node.tokens.len();
            let parent = node.parent;
            let ps = self.page_size;
            self.node_mut(parent).children.remove(&node.tokens[..ps]);
            self.refresh(parent);
            let p = self.node(parent);
            let dead = self.window.is_some()
                && parent != ROOT
                && p.is_leaf()
                && p.lock_ref == 0
                && p.window_pages == 0;
            if !dead {
                break;
            }
            id = parent;
        }
        freed
    }
}
