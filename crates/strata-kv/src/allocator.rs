//! Free lists of page ids. Bookkeeping only: the bytes a page names are never touched here.

/// "No page" in page-id tables.
pub const NO_PAGE: u32 = u32::MAX;

/// One pool's pages: a stack of free ids plus a flag per page, so a double free is caught
/// instead of silently handing one page to two owners.
#[derive(Clone, Debug)]
pub(crate) struct PageAllocator {
    free: Vec<u32>,
    is_free: Vec<bool>,
}

impl PageAllocator {
    pub fn new(pages: usize) -> Self {
        debug_assert!(pages < NO_PAGE as usize);
        // Reversed so pages are handed out in ascending order, which keeps early
        // allocations contiguous.
        PageAllocator {
            free: (0..pages as u32).rev().collect(),
            is_free: vec![true; pages],
        }
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }

    pub fn is_free(&self, page: u32) -> bool {
        self.is_free.get(page as usize).copied().unwrap_or(false)
    }

    /// Takes one page, or `None` when the pool is empty.
    pub fn take(&mut self) -> Option<u32> {
        let page = self.free.pop()?;
        self.is_free[page as usize] = false;
        Some(page)
    }

    /// Returns a page. Returning a free or unknown page is a bookkeeping bug: it is ignored
    /// (so the free list never holds a page twice) and flagged in debug builds.
    pub fn give_back(&mut self, page: u32) {
        match self.is_free.get_mut(page as usize) {
            Some(flag @ false) => {
                *flag = true;
                self.free.push(page);
            }
            _ => debug_assert!(false, "page {page} returned twice or never allocated"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_each_page_once() {
        let mut a = PageAllocator::new(4);
        let got: Vec<u32> = std::iter::from_fn(|| a.take()).collect();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert_eq!(a.available(), 0);
        a.give_back(2);
        assert!(a.is_free(2));
        assert_eq!(a.take(), Some(2));
        assert_eq!(a.take(), None);
    }
}
