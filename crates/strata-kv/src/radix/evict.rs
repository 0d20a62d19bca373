//! Eviction, least recently used first.
//!
//! Full eviction removes whole leaves (their full and window pages). Window eviction takes
//! the window pages of the least recently used node holding any; a leaf left without window
//! pages can serve no match (every endpoint in it needs its own last pages), so it is removed
//! as well. Because a node is touched whenever any request passes through it, parents are
//! never older than their children: the sessions that lose their windows are the ones used
//! longest ago, never every cached prefix at once.

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

    /// Frees at least `need` window pages if unlocked nodes allow; returns how many.
    pub fn evict_window(&mut self, need: usize, pools: &mut SlotPools) -> usize {
        let mut freed = 0;
        while freed < need {
            let Some(&(_, _, id)) = self.window_holders.first() else {
                break;
            };
            let pages = std::mem::take(&mut self.node_mut(id).pages);
            freed += pages.iter().filter(|&&p| pools.release_window(p)).count();
            let n = self.node_mut(id);
            n.pages = pages;
            n.window_pages = 0;
            self.refresh(id);
            if self.node(id).is_leaf() {
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
            let (leaf_key, window_key) = (n.leaf_key, n.window_key);
            if let Some(k) = leaf_key {
                self.leaves.remove(&k);
            }
            if let Some(k) = window_key {
                self.window_holders.remove(&k);
            }
            let Some(node) = self.nodes[id as usize].take() else {
                break;
            };
            self.free_ids.push(id);
            for &p in &node.pages {
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
