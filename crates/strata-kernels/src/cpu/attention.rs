//! Attention for prefill, extend and decode over explicitly positioned keys.
//!
//! One parallel task per (query token, query head). For each task the scores against all
//! visible keys are computed in f32, the softmax subtracts the row maximum, and the output
//! is the probability-weighted sum of value rows, normalised once at the end.
//!
//! Keys and values are read through [`KvSource`], so the same kernel serves contiguous f32
//! buffers ([`ContiguousKv`]) and a paged, possibly quantized pool whose reader dequantizes
//! one row at a time into scratch.

use super::buffer::CpuBuffer;
use super::dot::{axpy, dot};
use crate::error::ensure;
use crate::{AttentionParams, Result};
use rayon::prelude::*;

/// The keys and values one sequence can attend to, for one layer.
///
/// Rows are `(key index, kv head)`; a reader either lends a stored f32 row or fills
/// `scratch` (length `head_dim`) and returns it, e.g. after dequantizing bf16/fp8/int8.
pub trait KvSource: Sync {
    /// Keys (and values) available, indexed `0..num_keys()`.
    fn num_keys(&self) -> usize;
    /// Absolute position of key `i` (what the mask compares with query positions).
    fn position(&self, i: usize) -> u32;
    /// Key `i`'s `head_dim` f32 values for `kv_head`.
    fn key<'a>(&'a self, i: usize, kv_head: usize, scratch: &'a mut [f32]) -> &'a [f32];
    /// Value `i`'s `head_dim` f32 values for `kv_head`.
    fn value<'a>(&'a self, i: usize, kv_head: usize, scratch: &'a mut [f32]) -> &'a [f32];
}

/// Keys and values as contiguous `[S, n_kv_heads, head_dim]` f32 arrays.
pub struct ContiguousKv<'a> {
    /// Keys, `[S, n_kv_heads, head_dim]`.
    pub k: &'a [f32],
    /// Values, `[S, n_kv_heads, head_dim]`.
    pub v: &'a [f32],
    /// Absolute position of each of the `S` keys.
    pub positions: &'a [u32],
    /// KV heads a key row holds.
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl ContiguousKv<'_> {
    #[inline]
    fn row(&self, i: usize, h: usize) -> std::ops::Range<usize> {
        let start = (i * self.n_kv_heads + h) * self.head_dim;
        start..start + self.head_dim
    }
}

impl KvSource for ContiguousKv<'_> {
    fn num_keys(&self) -> usize {
        self.positions.len()
    }
    fn position(&self, i: usize) -> u32 {
        self.positions[i]
    }
    fn key<'a>(&'a self, i: usize, h: usize, _: &'a mut [f32]) -> &'a [f32] {
        &self.k[self.row(i, h)]
    }
    fn value<'a>(&'a self, i: usize, h: usize, _: &'a mut [f32]) -> &'a [f32] {
        &self.v[self.row(i, h)]
    }
}

fn check_params(op: &'static str, p: &AttentionParams) -> Result<()> {
    ensure(p.head_dim > 0 && p.n_kv_heads > 0, op, || {
        "head_dim and n_kv_heads must be positive".into()
    })?;
    ensure(p.n_heads.is_multiple_of(p.n_kv_heads), op, || {
        format!(
            "n_heads {} not a multiple of n_kv_heads {}",
            p.n_heads, p.n_kv_heads
        )
    })?;
    if let Some(cap) = p.softcap {
        ensure(cap > 0.0, op, || format!("softcap {cap} must be positive"))?;
    }
    Ok(())
}

/// Attention of `q [T, n_heads, d]` at `q_positions` over `kv`, into `out [T, n_heads, d]`.
pub fn attention_over<K: KvSource>(
    q: &[f32],
    q_positions: &[u32],
    kv: &K,
    p: AttentionParams,
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "attention";
    check_params(OP, &p)?;
    let d = p.head_dim;
    let row = p.n_heads * d;
    ensure(q.len() == q_positions.len() * row, OP, || {
        format!(
            "q has {} elements, want {} tokens x {} heads x {d}",
            q.len(),
            q_positions.len(),
            p.n_heads
        )
    })?;
    ensure(out.len() == q.len(), OP, || {
        format!("out {} != q {}", out.len(), q.len())
    })?;
    let group = p.n_heads / p.n_kv_heads;
    let n_keys = kv.num_keys();
    out.par_chunks_mut(d).enumerate().for_each(|(task, o)| {
        let (t, h) = (task / p.n_heads, task % p.n_heads);
        let kv_head = h / group;
        let qv = &q[task * d..(task + 1) * d];
        let q_pos = q_positions[t];
        let mut scratch = vec![0f32; d];
        // (key index, score) for the visible keys only.
        let mut scores: Vec<(usize, f32)> = Vec::with_capacity(n_keys);
        let mut max = f32::NEG_INFINITY;
        for i in 0..n_keys {
            if !p.visible(q_pos, kv.position(i)) {
                continue;
            }
            let mut s = dot(kv.key(i, kv_head, &mut scratch), qv) * p.scale;
            if let Some(cap) = p.softcap {
                s = cap * (s / cap).tanh();
            }
            max = max.max(s);
            scores.push((i, s));
        }
        o.fill(0.0);
        if scores.is_empty() {
            return;
        }
        let mut sum = 0f32;
        for (i, s) in scores {
            let w = (s - max).exp();
            sum += w;
            axpy(o, w, kv.value(i, kv_head, &mut scratch));
        }
        let inv = 1.0 / sum;
        for v in o.iter_mut() {
            *v *= inv;
        }
    });
    Ok(())
}

pub(crate) fn attention(
    q: &CpuBuffer,
    k: &CpuBuffer,
    v: &CpuBuffer,
    q_positions: &[u32],
    k_positions: &[u32],
    p: AttentionParams,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "attention";
    let (q, k, v) = (q.f32s(OP)?, k.f32s(OP)?, v.f32s(OP)?);
    let out = out.f32s_mut(OP)?;
    let kv_row = p.n_kv_heads * p.head_dim;
    ensure(
        k.len() == k_positions.len() * kv_row && v.len() == k.len(),
        OP,
        || {
            format!(
                "k {} / v {} elements, want {} keys x {} kv heads x {}",
                k.len(),
                v.len(),
                k_positions.len(),
                p.n_kv_heads,
                p.head_dim
            )
        },
    )?;
    let kv = ContiguousKv {
        k,
        v,
        positions: k_positions,
        n_kv_heads: p.n_kv_heads,
        head_dim: p.head_dim,
    };
    attention_over(q, q_positions, &kv, p, out)
}
