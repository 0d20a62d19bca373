//! The full-page -> window-page mapping. A token's window slot is
//! `map[full_slot / page_size] * page_size + full_slot % page_size`, so sliding layers of
//! every request address their ring of recent positions through the same page table as
//! full layers.
//!
//! A mapped window page is either *read* (some running request's live window covers it)
//! or *idle*. Idle pages stay mapped when `keep_idle` is set (the radix cache may reuse
//! them) and are evicted least recently read first; otherwise they are freed at once.

use std::collections::BTreeSet;

use crate::allocator::{PageAllocator, NO_PAGE};

/// Both pools' free lists and the mapping between them, kept consistent together: a window
/// page is either free or mapped from exactly one allocated full page.
#[derive(Clone, Debug)]
pub(crate) struct SlotPools {
    pub full: PageAllocator,
    pub window: PageAllocator,
    /// Window page of each full page, `NO_PAGE` when it has none (never had, or released).
    full_to_window: Vec<u32>,
    /// False for models without sliding layers: no window page is ever needed.
    pub has_window_pool: bool,
    /// Whether a window page nobody reads stays mapped (radix cache) or is freed.
    keep_idle: bool,
    /// Per full page: running requests whose live window covers it.
    readers: Vec<u32>,
    /// Per full page: the stamp under which its idle window page sits in `idle`, 0 if none.
    idle_since: Vec<u64>,
    /// Idle window pages by full page, least recently read first.
    idle: BTreeSet<(u64, u32)>,
    clock: u64,
    /// Per full page: its window page was kept after its positions left a running
    /// request's window (what the radix cache could not reuse without keeping idle pages).
    past_window: Vec<bool>,
    past_window_mapped: usize,
    evicted: u64,
}

impl SlotPools {
    pub fn new(
        full_pages: usize,
        window_pages: usize,
        has_window_pool: bool,
        keep_idle: bool,
    ) -> Self {
        SlotPools {
            full: PageAllocator::new(full_pages),
            window: PageAllocator::new(window_pages),
            full_to_window: vec![NO_PAGE; full_pages],
            has_window_pool,
            keep_idle,
            readers: vec![0; full_pages],
            idle_since: vec![0; full_pages],
            idle: BTreeSet::new(),
            clock: 0,
            past_window: vec![false; full_pages],
            past_window_mapped: 0,
            evicted: 0,
        }
    }

    pub fn mapping(&self) -> &[u32] {
        &self.full_to_window
    }

    pub fn window_of(&self, full_page: u32) -> Option<u32> {
        match self.full_to_window.get(full_page as usize) {
            Some(&w) if w != NO_PAGE => Some(w),
            _ => None,
        }
    }

    pub fn has_window(&self, full_page: u32) -> bool {
        self.window_of(full_page).is_some()
    }

    /// Running requests reading the window page of `full_page`.
    pub fn readers(&self, full_page: u32) -> u32 {
        self.readers.get(full_page as usize).copied().unwrap_or(0)
    }

    /// Whether the window page of `full_page` sits in the idle index.
    pub fn is_idle(&self, full_page: u32) -> bool {
        self.idle_since
            .get(full_page as usize)
            .is_some_and(|&s| s != 0)
    }

    /// Whether the window page of `full_page` was kept past a request's window.
    pub fn is_past_window(&self, full_page: u32) -> bool {
        self.past_window
            .get(full_page as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Whether idle window pages stay mapped (radix cache) rather than being freed.
    pub fn keeps_idle(&self) -> bool {
        self.keep_idle
    }

    /// Window pages no running request reads (evictable).
    pub fn idle_pages(&self) -> usize {
        self.idle.len()
    }

    /// Mapped window pages kept after their positions left a running request's window.
    pub fn past_window_pages(&self) -> usize {
        self.past_window_mapped
    }

    /// Window pages evicted to make room, since the pool was built.
    pub fn evicted_pages(&self) -> u64 {
        self.evicted
    }

    /// Takes a full page and, when the model has sliding layers, the window page mapped to
    /// it, read by the request taking it. The caller checked availability first; `None`
    /// leaves both pools unchanged.
    pub fn take_page(&mut self) -> Option<u32> {
        let full = self.full.take()?;
        if self.has_window_pool {
            let Some(window) = self.window.take() else {
                self.full.give_back(full);
                return None;
            };
            self.full_to_window[full as usize] = window;
            self.readers[full as usize] = 1;
        }
        Some(full)
    }

    /// Returns a full page and its window page, if it still has one.
    pub fn free_page(&mut self, full_page: u32) {
        debug_assert_eq!(self.readers(full_page), 0, "freeing a page still read");
        self.release_window(full_page);
        self.full.give_back(full_page);
    }

    /// Returns the window page of `full_page`, keeping the full page. True if it had one.
    pub fn release_window(&mut self, full_page: u32) -> bool {
        match self.full_to_window.get_mut(full_page as usize) {
            Some(w) if *w != NO_PAGE => {
                let window = std::mem::replace(w, NO_PAGE);
                self.window.give_back(window);
                self.unpark(full_page);
                self.readers[full_page as usize] = 0;
                if std::mem::take(&mut self.past_window[full_page as usize]) {
                    self.past_window_mapped -= 1;
                }
                true
            }
            _ => false,
        }
    }

    /// A running request starts reading the window page of `full_page` (no-op without one).
    pub fn add_reader(&mut self, full_page: u32) {
        if self.has_window(full_page) {
            self.unpark(full_page);
            self.readers[full_page as usize] += 1;
        }
    }

    /// A running request stops reading the window page of `full_page`; `left_window` when
    /// its positions fell out of the request's window (rather than the request ending).
    /// Once nobody reads it the page turns idle, or is freed without the radix cache.
    pub fn drop_reader(&mut self, full_page: u32, left_window: bool) {
        if !self.has_window(full_page) {
            return;
        }
        let i = full_page as usize;
        debug_assert!(self.readers[i] > 0, "dropping a reader never added");
        self.readers[i] = self.readers[i].saturating_sub(1);
        if left_window && !self.past_window[i] {
            self.past_window[i] = true;
            self.past_window_mapped += 1;
        }
        if self.readers[i] == 0 {
            if self.keep_idle {
                self.clock += 1;
                self.park(full_page, self.clock);
            } else {
                self.release_window(full_page);
            }
        }
    }

    /// Evicts the least recently read idle window page; returns its full page.
    pub fn evict_idle(&mut self) -> Option<u32> {
        let &(_, full_page) = self.idle.first()?;
        self.release_window(full_page);
        self.evicted += 1;
        Some(full_page)
    }

    fn park(&mut self, full_page: u32, stamp: u64) {
        self.unpark(full_page);
        self.idle_since[full_page as usize] = stamp;
        self.idle.insert((stamp, full_page));
    }

    fn unpark(&mut self, full_page: u32) {
        let stamp = std::mem::take(&mut self.idle_since[full_page as usize]);
        if stamp != 0 {
            self.idle.remove(&(stamp, full_page));
        }
    }

    /// Moves the window page of `from` to `to` (same tokens, so the same content), with
    /// its readers and idle stamp: used when a request's page duplicates a cached one that
    /// lost its window page.
    pub fn move_window(&mut self, from: u32, to: u32) {
        debug_assert!(!self.has_window(to));
        let (f, t) = (from as usize, to as usize);
        let window = std::mem::replace(&mut self.full_to_window[f], NO_PAGE);
        self.full_to_window[t] = window;
        self.readers[t] = std::mem::take(&mut self.readers[f]);
        self.past_window[t] = std::mem::take(&mut self.past_window[f]);
        let stamp = self.idle_since[f];
        self.unpark(from);
        if stamp != 0 {
            self.park(to, stamp);
        }
    }
}
