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
    /// How K and V elements are stored (dtype, and whether a scale goes with each row).
    pub format: KvFormat,
    /// KV heads of a token row.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Token rows the slab holds.
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
    /// K's elements in the slab's format, as bytes (`elements() * element_bytes()`).
    pub k: Vec<u8>,
    /// V's elements, laid out as `k`.
    pub v: Vec<u8>,
    /// K's scales, one per `(slot, head)`; empty for formats without scales.
    pub k_scales: Vec<f32>,
    /// V's scales, laid out as `k_scales`.
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
    /// First row of `q` (and `out`) that belongs to this sequence.
    pub q_offset: usize,
    /// Query rows (tokens) of this sequence in the call.
    pub q_len: usize,
    /// Absolute position of the first query.
    pub q_start: usize,
    /// Absolute position of the first key read (later than 0 when a window lets older keys go).
    pub k_start: usize,
    /// Index into the slot table of the slot holding key `k_start`.
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

/// The slot table that [`crate::Backend::paged_batch_update_pages`] describes by pages:
/// sequence i's keys, positions `k_start .. q_start + q_len`, at `slots[slot_offset ..]`,
/// position p in page `pages[page_start[i] + p / page_size - k_start / page_size]` at slot
/// `page * page_size + p % page_size`. Refuses what [`page_slot_runs`] refuses. A page's
/// run of slots is written at once (at batch 128 and depth 4096 a step has half a million).
pub fn expand_page_slots(
    seqs: &[PagedSeq],
    pages: &[u32],
    page_start: &[u32],
    page_size: usize,
) -> crate::Result<Vec<u32>> {
    let mut slots = Vec::with_capacity(seqs.iter().map(PagedSeq::k_len).sum());
    page_slot_runs(seqs, pages, page_start, page_size, |run| slots.extend(run))?;
    Ok(slots)
}

/// Walks a page description (see [`expand_page_slots`]), handing `run` each page's run of
/// slots in table order; returns the keys of all sequences. Refuses a page start count
/// other than the sequences', sequences that do not follow one another (rows, slot offsets,
/// a first key past the first query), page indices past `pages` and slots past 32 bits.
pub(crate) fn page_slot_runs(
    seqs: &[PagedSeq],
    pages: &[u32],
    page_start: &[u32],
    page_size: usize,
    mut run: impl FnMut(std::ops::Range<u32>),
) -> crate::Result<usize> {
    const OP: &str = "paged_batch_update_pages";
    crate::error::ensure(page_size > 0 && page_start.len() == seqs.len(), OP, || {
        format!(
            "{} page starts for {} sequences, page size {page_size}",
            page_start.len(),
            seqs.len()
        )
    })?;
    let (mut rows, mut keys) = (0, 0);
    for (i, (s, &first)) in seqs.iter().zip(page_start).enumerate() {
        let end = s.q_start + s.q_len;
        let (lo, hi) = (s.k_start / page_size, end.div_ceil(page_size));
        let first = first as usize;
        crate::error::ensure(
            s.q_offset == rows
                && s.q_len > 0
                && s.k_start <= s.q_start
                && s.slot_offset == keys
                && first + (hi - lo) <= pages.len(),
            OP,
            || {
                let n = pages.len();
                format!("sequence {i} ({s:?}) does not follow the previous one or reads past the {n} pages")
            },
        )?;
        for (k, &page) in pages[first..first + (hi - lo)].iter().enumerate() {
            let from = if k == 0 { s.k_start % page_size } else { 0 };
            let to = if lo + k + 1 == hi {
                (end - 1) % page_size + 1
            } else {
                page_size
            };
            let base = page as u64 * page_size as u64;
            let last = base + to as u64 - 1;
            crate::error::ensure(last <= u32::MAX as u64, OP, || {
                format!("slot {last} of sequence {i} exceeds 32 bits")
            })?;
            run(base as u32 + from as u32..base as u32 + to as u32);
        }
        rows += s.q_len;
        keys += s.k_len();
    }
    Ok(keys)
}
