//! Storage that holds no bytes: for planning, scheduling simulations and bookkeeping tests.

use crate::{KvError, KvLayout, KvStorage, PagePlan};

/// Accepts any plan and stores nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NullStorage;

impl KvStorage for NullStorage {
    fn reserve(&mut self, _layout: &KvLayout, _plan: &PagePlan) -> Result<(), KvError> {
        Ok(())
    }

    fn bytes_reserved(&self) -> u64 {
        0
    }
}
