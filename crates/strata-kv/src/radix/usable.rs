//! Which cached prefixes a sliding-window layer can continue from.

/// The largest `j <= pages` such that a request continuing after the first `j` pages finds
/// every window page it needs: the pages holding positions `j*ps - window + 1 .. j*ps - 1`
/// (the keys the token at `j*ps` attends to). `has_window(i)` tells whether page `i` of the
/// prefix still has its window page. Without sliding layers every prefix is usable.
pub(crate) fn usable_pages(
    pages: usize,
    page_size: usize,
    window: Option<usize>,
    has_window: impl Fn(usize) -> bool,
) -> usize {
    let Some(window) = window else {
        return pages;
    };
    let first_needed = |j: usize| (j * page_size + 1).saturating_sub(window) / page_size;
    let mut j = pages;
    // Each step scans down from j to the highest missing page x; no endpoint in (x, j] can
    // be usable (their ranges all contain x), so continue from x. Total work O(pages).
    while j > 0 {
        match (first_needed(j)..j).rev().find(|&i| !has_window(i)) {
            None => return j,
            Some(missing) => j = missing,
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(present: &[bool], ps: usize, w: usize) -> usize {
        (0..=present.len())
            .rev()
            .find(|&j| {
                let lo_pos = (j * ps + 1).saturating_sub(w);
                (0..j).all(|i| present[i] || (i + 1) * ps <= lo_pos)
            })
            .unwrap_or(0)
    }

    #[test]
    fn matches_the_definition() {
        for bits in 0u32..(1 << 10) {
            let present: Vec<bool> = (0..10).map(|i| bits & (1 << i) != 0).collect();
            for ps in [1, 2, 4] {
                for w in [1, 2, 3, 5, 8, 17] {
                    let got = usable_pages(10, ps, Some(w), |i| present[i]);
                    assert_eq!(got, brute(&present, ps, w), "{present:?} ps {ps} w {w}");
                }
            }
        }
    }

    #[test]
    fn without_window_everything_is_usable() {
        assert_eq!(usable_pages(7, 4, None, |_| false), 7);
    }

    #[test]
    fn a_missing_tail_page_blocks_its_endpoint() {
        // Window 4 tokens, page size 1: endpoint 6 needs positions 3, 4, 5.
        // Page 5 is gone, so the best endpoint is 5, which needs 2, 3, 4.
        let present = [false, false, true, true, true, false];
        assert_eq!(usable_pages(6, 1, Some(4), |i| present[i]), 5);
        // Old pages may go: only the last window - 1 positions matter.
        let present = [true, true, false, true, true, true];
        assert_eq!(usable_pages(6, 1, Some(4), |i| present[i]), 6);
    }
}
