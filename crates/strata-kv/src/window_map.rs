//! The full-page -> window-page mapping. A token's window slot is
//! `map[full_slot / page_size] * page_size + full_slot % page_size`, so sliding layers of
//! every request address their ring of recent positions through the same page table as
//! full layers.

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
}

impl SlotPools {
    pub fn new(full_pages: usize, window_pages: usize, has_window_pool: bool) -> Self {
        SlotPools {
            full: PageAllocator::new(full_pages),
            window: PageAllocator::new(window_pages),
            full_to_window: vec![NO_PAGE; full_pages],
            has_window_pool,
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

    /// Takes a full page and, when the model has sliding layers, the window page mapped to
    /// it. The caller checked availability first; `None` leaves both pools unchanged.
    pub fn take_page(&mut self) -> Option<u32> {
        let full = self.full.take()?;
        if self.has_window_pool {
            let Some(window) = self.window.take() else {
                self.full.give_back(full);
                return None;
            };
            self.full_to_window[full as usize] = window;
        }
        Some(full)
    }

    /// Returns a full page and its window page, if it still has one.
    pub fn free_page(&mut self, full_page: u32) {
        self.release_window(full_page);
        self.full.give_back(full_page);
    }

    /// Returns the window page of `full_page`, keeping the full page. True if it had one.
    pub fn release_window(&mut self, full_page: u32) -> bool {
        match self.full_to_window.get_mut(full_page as usize) {
            Some(w) if *w != NO_PAGE => {
                let window = std::mem::replace(w, NO_PAGE);
                self.window.give_back(window);
                true
            }
            _ => false,
        }
    }

    /// Moves the window page of `from` to `to` (same tokens, so the same content): used when
    /// a request's page duplicates a cached one that lost its window page.
    pub fn move_window(&mut self, from: u32, to: u32) {
        debug_assert!(!self.has_window(to));
        let window = std::mem::replace(&mut self.full_to_window[from as usize], NO_PAGE);
        self.full_to_window[to as usize] = window;
    }
}
