//! What a forward pass needs from the KV pool.

use std::ops::Range;

use strata_kv::{HostStorage, KvPool, RequestId};

use crate::error::Result;

/// Per-token K/V storage addressed by (layer, request, position).
pub trait KvCache {
    /// Stores the K and V rows (`num_kv_heads * head_dim` values each) of a KV-owning layer
    /// for the token at `position` of `request`; a KV-shared layer stores nothing.
    fn store(
        &mut self,
        layer: usize,
        request: RequestId,
        position: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<()>;

    /// Appends to `k` and `v` the rows `layer` reads for `positions` (its source's rows, for
    /// a KV-shared layer), dequantized to f32. `row` is the length of one row.
    fn gather(
        &self,
        layer: usize,
        request: RequestId,
        positions: Range<usize>,
        row: usize,
        k: &mut Vec<f32>,
        v: &mut Vec<f32>,
    ) -> Result<()>;
}

impl KvCache for KvPool<HostStorage> {
    fn store(
        &mut self,
        layer: usize,
        request: RequestId,
        position: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        let slot = self.slot(request, position)?;
        self.write_kv(layer, slot, k, v)?;
        Ok(())
    }

    fn gather(
        &self,
        layer: usize,
        request: RequestId,
        positions: Range<usize>,
        row: usize,
        k: &mut Vec<f32>,
        v: &mut Vec<f32>,
    ) -> Result<()> {
        let start = k.len();
        let n = positions.len();
        k.resize(start + n * row, 0.0);
        v.resize(start + n * row, 0.0);
        for (i, pos) in positions.enumerate() {
            let slot = self.slot(request, pos)?;
            let at = start + i * row;
            self.read_kv(layer, slot, &mut k[at..at + row], &mut v[at..at + row])?;
        }
        Ok(())
    }
}
