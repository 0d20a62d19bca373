//! A full consistency check of the bookkeeping, for tests and debug endpoints.

use std::collections::HashMap;

use super::KvPool;
use crate::radix::{NodeId, ROOT};
use crate::{KvStorage, NO_PAGE};

impl<S: KvStorage> KvPool<S> {
    /// Checks every invariant the pool relies on and describes the first one broken:
    /// each full page is free or has exactly one owner (a request or a cache node); each
    /// window page is free or mapped from exactly one allocated full page; requests' page
    /// tables match their lengths and pinned prefixes; pin counts match the requests; each
    /// mapped window page is read by exactly the requests whose window covers it, or idle
    /// (evictable) when none does; the tree knows which node holds each of its pages.
    /// Costs time linear in the pool size.
    pub fn audit(&self) -> Result<(), String> {
        let ps = self.plan.page_size;
        let mut owners = vec![0u32; self.plan.full];
        let mut readers = vec![0u32; self.plan.full];
        let mut expected_locks: HashMap<NodeId, u32> = HashMap::new();
        for (id, r) in &self.requests {
            if r.pages.len() != r.len.div_ceil(ps) {
                return Err(format!(
                    "request {id}: {} pages for {} tokens",
                    r.pages.len(),
                    r.len
                ));
            }
            if r.committed > r.len || r.borrowed * ps > r.committed {
                return Err(format!("request {id}: lengths out of order"));
            }
            for (i, &p) in r.pages.iter().enumerate() {
                let slot = owners
                    .get_mut(p as usize)
                    .ok_or(format!("request {id}: page {p} out of range"))?;
                if i >= r.borrowed {
                    *slot += 1;
                }
                if self.pools.has_window_pool && i >= r.window_floor {
                    if !self.pools.has_window(p) {
                        return Err(format!("request {id}: page {i} lost a window it reads"));
                    }
                    readers[p as usize] += 1;
                }
            }
            match (r.locked_node, &self.tree) {
                (Some(node), Some(tree)) => {
                    let mut path = Vec::new();
                    let mut n = node;
                    while n != ROOT {
                        *expected_locks.entry(n).or_default() += 1;
                        path.push(n);
                        n = tree.node(n).parent;
                    }
                    let pinned: Vec<u32> = path
                        .iter()
                        .rev()
                        .flat_map(|&n| tree.node(n).pages.iter().copied())
                        .collect();
                    if pinned[..] != r.pages[..r.borrowed] {
                        return Err(format!(
                            "request {id}: borrowed pages differ from its pinned path"
                        ));
                    }
                }
                (None, _) if r.borrowed == 0 => {}
                _ => return Err(format!("request {id}: borrows pages without a pin")),
            }
        }
        if let Some(tree) = &self.tree {
            let mut tokens = 0;
            for (id, n) in tree.nodes() {
                tokens += n.tokens.len();
                if n.tokens.len() != n.pages.len() * ps || n.pages.is_empty() {
                    return Err(format!(
                        "node {id}: {} tokens for {} pages",
                        n.tokens.len(),
                        n.pages.len()
                    ));
                }
                for &p in &n.pages {
                    *owners
                        .get_mut(p as usize)
                        .ok_or(format!("node {id}: page {p} out of range"))? += 1;
                    if tree.owner_of(p) != Some(id) {
                        return Err(format!("node {id}: page {p} recorded under another node"));
                    }
                }
                let windows = n
                    .pages
                    .iter()
                    .filter(|&&p| self.pools.has_window(p))
                    .count();
                if windows != n.window_pages {
                    return Err(format!(
                        "node {id}: counts {} window pages, has {windows}",
                        n.window_pages
                    ));
                }
                let locks = expected_locks.get(&id).copied().unwrap_or(0);
                if n.lock_ref != locks {
                    return Err(format!(
                        "node {id}: lock count {} but {locks} requests pin it",
                        n.lock_ref
                    ));
                }
                let parent = tree.node(n.parent);
                if parent.children.get(&n.tokens[..ps]) != Some(&id) {
                    return Err(format!("node {id}: not linked from its parent"));
                }
            }
            if tokens != tree.cached_tokens() {
                return Err(format!(
                    "cache counts {} tokens, holds {tokens}",
                    tree.cached_tokens()
                ));
            }
        }
        for (p, &count) in owners.iter().enumerate() {
            let free = self.pools.full.is_free(p as u32);
            match (free, count) {
                (true, 0) | (false, 1) => {}
                _ => return Err(format!("full page {p}: free {free}, {count} owners")),
            }
            if free && self.pools.has_window(p as u32) {
                return Err(format!("free full page {p} still maps a window page"));
            }
            let page = p as u32;
            let (read, want) = (self.pools.readers(page), readers[p]);
            if read != want {
                return Err(format!(
                    "full page {p}: {read} window readers, {want} expected"
                ));
            }
            let mapped = self.pools.has_window(page);
            let should_idle = mapped && want == 0 && self.pools.keeps_idle();
            if self.pools.is_idle(page) != should_idle {
                return Err(format!("full page {p}: idle state wrong (mapped {mapped})"));
            }
            if mapped && want == 0 && !self.pools.keeps_idle() {
                return Err(format!("full page {p}: window page nobody reads kept"));
            }
            let cached = self.tree.as_ref().and_then(|t| t.owner_of(page));
            if cached.is_some() && count == 0 {
                return Err(format!("full page {p}: free but recorded in the tree"));
            }
        }
        if self.pools.idle_pages()
            != (0..self.plan.full as u32)
                .filter(|&p| self.pools.is_idle(p))
                .count()
        {
            return Err("idle index and idle flags disagree".into());
        }
        let read = (0..self.plan.full as u32)
            .filter(|&p| self.pools.readers(p) > 0)
            .count();
        let (free, idle) = (self.pools.window.available(), self.pools.idle_pages());
        if self.pools.has_window_pool && free + read + idle != self.plan.window {
            return Err(format!(
                "window pages: {free} free + {read} read + {idle} idle != {}",
                self.plan.window
            ));
        }
        let past = (0..self.plan.full as u32)
            .filter(|&p| self.pools.is_past_window(p))
            .count();
        if past != self.pools.past_window_pages() {
            return Err(format!(
                "{past} pages flagged past window, {} counted",
                self.pools.past_window_pages()
            ));
        }
        let mut window_refs = vec![0u32; self.plan.window];
        for &w in self.pools.mapping() {
            if w != NO_PAGE {
                *window_refs
                    .get_mut(w as usize)
                    .ok_or(format!("window page {w} out of range"))? += 1;
            }
        }
        for (w, &count) in window_refs.iter().enumerate() {
            let free = self.pools.window.is_free(w as u32);
            match (free, count) {
                (true, 0) | (false, 1) => {}
                _ => {
                    return Err(format!(
                        "window page {w}: free {free}, mapped {count} times"
                    ))
                }
            }
        }
        Ok(())
    }
}
