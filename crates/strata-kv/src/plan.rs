//! Budget -> pages. The full pool gets what the budget allows once the window pool, sized as
//! a fraction of the full pool, is paid for.

use serde::Serialize;

use crate::{KvError, KvLayout, PoolKind};

/// The window pool's default size relative to the full pool.
pub const DEFAULT_WINDOW_RATIO: f64 = 0.2;

/// Slot ids are `u32` with `u32::MAX` kept as "none", so a pool holds fewer slots than that.
pub(crate) const MAX_SLOTS: usize = u32::MAX as usize;

/// Pages per pool. A token slot is `page * page_size + offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PagePlan {
    /// Pages of the full pool.
    pub full: usize,
    /// Pages of the window pool.
    pub window: usize,
    /// Tokens per page (a power of two).
    pub page_size: usize,
}

impl PagePlan {
    /// Pages in `pool`.
    pub fn pages(&self, pool: PoolKind) -> usize {
        match pool {
            PoolKind::Full => self.full,
            PoolKind::Window => self.window,
        }
    }

    /// Token slots in `pool`.
    pub fn slots(&self, pool: PoolKind) -> usize {
        self.pages(pool) * self.page_size
    }

    /// Bytes the plan occupies for `layout` (values and scales, every slab).
    pub fn bytes(&self, layout: &KvLayout) -> u64 {
        [PoolKind::Full, PoolKind::Window]
            .iter()
            .map(|&p| self.slots(p) as u64 * layout.unit_bytes(p) as u64)
            .sum()
    }
}

pub(crate) fn check_page_size(page_size: usize) -> Result<(), KvError> {
    if page_size.is_power_of_two() && page_size <= 1 << 16 {
        Ok(())
    } else {
        Err(KvError::InvalidPageSize(page_size))
    }
}

pub(crate) fn check_window_ratio(ratio: f64) -> Result<(), KvError> {
    if ratio.is_finite() && ratio > 0.0 && ratio <= 1.0 {
        Ok(())
    } else {
        Err(KvError::InvalidWindowRatio(ratio))
    }
}

/// Window pages for `full` full pages.
fn window_pages(full: usize, ratio: f64) -> usize {
    (full as f64 * ratio).floor() as usize
}

/// The most full pages whose pool, window pool included, fits in `budget`.
fn plan_for_units(
    full_unit: usize,
    window_unit: Option<usize>,
    budget: u64,
    page_size: usize,
    ratio: f64,
) -> Result<PagePlan, KvError> {
    check_page_size(page_size)?;
    check_window_ratio(ratio)?;
    let page_bytes = |unit: usize| (unit as u128) * page_size as u128;
    let cost = |full: usize| -> u128 {
        let window = window_unit.map_or(0, |u| window_pages(full, ratio) as u128 * page_bytes(u));
        full as u128 * page_bytes(full_unit) + window
    };
    // The smallest pool that can serve anything: one full page and one window page.
    let min_full = match window_unit {
        Some(_) => (1.0 / ratio).ceil() as usize,
        None => 1,
    };
    let max_full = MAX_SLOTS / page_size;
    if cost(min_full) > budget as u128 {
        return Err(KvError::BudgetTooSmall {
            budget,
            minimum: cost(min_full).min(u64::MAX as u128) as u64,
        });
    }
    // cost() is monotone in the page count: binary search the largest count within budget.
    let (mut lo, mut hi) = (min_full, max_full.max(min_full));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if cost(mid) <= budget as u128 {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(PagePlan {
        full: lo,
        window: window_unit.map_or(0, |_| window_pages(lo, ratio)),
        page_size,
    })
}

impl KvLayout {
    /// Pages for a byte budget: the full pool gets the most pages such that it and a window
    /// pool of `floor(full * window_ratio)` pages fit together. Allocates nothing.
    pub fn plan_pages(
        &self,
        budget_bytes: u64,
        page_size: usize,
        window_ratio: f64,
    ) -> Result<PagePlan, KvError> {
        plan_for_units(
            self.unit_bytes(PoolKind::Full),
            self.group(PoolKind::Window).map(|g| g.unit_bytes),
            budget_bytes,
            page_size,
            window_ratio,
        )
    }

    /// What [`plan_pages`](Self::plan_pages) would give if every layer kept its own K/V.
    /// Computed for comparison, never allocated.
    pub fn plan_pages_unshared(
        &self,
        budget_bytes: u64,
        page_size: usize,
        window_ratio: f64,
    ) -> Result<PagePlan, KvError> {
        plan_for_units(
            self.group(PoolKind::Full)
                .map_or(0, |g| g.unit_bytes_unshared),
            self.group(PoolKind::Window).map(|g| g.unit_bytes_unshared),
            budget_bytes,
            page_size,
            window_ratio,
        )
    }

    /// Checks that `plan` is usable with this layout: a valid page size, at least one page in
    /// each pool the model needs, and slot ids that fit.
    pub fn check_plan(&self, plan: &PagePlan) -> Result<(), KvError> {
        check_page_size(plan.page_size)?;
        if plan.full == 0 {
            return Err(KvError::invalid("page plan", "the full pool has no pages"));
        }
        if self.group(PoolKind::Window).is_some() && plan.window == 0 {
            return Err(KvError::invalid(
                "page plan",
                "the window pool has no pages",
            ));
        }
        if plan.full > plan.slots_limit() || plan.window > plan.slots_limit() {
            return Err(KvError::invalid(
                "page plan",
                format!("more than {MAX_SLOTS} token slots"),
            ));
        }
        Ok(())
    }
}

impl PagePlan {
    fn slots_limit(&self) -> usize {
        MAX_SLOTS / self.page_size.max(1)
    }
}
