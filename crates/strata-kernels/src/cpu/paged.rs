//! The paged-KV ops on the host: slabs in the pool's layout, rows encoded with the pool's
//! own `encode_row`, and attention that reads bf16 rows in place and dequantizes the other
//! formats' rows as it reads them.

use strata_kv::quant::{decode_row, encode_row};
use strata_kv::KvFormat;

use rayon::prelude::*;

use super::attention::{attention_over, ContiguousKv, KvSource};
use super::buffer::CpuBuffer;
use super::kv_row::KvRow;
use crate::error::ensure;
use crate::paged::check_paged;
use crate::{AttentionParams, KvSlabContents, KvSlabShape, PagedSeq, Result};

/// A slab in host memory.
#[derive(Clone, Debug)]
pub struct CpuKvSlab {
    /// The slab's format, heads, head_dim and slot count.
    pub shape: KvSlabShape,
    pub(crate) data: KvSlabContents,
}

/// A paged batch on the host: the descriptions and slot table as given.
#[derive(Clone, Debug)]
pub struct CpuPagedBatch {
    pub(crate) seqs: Vec<PagedSeq>,
    pub(crate) slots: Vec<u32>,
}

pub(crate) fn new_slab(shape: KvSlabShape) -> CpuKvSlab {
    let bytes = shape.elements() * shape.format.element_bytes();
    CpuKvSlab {
        shape,
        data: KvSlabContents {
            k: vec![0; bytes],
            v: vec![0; bytes],
            k_scales: vec![0.0; shape.scales()],
            v_scales: vec![0.0; shape.scales()],
        },
    }
}

pub(crate) fn store(
    slab: &mut CpuKvSlab,
    k: &CpuBuffer,
    v: &CpuBuffer,
    slots: &[u32],
) -> Result<()> {
    const OP: &str = "kv_store";
    let s = slab.shape;
    let (k, v) = (k.f32s(OP)?, v.f32s(OP)?);
    let (heads, d) = (s.num_kv_heads, s.head_dim);
    ensure(
        k.len() == slots.len() * heads * d && v.len() == k.len(),
        OP,
        || {
            format!(
                "k has {}, v has {}, want {} rows of {heads} x {d}",
                k.len(),
                v.len(),
                slots.len()
            )
        },
    )?;
    if let Some(&bad) = slots.iter().find(|&&x| x as usize >= s.slots) {
        return Err(crate::KernelError::Invalid {
            op: OP,
            detail: format!("slot {bad} outside the slab's {}", s.slots),
        });
    }
    let eb = s.format.element_bytes();
    let scaled = crate::has_scales(s.format);
    let data = &mut slab.data;
    for (t, &slot) in slots.iter().enumerate() {
        for h in 0..heads {
            let row = slot as usize * heads + h;
            let src = (t * heads + h) * d..(t * heads + h + 1) * d;
            let dst = row * d * eb..(row + 1) * d * eb;
            let ks = encode_row(s.format, &k[src.clone()], &mut data.k[dst.clone()]);
            let vs = encode_row(s.format, &v[src], &mut data.v[dst]);
            if scaled {
                data.k_scales[row] = ks;
                data.v_scales[row] = vs;
            }
        }
    }
    Ok(())
}

/// One sequence's keys read through its slots.
struct SlabKeys<'a> {
    slab: &'a CpuKvSlab,
    slots: &'a [u32],
    k_start: usize,
}

impl<'s> SlabKeys<'s> {
    /// Key `i`'s row index for KV head `h` and that row's bytes in `bytes` (K or V).
    fn row_bytes(&self, bytes: &'s [u8], i: usize, h: usize) -> (usize, &'s [u8]) {
        let s = self.slab.shape;
        let row = self.slots[i] as usize * s.num_kv_heads + h;
        let len = s.head_dim * s.format.element_bytes();
        (row, &bytes[row * len..(row + 1) * len])
    }

    /// Row `(i, h)` of a bf16 or f32 slab's `bytes` read in place, when the slab holds one
    /// of those (and its bytes lie on the element's boundaries, as an allocation's do).
    fn in_place_row(&self, bytes: &'s [u8], i: usize, h: usize) -> Option<KvRow<'s>> {
        let row = || self.row_bytes(bytes, i, h).1;
        match self.slab.shape.format {
            KvFormat::Bf16 => bytemuck::try_cast_slice(row()).ok().map(KvRow::Bf16),
            KvFormat::F32 => bytemuck::try_cast_slice(row()).ok().map(KvRow::F32),
            _ => None,
        }
    }

    fn row(&self, bytes: &'s [u8], scales: &[f32], i: usize, h: usize, out: &mut [f32]) {
        let format = self.slab.shape.format;
        let (row, src) = self.row_bytes(bytes, i, h);
        let scale = if crate::has_scales(format) {
            scales[row]
        } else {
            1.0
        };
        decode_row(format, src, scale, out);
    }
}

impl KvSource for SlabKeys<'_> {
    fn num_keys(&self) -> usize {
        self.slots.len()
    }
    fn position(&self, i: usize) -> u32 {
        (self.k_start + i) as u32
    }
    fn key<'a>(&'a self, i: usize, h: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        let d = &self.slab.data;
        self.row(&d.k, &d.k_scales, i, h, scratch);
        scratch
    }
    fn value<'a>(&'a self, i: usize, h: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        let d = &self.slab.data;
        self.row(&d.v, &d.v_scales, i, h, scratch);
        scratch
    }
    fn key_row<'a>(&'a self, i: usize, h: usize, scratch: &'a mut [f32]) -> KvRow<'a> {
        match self.in_place_row(&self.slab.data.k, i, h) {
            Some(k) => k,
            None => KvRow::F32(self.key(i, h, scratch)),
        }
    }
    fn value_row<'a>(&'a self, i: usize, h: usize, scratch: &'a mut [f32]) -> KvRow<'a> {
        match self.in_place_row(&self.slab.data.v, i, h) {
            Some(v) => v,
            None => KvRow::F32(self.value(i, h, scratch)),
        }
    }
}

pub(crate) fn batch(seqs: &[PagedSeq], slots: &[u32]) -> Result<CpuPagedBatch> {
    check_paged(seqs, slots)?;
    Ok(CpuPagedBatch {
        seqs: seqs.to_vec(),
        slots: slots.to_vec(),
    })
}

pub(crate) fn attention(
    q: &CpuBuffer,
    slab: &CpuKvSlab,
    batch: &CpuPagedBatch,
    p: AttentionParams,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "paged_attention";
    let s = slab.shape;
    ensure(
        p.head_dim == s.head_dim && p.n_kv_heads == s.num_kv_heads,
        OP,
        || format!("params {p:?} do not match the slab {s:?}"),
    )?;
    let row = p.n_heads * p.head_dim;
    let (q, out) = (q.f32s(OP)?, out.f32s_mut(OP)?);
    let rows: usize = batch.seqs.iter().map(|s| s.q_len).sum();
    ensure(q.len() == rows * row && out.len() == q.len(), OP, || {
        format!(
            "q has {}, out {}, want {rows} rows of {row}",
            q.len(),
            out.len()
        )
    })?;
    if let Some(&bad) = batch.slots.iter().find(|&&x| x as usize >= s.slots) {
        return Err(crate::KernelError::Invalid {
            op: OP,
            detail: format!("slot {bad} outside the slab's {}", s.slots),
        });
    }
    let in_place = |seq: &PagedSeq| seq.q_len < GATHER_MIN_QUERIES || s.format == KvFormat::F32;
    let keys_of = |seq: &PagedSeq| SlabKeys {
        slab,
        slots: &batch.slots[seq.slot_offset..seq.slot_offset + seq.k_len()],
        k_start: seq.k_start,
    };
    let positions_of = |seq: &PagedSeq| -> Vec<u32> {
        (seq.q_start..seq.q_start + seq.q_len)
            .map(|x| x as u32)
            .collect()
    };
    // Each sequence's rows of `out`, in order of their offsets (they do not overlap).
    let mut order: Vec<&PagedSeq> = batch.seqs.iter().collect();
    order.sort_by_key(|seq| seq.q_offset);
    let mut parts: Vec<(&PagedSeq, &mut [f32])> = Vec::with_capacity(order.len());
    let (mut rest, mut at) = (out, 0);
    for seq in order {
        let start = seq.q_offset * row;
        ensure(start >= at, OP, || {
            format!("sequences overlap at query row {}", seq.q_offset)
        })?;
        let (mine, tail) = std::mem::take(&mut rest)[start - at..].split_at_mut(seq.q_len * row);
        parts.push((seq, mine));
        (rest, at) = (tail, start + seq.q_len * row);
    }
    // Decode rows (few queries) read their keys in place; every such sequence of the
    // batch at once, so that a step of many short tasks is one pass over the threads
    // rather than a pass a sequence. A task's bits do not depend on what else runs.
    parts
        .par_iter_mut()
        .filter(|(seq, _)| in_place(seq))
        .try_for_each(|(seq, out)| {
            let range = seq.q_offset * row..(seq.q_offset + seq.q_len) * row;
            attention_over(&q[range], &positions_of(seq), &keys_of(seq), p, out)
        })?;
    for (seq, out) in parts.into_iter().filter(|(seq, _)| !in_place(seq)) {
        let keys = keys_of(seq);
        let positions = positions_of(seq);
        let q = &q[seq.q_offset * row..(seq.q_offset + seq.q_len) * row];
        // A prompt chunk reads every row once a tile of queries: convert them to f32 once
        // first.
        let (kv_row, d) = (s.num_kv_heads * s.head_dim, s.head_dim);
        let n = keys.num_keys();
        let (mut k, mut v) = (vec![0f32; n * kv_row], vec![0f32; n * kv_row]);
        let data = &slab.data;
        k.par_chunks_mut(kv_row)
            .zip(v.par_chunks_mut(kv_row))
            .enumerate()
            .for_each(|(i, (kr, vr))| {
                for h in 0..s.num_kv_heads {
                    let at = h * d..(h + 1) * d;
                    keys.row(&data.k, &data.k_scales, i, h, &mut kr[at.clone()]);
                    keys.row(&data.v, &data.v_scales, i, h, &mut vr[at]);
                }
            });
        let key_positions: Vec<u32> = (0..n).map(|i| keys.position(i)).collect();
        let contiguous = ContiguousKv {
            k: &k,
            v: &v,
            positions: &key_positions,
            n_kv_heads: s.num_kv_heads,
            head_dim: d,
        };
        attention_over(q, &positions, &contiguous, p, out)?;
    }
    Ok(())
}

/// Queries of a sequence from which its keys are converted to f32 once before attending
/// (a prompt chunk) rather than read in place by each task (decode rows).
const GATHER_MIN_QUERIES: usize = 8;
