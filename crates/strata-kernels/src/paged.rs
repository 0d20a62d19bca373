//! Parameters of the paged-KV ops: a KV slab's shape and how a batch of sequences addresses
//! its keys through a slot table.
//!
//! A slab holds `slots` token rows for one KV-owning layer: row `(slot, head)` starts at
//! element `(slot * num_kv_heads + head) * head_dim` of K (and of V), in the slab's
//! [`KvFormat`]; the 8-bit formats keep one f32 scale per `(slot, head)`. This is the KV
//! pool's own layout (`strata_kv::HostSlab`), so the pool can hand a backend's slabs to
//! its kernels as they are.

pub use strata_kv::KvFormat;

/// One slab's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSlabShape {
    pub format: KvFormat,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub slots: usize,
}

impl KvSlabShape {
    /// Elements of K (or V): `slots * num_kv_heads * head_dim`.
    pub fn elements(&self) -> usize {
        self.slots * self.num_kv_heads * self.head_dim
    }

    /// Scales of K (or V): one per `(slot, head)` for the 8-bit formats, else none.
    pub fn scales(&self) -> usize {
        if has_scales(self.format) {
            self.slots * self.num_kv_heads
        } else {
            0
        }
    }

    /// Device bytes for K, V and their scales.
    pub fn bytes(&self) -> u64 {
        2 * (self.elements() * self.format.element_bytes() + 4 * self.scales()) as u64
    }
}

/// Whether `format` stores a per-(token, head) scale.
pub fn has_scales(format: KvFormat) -> bool {
    matches!(
        format,
        KvFormat::Fp8E4m3PerTokenHead | KvFormat::Int8PerTokenHead
    )
}

/// A slab's contents on the host, for checks: raw K/V bytes and scales.
#[derive(Clone, Debug, PartialEq)]
pub struct KvSlabContents {
    pub k: Vec<u8>,
    pub v: Vec<u8>,
    pub k_scales: Vec<f32>,
    pub v_scales: Vec<f32>,
}

/// One sequence of a paged attention call.
///
/// Its queries are rows `q_offset .. q_offset + q_len` of `q` (and `out`), at consecutive
/// absolute positions from `q_start`. Its keys are positions `k_start .. q_start + q_len`,
/// key `j` (position `k_start + j`) in slot `slots[slot_offset + j]`. Causality and the
/// window are applied per query as in [`crate::AttentionParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedSeq {
    pub q_offset: usize,
    pub q_len: usize,
    pub q_start: usize,
    pub k_start: usize,
    pub slot_offset: usize,
}

impl PagedSeq {
    /// Keys the sequence addresses (`q_start + q_len - k_start`).
    pub fn k_len(&self) -> usize {
        (self.q_start + self.q_len).saturating_sub(self.k_start)
    }
}

/// Checks a paged batch description against the slot table's length.
pub(crate) fn check_paged(seqs: &[PagedSeq], slots: &[u32]) -> crate::Result<()> {
    let mut rows = 0;
    for (i, s) in seqs.iter().enumerate() {
        crate::error::ensure(
            s.q_offset == rows && s.q_len > 0 && s.k_start <= s.q_start,
            "paged_attention",
            || format!("sequence {i} ({s:?}) does not follow the previous one's rows"),
        )?;
        crate::error::ensure(
            s.slot_offset + s.k_len() <= slots.len(),
            "paged_attention",
            || format!("sequence {i} reads past the {} slots given", slots.len()),
        )?;
        rows += s.q_len;
    }
    Ok(())
}
