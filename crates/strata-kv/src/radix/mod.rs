//! Radix prefix cache over token ids. Nodes own full-pool pages (and, through the window
//! map, their window pages); running requests pin the path they reuse with reference
//! counts; unreferenced leaves are evicted least-recently-used first.
//!
//! Sliding-window layers make reuse conditional: a prefix of `n` tokens is only reusable if
//! the window slots of positions `n - window + 1 .. n` still exist, because the next token
//! attends to them. Matching therefore returns the longest *usable* prefix (any page
//! boundary, not only a cached prefix's end). Window pages nobody reads are evicted one by
//! one, least recently read first (`SlotPools`); a leaf left with none is removed.

mod evict;
mod hash;
mod node;
mod usable;

use std::collections::BTreeSet;

pub(crate) use node::{Node, NodeId, ROOT};
pub(crate) use usable::usable_pages;

use node::LruKey;

use crate::window_map::SlotPools;

/// A reused prefix: its length in tokens, its pages, and the deepest node (now locked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PrefixMatch {
    pub tokens: usize,
    pub pages: Vec<u32>,
    pub node: NodeId,
}

#[derive(Clone, Debug)]
pub(crate) struct RadixTree {
    page_size: usize,
    /// Sliding window in tokens, when the model has sliding layers.
    window: Option<usize>,
    nodes: Vec<Option<Node>>,
    free_ids: Vec<NodeId>,
    clock: u64,
    /// Unlocked leaves, oldest first: candidates for full eviction.
    leaves: BTreeSet<LruKey>,
    /// The node owning each full page, `NO_NODE` for pages the tree does not hold: window
    /// eviction works per page and must find the node whose count it changes.
    page_owner: Vec<NodeId>,
    cached_tokens: usize,
}

/// "No node" in `page_owner`.
const NO_NODE: NodeId = NodeId::MAX;

impl RadixTree {
    pub fn new(page_size: usize, window: Option<usize>, full_pages: usize) -> Self {
        RadixTree {
            page_size,
            window,
            nodes: vec![Some(Node::new(ROOT, Vec::new(), Vec::new(), 0))],
            free_ids: Vec::new(),
            clock: 0,
            leaves: BTreeSet::new(),
            page_owner: vec![NO_NODE; full_pages],
            cached_tokens: 0,
        }
    }

    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    /// The node holding full page `page`, if the tree holds it.
    pub fn owner_of(&self, page: u32) -> Option<NodeId> {
        match self.page_owner.get(page as usize) {
            Some(&n) if n != NO_NODE => Some(n),
            _ => None,
        }
    }

    fn set_owner(&mut self, pages: &[u32], node: NodeId) {
        for &p in pages {
            self.page_owner[p as usize] = node;
        }
    }

    pub fn node(&self, id: NodeId) -> &Node {
        // Ids handed out by the tree always name live nodes; a dead id is a bookkeeping bug.
        self.nodes[id as usize].as_ref().expect("live radix node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id as usize].as_mut().expect("live radix node")
    }

    /// Live nodes other than the root.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, n)| n.as_ref().map(|n| (i as NodeId, n)))
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn add_node(&mut self, node: Node) -> NodeId {
        match self.free_ids.pop() {
            Some(id) => {
                self.nodes[id as usize] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                (self.nodes.len() - 1) as NodeId
            }
        }
    }

    /// Puts `id` in (or takes it out of) the LRU indexes its state calls for.
    fn refresh(&mut self, id: NodeId) {
        let n = self.node(id);
        let unlocked = id != ROOT && n.lock_ref == 0;
        // Leaves: a parent is touched whenever a child is, so age alone orders them.
        let leaf_key = (unlocked && n.is_leaf()).then_some((n.last_access, false, id));
        let old_leaf = n.leaf_key;
        if old_leaf != leaf_key {
            if let Some(k) = old_leaf {
                self.leaves.remove(&k);
            }
            if let Some(k) = leaf_key {
                self.leaves.insert(k);
            }
        }
        self.node_mut(id).leaf_key = leaf_key;
    }

    fn touch(&mut self, id: NodeId, now: u64) {
        self.node_mut(id).last_access = now;
        self.refresh(id);
    }

    /// Pages of `tokens` (a whole number of pages) already matching the tree: each visited
    /// node with the number of its pages that match.
    fn walk(&self, tokens: &[u32]) -> Vec<(NodeId, usize)> {
        let ps = self.page_size;
        let mut path = Vec::new();
        let (mut node, mut at) = (ROOT, 0);
        while tokens.len() - at >= ps {
            let Some(&child) = self.node(node).children.get(&tokens[at..at + ps]) else {
                break;
            };
            let c = self.node(child);
            let rest = &tokens[at..];
            let same = c
                .tokens
                .iter()
                .zip(rest)
                .position(|(a, b)| a != b)
                .unwrap_or(c.tokens.len().min(rest.len()));
            let matched = same / ps;
            path.push((child, matched));
            at += matched * ps;
            if matched < c.pages.len() {
                break;
            }
            node = child;
        }
        path
    }

    fn path_pages(&self, path: &[(NodeId, usize)]) -> Vec<u32> {
        path.iter()
            .flat_map(|&(n, m)| self.node(n).pages[..m].iter().copied())
            .collect()
    }

    /// Length in tokens of the longest usable cached prefix of `tokens`; changes nothing.
    pub fn peek(&self, tokens: &[u32], pools: &SlotPools) -> usize {
        let pages = self.path_pages(&self.walk(tokens));
        let usable = usable_pages(pages.len(), self.page_size, self.window, |i| {
            pools.has_window(pages[i])
        });
        usable * self.page_size
    }

    /// Finds the longest usable cached prefix of `tokens`, splits the node it ends in so
    /// it ends on a node boundary, marks the path used and locks it.
    pub fn match_and_lock(&mut self, tokens: &[u32], pools: &SlotPools) -> PrefixMatch {
        let path = self.walk(tokens);
        let mut pages = self.path_pages(&path);
        let usable = usable_pages(pages.len(), self.page_size, self.window, |i| {
            pools.has_window(pages[i])
        });
        pages.truncate(usable);
        let now = self.tick();
        let (mut target, mut depth) = (ROOT, 0);
        for &(n, matched) in &path {
            if depth == usable {
                break;
            }
            let take = (usable - depth).min(matched);
            target = if take < self.node(n).pages.len() {
                self.split(n, take, pools)
            } else {
                n
            };
            depth += take;
        }
        self.touch_up(target, now);
        self.lock(target);
        PrefixMatch {
            tokens: usable * self.page_size,
            pages,
            node: target,
        }
    }

    /// Stamps `id` and its ancestors as used at `now`.
    fn touch_up(&mut self, mut id: NodeId, now: u64) {
        loop {
            self.touch(id, now);
            if id == ROOT {
                break;
            }
            id = self.node(id).parent;
        }
    }

    /// Splits node `id` after its first `k` pages (0 < k < len); returns the new upper node.
    fn split(&mut self, id: NodeId, k: usize, pools: &SlotPools) -> NodeId {
        let ps = self.page_size;
        let n = self.node_mut(id);
        debug_assert!(k > 0 && k < n.pages.len());
        let head_tokens: Vec<u32> = n.tokens.drain(..k * ps).collect();
        let head_pages: Vec<u32> = n.pages.drain(..k).collect();
        let (parent, lock_ref, last_access) = (n.parent, n.lock_ref, n.last_access);
        let rest_key: Box<[u32]> = n.tokens[..ps].into();
        let head_key: Box<[u32]> = head_tokens[..ps].into();
        let head_window = head_pages.iter().filter(|&&p| pools.has_window(p)).count();
        let mut mid = Node::new(parent, head_tokens, head_pages, last_access);
        mid.lock_ref = lock_ref;
        mid.window_pages = head_window;
        mid.children.insert(rest_key, id);
        let head_pages = mid.pages.clone();
        let mid_id = self.add_node(mid);
        self.set_owner(&head_pages, mid_id);
        let n = self.node_mut(id);
        n.parent = mid_id;
        n.window_pages -= head_window;
        self.node_mut(parent).children.insert(head_key, mid_id);
        self.refresh(id);
        self.refresh(mid_id);
        mid_id
    }

    /// Adds `tokens` (a whole number of pages) with the caller's `pages`. Where the tree
    /// already holds the same tokens, the caller's page is freed and replaced in `pages`
    /// by the tree's (same tokens, same K/V); a window page the tree's copy lacks moves
    /// over first. Pages past the existing path become a new leaf owned by the tree.
    /// Returns the node where `tokens` end.
    pub fn insert(&mut self, tokens: &[u32], pages: &mut [u32], pools: &mut SlotPools) -> NodeId {
        let ps = self.page_size;
        debug_assert_eq!(tokens.len(), pages.len() * ps);
        let now = self.tick();
        self.touch(ROOT, now);
        let (mut node, mut i) = (ROOT, 0);
        while i < pages.len() {
            let at = i * ps;
            let Some(&child) = self.node(node).children.get(&tokens[at..at + ps]) else {
                let mut leaf = Node::new(node, tokens[at..].to_vec(), pages[i..].to_vec(), now);
                leaf.window_pages = pages[i..].iter().filter(|&&p| pools.has_window(p)).count();
                self.cached_tokens += tokens.len() - at;
                let leaf_id = self.add_node(leaf);
                self.set_owner(&pages[i..], leaf_id);
                self.node_mut(node)
                    .children
                    .insert(tokens[at..at + ps].into(), leaf_id);
                self.refresh(node);
                self.refresh(leaf_id);
                return leaf_id;
            };
            let c = self.node(child);
            let same = c
                .tokens
                .iter()
                .zip(&tokens[at..])
                .position(|(a, b)| a != b)
                .unwrap_or(c.tokens.len().min(tokens.len() - at));
            let matched = same / ps;
            for t in 0..matched {
                self.adopt_duplicate(child, t, &mut pages[i + t], pools);
            }
            let child = if matched < self.node(child).pages.len() {
                self.split(child, matched, pools)
            } else {
                child
            };
            self.touch(child, now);
            node = child;
            i += matched;
        }
        node
    }

    fn adopt_duplicate(&mut self, id: NodeId, t: usize, page: &mut u32, pools: &mut SlotPools) {
        let cached = self.node(id).pages[t];
        if *page == cached {
            return;
        }
        if pools.has_window(*page) && !pools.has_window(cached) {
            pools.move_window(*page, cached);
            self.node_mut(id).window_pages += 1;
        }
        pools.free_page(*page);
        *page = cached;
    }

    /// Pins `id` and its ancestors for a running request.
    pub fn lock(&mut self, mut id: NodeId) {
        loop {
            self.node_mut(id).lock_ref += 1;
            self.refresh(id);
            if id == ROOT {
                break;
            }
            id = self.node(id).parent;
        }
    }

    pub fn unlock(&mut self, mut id: NodeId) {
        loop {
            let n = self.node_mut(id);
            debug_assert!(n.lock_ref > 0, "unlock of an unlocked node");
            n.lock_ref = n.lock_ref.saturating_sub(1);
            self.refresh(id);
            if id == ROOT {
                break;
            }
            id = self.node(id).parent;
        }
    }
}
