//! A request's life in the pool: slots for new tokens, committing written tokens (which
//! stops the request reading old window pages), rolling back unverified tokens, release.

use std::ops::Range;

use super::{KvPool, RequestId, RequestPages};
use crate::{KvError, KvStorage, PoolKind};

impl<S: KvStorage> KvPool<S> {
    /// Registers a request with no tokens.
    pub fn alloc_request(&mut self) -> RequestId {
        let id = self.next_request;
        self.next_request += 1;
        self.requests.insert(id, RequestPages::default());
        RequestId(id)
    }

    pub(super) fn request(&self, req: RequestId) -> Result<&RequestPages, KvError> {
        self.requests
            .get(&req.0)
            .ok_or(KvError::UnknownRequest(req.0))
    }

    pub(super) fn request_mut(&mut self, req: RequestId) -> Result<&mut RequestPages, KvError> {
        self.requests
            .get_mut(&req.0)
            .ok_or(KvError::UnknownRequest(req.0))
    }

    /// Requests currently registered.
    pub fn running_requests(&self) -> usize {
        self.requests.len()
    }

    /// Tokens of `req` that have slots.
    pub fn seq_len(&self, req: RequestId) -> Result<usize, KvError> {
        Ok(self.request(req)?.len)
    }

    /// Tokens of `req` committed (written and final).
    pub fn committed_len(&self, req: RequestId) -> Result<usize, KvError> {
        Ok(self.request(req)?.committed)
    }

    /// Full-pool page of each `page_size` positions of `req`.
    pub fn page_table(&self, req: RequestId) -> Result<&[u32], KvError> {
        Ok(&self.request(req)?.pages)
    }

    /// The full-pool slot of `position` in `req`.
    pub fn slot(&self, req: RequestId, position: usize) -> Result<u32, KvError> {
        let r = self.request(req)?;
        if position >= r.len {
            return Err(KvError::invalid(
                "position",
                format!("{position} is past the request's {} tokens", r.len),
            ));
        }
        let ps = self.plan.page_size;
        Ok(r.pages[position / ps] * ps as u32 + (position % ps) as u32)
    }

    /// Slots for `n_tokens` more tokens of `req`; returns their positions. Evicts unused
    /// cached prefixes if a pool runs short; on `OutOfPages` nothing was allocated.
    pub fn extend(&mut self, req: RequestId, n_tokens: usize) -> Result<Range<usize>, KvError> {
        let r = self.request(req)?;
        let old_len = r.len;
        let new_len = old_len
            .checked_add(n_tokens)
            .filter(|&l| l <= crate::plan::MAX_SLOTS)
            .ok_or_else(|| KvError::invalid("n_tokens", "sequence length overflows"))?;
        let need = new_len.div_ceil(self.plan.page_size) - r.pages.len();
        self.make_room(need)?;
        let mut fresh = Vec::with_capacity(need);
        for _ in 0..need {
            match self.pools.take_page() {
                Some(p) => fresh.push(p),
                None => {
                    // make_room guaranteed the pages; undo rather than leave a half-grown
                    // request if that ever fails.
                    debug_assert!(false, "pages vanished after make_room");
                    for p in fresh {
                        self.pools.free_page(p);
                    }
                    return Err(self.out_of_pages(need));
                }
            }
        }
        let r = self.request_mut(req)?;
        r.pages.extend(fresh);
        r.len = new_len;
        Ok(old_len..new_len)
    }

    /// Ensures `pages` full pages (and as many window pages, with sliding layers) are free,
    /// evicting cached prefixes (and idle window pages) if needed.
    fn make_room(&mut self, pages: usize) -> Result<(), KvError> {
        if let Some(tree) = &mut self.tree {
            let free = self.pools.full.available();
            if free < pages {
                tree.evict_full(pages - free, &mut self.pools);
            }
            let free = self.pools.window.available();
            // Evict windows only for a request that will then fit: idle pages are cheap to
            // keep and costly to recompute.
            let full_ok = self.pools.full.available() >= pages;
            let window_ok = free + self.pools.idle_pages() >= pages;
            if self.pools.has_window_pool && free < pages && full_ok && window_ok {
                tree.evict_window(pages - free, &mut self.pools);
            }
        }
        let short = self.pools.full.available() < pages
            || (self.pools.has_window_pool && self.pools.window.available() < pages);
        if short {
            return Err(self.out_of_pages(pages));
        }
        Ok(())
    }

    fn out_of_pages(&self, needed: usize) -> KvError {
        let full = self.pools.full.available();
        let (pool, available) = if full < needed || !self.pools.has_window_pool {
            (PoolKind::Full, full)
        } else {
            (PoolKind::Window, self.pools.window.available())
        };
        KvError::OutOfPages {
            pool,
            needed,
            available,
        }
    }

    /// Marks the first `len` tokens of `req` as written and final, and stops the request
    /// reading the window pages of positions no later query can see: with window `W`, the
    /// query at `len` (and every later one) sees only positions `> len - W`. With the radix
    /// cache those pages stay mapped, idle and evictable; without it they are freed.
    pub fn commit(&mut self, req: RequestId, len: usize) -> Result<(), KvError> {
        let window = self.layout.window().filter(|_| self.pools.has_window_pool);
        let ps = self.plan.page_size;
        let r = self
            .requests
            .get_mut(&req.0)
            .ok_or(KvError::UnknownRequest(req.0))?;
        r.check_movable_end("commit", len)?;
        r.committed = len;
        if let Some(w) = window {
            let dead_pages = (len + 1).saturating_sub(w) / ps;
            for &p in r.pages.get(r.window_floor..dead_pages).unwrap_or(&[]) {
                self.pools.drop_reader(p, true);
            }
            r.window_floor = r.window_floor.max(dead_pages);
        }
        Ok(())
    }

    /// Drops the slots of positions `len..` (rejected draft tokens, say). Committed tokens
    /// cannot be dropped.
    pub fn truncate(&mut self, req: RequestId, len: usize) -> Result<(), KvError> {
        let ps = self.plan.page_size;
        let r = self
            .requests
            .get_mut(&req.0)
            .ok_or(KvError::UnknownRequest(req.0))?;
        r.check_movable_end("truncate", len)?;
        let keep = len.div_ceil(ps);
        // Uncommitted pages are the request's own and above its window floor.
        for p in r.pages.drain(keep..) {
            self.pools.drop_reader(p, false);
            self.pools.free_page(p);
        }
        r.len = len;
        Ok(())
    }

    /// Ends `req`: its own pages go back to the pools and its pin on cached prefixes is
    /// dropped. To keep its tokens for reuse, call `cache_prefix` first.
    pub fn release(&mut self, req: RequestId) -> Result<(), KvError> {
        let r = self
            .requests
            .remove(&req.0)
            .ok_or(KvError::UnknownRequest(req.0))?;
        for &p in r.pages.get(r.window_floor..).unwrap_or(&[]) {
            self.pools.drop_reader(p, false);
        }
        if let (Some(node), Some(tree)) = (r.locked_node, &mut self.tree) {
            tree.unlock(node);
        }
        for &p in &r.pages[r.borrowed..] {
            self.pools.free_page(p);
        }
        Ok(())
    }
}
