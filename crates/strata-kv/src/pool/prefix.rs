//! Prefix reuse through the radix cache.

use super::{KvPool, RequestId};
use crate::radix::{usable_pages, NodeId, RadixTree, ROOT};
use crate::{KvError, KvStorage};

impl<S: KvStorage> KvPool<S> {
    /// Length of the longest cached prefix of `tokens` a request could reuse now (whole
    /// pages, window slots present). Changes nothing.
    pub fn match_prefix(&self, tokens: &[u32]) -> usize {
        self.tree
            .as_ref()
            .map_or(0, |t| t.peek(tokens, &self.pools))
    }

    /// Gives an empty request the longest usable cached prefix of `tokens` and pins it;
    /// returns its length, which counts as written and committed. Pass the prompt without
    /// its last token if the model must compute at least one position for logits.
    pub fn reuse_prefix(&mut self, req: RequestId, tokens: &[u32]) -> Result<usize, KvError> {
        let r = self.request(req)?;
        if r.len != 0 {
            return Err(KvError::invalid(
                "reuse_prefix",
                "the request already has tokens",
            ));
        }
        self.stats.lookup_tokens += tokens.len() as u64;
        let Some(tree) = &mut self.tree else {
            self.stats.misses += 1;
            return Ok(0);
        };
        let m = tree.match_and_lock(tokens, &self.pools);
        if m.tokens == 0 {
            tree.unlock(m.node);
            self.stats.misses += 1;
            return Ok(0);
        }
        self.stats.hits += 1;
        self.stats.hit_tokens += m.tokens as u64;
        // The next query, at `m.tokens`, reads the window pages of `[m.tokens - W, m.tokens)`.
        let floor = self.window_floor_at(m.tokens);
        let read = &m.pages[floor.min(m.pages.len())..];
        if read.iter().any(|&p| self.pools.is_past_window(p)) {
            self.stats.window_hits += 1;
            self.stats.window_hit_tokens += m.tokens as u64;
        }
        for &p in read {
            self.pools.add_reader(p);
        }
        let r = self.request_mut(req)?;
        r.borrowed = m.pages.len();
        r.window_floor = floor;
        r.pages = m.pages;
        r.len = m.tokens;
        r.committed = m.tokens;
        r.locked_node = Some(m.node);
        Ok(m.tokens)
    }

    /// Hands the committed prefix of `req` (its first `tokens.len()` tokens, at most the
    /// committed ones, whole pages only) to the radix cache so later requests can reuse it.
    /// The request keeps reading those pages, now pinned in the cache. The prefix stops at
    /// the last point a continuation could use (window slots present). Returns the number
    /// of the request's tokens now held by the cache. A no-op with the naive cache.
    pub fn cache_prefix(&mut self, req: RequestId, tokens: &[u32]) -> Result<usize, KvError> {
        let ps = self.plan.page_size;
        let window = self.layout.window();
        let Some(tree) = &mut self.tree else {
            return Ok(0);
        };
        let r = self
            .requests
            .get_mut(&req.0)
            .ok_or(KvError::UnknownRequest(req.0))?;
        if let Some(node) = r.locked_node {
            let reused = r.borrowed * ps;
            if tokens.len() < reused || !path_spells(tree, node, &tokens[..reused]) {
                return Err(KvError::invalid(
                    "cache_prefix",
                    "tokens differ from the cached prefix the request reuses",
                ));
            }
        }
        let whole = tokens.len().min(r.committed) / ps;
        let pools = &mut self.pools;
        let keep = usable_pages(whole, ps, window, |i| pools.has_window(r.pages[i]));
        if keep <= r.borrowed {
            return Ok(r.borrowed * ps);
        }
        // The insert may swap the request's pages for cached duplicates: it reads the
        // window pages of the pages it ends up with.
        let read = r.window_floor.min(keep)..keep;
        for &p in &r.pages[read.clone()] {
            pools.drop_reader(p, false);
        }
        let node = tree.insert(&tokens[..keep * ps], &mut r.pages[..keep], pools);
        for &p in &r.pages[read] {
            pools.add_reader(p);
        }
        tree.lock(node);
        if let Some(old) = r.locked_node.replace(node) {
            tree.unlock(old);
        }
        r.borrowed = keep;
        Ok(keep * ps)
    }

    /// The first page a query at position `len` reads in sliding layers (0 without them).
    fn window_floor_at(&self, len: usize) -> usize {
        match self.layout.window().filter(|_| self.pools.has_window_pool) {
            Some(w) => (len + 1).saturating_sub(w) / self.plan.page_size,
            None => 0,
        }
    }

    /// Evicts unused cached prefixes (least recently used first) until `pages` full pages
    /// are freed or nothing unpinned is left; returns the pages freed.
    pub fn evict(&mut self, pages: usize) -> usize {
        match &mut self.tree {
            Some(t) => t.evict_full(pages, &mut self.pools),
            None => 0,
        }
    }

    /// Evicts every unpinned cached prefix; returns the full pages freed.
    pub fn flush_cache(&mut self) -> usize {
        self.evict(usize::MAX)
    }
}

/// Whether the path from the root to `node` spells exactly `tokens`.
fn path_spells(tree: &RadixTree, mut node: NodeId, tokens: &[u32]) -> bool {
    let mut end = tokens.len();
    while node != ROOT {
        let n = tree.node(node);
        let Some(start) = end.checked_sub(n.tokens.len()) else {
            return false;
        };
        if tokens[start..end] != n.tokens[..] {
            return false;
        }
        end = start;
        node = n.parent;
    }
    end == 0
}
