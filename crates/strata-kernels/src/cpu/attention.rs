//! Attention for prefill, extend and decode over explicitly positioned keys.
//!
//! Past `KEY_CHUNK` keys, one parallel task per (query token, KV head, run of `KEY_CHUNK`
//! keys): each key and value row is read (and, from a quantized pool, converted) once for all
//! the query heads of its group, the task keeps each head's maximum, weight sum and weighted
//! value sum, and the runs of a (token, head) are merged in key order at the end. Splitting
//! the keys gives a decode step over a long context work for every thread whatever the head
//! count. Up to `KEY_CHUNK` keys, one task per (query token, query head) in one pass. Both
//! are fixed by the key count alone, so a token's result does not depend on its batch.
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
    let runs = n_keys.div_ceil(KEY_CHUNK).max(1);
    if runs == 1 {
        // Few keys: one pass, a task per (token, query head), which spreads a decode step
        // of few KV heads over the threads better than a task per group would.
        out.par_chunks_mut(d).enumerate().for_each(|(task, o)| {
            let (t, h) = (task / p.n_heads, task % p.n_heads);
            let qs = (&q[task * d..(task + 1) * d], q_positions[t]);
            let run = key_run(kv, &p, qs, h / group, 0..n_keys);
            merge_runs(std::slice::from_ref(&run), 1, d, o);
        });
        return Ok(());
    }
    let tokens = q_positions.len();
    let partials: Vec<Run> = (0..tokens * p.n_kv_heads * runs)
        .into_par_iter()
        .map(|task| {
            let (tg, c) = (task / runs, task % runs);
            let (t, g) = (tg / p.n_kv_heads, tg % p.n_kv_heads);
            let qs = &q[(t * p.n_heads + g * group) * d..(t * p.n_heads + (g + 1) * group) * d];
            let keys = c * KEY_CHUNK..n_keys.min((c + 1) * KEY_CHUNK);
            key_run(kv, &p, (qs, q_positions[t]), g, keys)
        })
        .collect();
    out.par_chunks_mut(group * d)
        .zip(partials.par_chunks(runs))
        .for_each(|(o, parts)| merge_runs(parts, group, d, o));
    Ok(())
}

/// Keys a task takes at most: a decode step over a long context splits into runs of this
/// many, so that all threads share it.
const KEY_CHUNK: usize = 256;

/// One task's share of the softmax for the `group` heads of a KV head: per head the
/// maximum score, the sum of `exp(score - max)` and the value rows weighted by it.
struct Run {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

/// The [`Run`] of queries `qs` (the group's heads, `[group, d]`) at `q_pos` over keys
/// `keys` of KV head `g`.
fn key_run<K: KvSource>(
    kv: &K,
    p: &AttentionParams,
    (qs, q_pos): (&[f32], u32),
    g: usize,
    keys: std::ops::Range<usize>,
) -> Run {
    let d = p.head_dim;
    let group = qs.len() / d;
    let mut scratch = vec![0f32; d];
    let visible: Vec<usize> = keys.filter(|&i| p.visible(q_pos, kv.position(i))).collect();
    let n = visible.len();
    let mut scores = vec![0f32; group * n];
    for (j, &i) in visible.iter().enumerate() {
        let k = kv.key(i, g, &mut scratch);
        for h in 0..group {
            let mut s = dot(k, &qs[h * d..(h + 1) * d]) * p.scale;
            if let Some(cap) = p.softcap {
                s = cap * (s / cap).tanh();
            }
            scores[h * n + j] = s;
        }
    }
    let max: Vec<f32> = (0..group)
        .map(|h| {
            scores[h * n..(h + 1) * n]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &s| m.max(s))
        })
        .collect();
    let mut sum = vec![0f32; group];
    let mut acc = vec![0f32; group * d];
    for (j, &i) in visible.iter().enumerate() {
        let v = kv.value(i, g, &mut scratch);
        for h in 0..group {
            let w = (scores[h * n + j] - max[h]).exp();
            sum[h] += w;
            axpy(&mut acc[h * d..(h + 1) * d], w, v);
        }
    }
    Run { max, sum, acc }
}

/// Merges a (token, KV head)'s runs, in key order, into its heads' outputs `o`
/// (`[group, d]`); a head that sees no key gets zeros.
fn merge_runs(parts: &[Run], group: usize, d: usize, o: &mut [f32]) {
    for h in 0..group {
        let out = &mut o[h * d..(h + 1) * d];
        out.fill(0.0);
        let m = parts.iter().fold(f32::NEG_INFINITY, |m, r| m.max(r.max[h]));
        if m == f32::NEG_INFINITY {
            continue;
        }
        let mut total = 0f32;
        for r in parts.iter().filter(|r| r.max[h] != f32::NEG_INFINITY) {
            let f = (r.max[h] - m).exp();
            total += f * r.sum[h];
            axpy(out, f, &r.acc[h * d..(h + 1) * d]);
        }
        let inv = 1.0 / total;
        for v in out.iter_mut() {
            *v *= inv;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 attention of one head, the definition.
    fn reference(q: &[f32], kv: &ContiguousKv, qp: u32, g: usize, p: &AttentionParams) -> Vec<f64> {
        let d = p.head_dim;
        let mut scores = Vec::new();
        for i in 0..kv.num_keys() {
            if !p.visible(qp, kv.position(i)) {
                continue;
            }
            let k = &kv.k[kv.row(i, g)];
            let mut s = k
                .iter()
                .zip(q)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>()
                * f64::from(p.scale);
            if let Some(cap) = p.softcap {
                s = f64::from(cap) * (s / f64::from(cap)).tanh();
            }
            scores.push((i, s));
        }
        let mut out = vec![0f64; d];
        let m = scores.iter().fold(f64::NEG_INFINITY, |m, s| m.max(s.1));
        let total: f64 = scores.iter().map(|s| (s.1 - m).exp()).sum();
        for (i, s) in scores {
            let w = (s - m).exp() / total;
            for (o, &v) in out.iter_mut().zip(&kv.v[kv.row(i, g)]) {
                *o += w * f64::from(v);
            }
        }
        out
    }

    /// Past `KEY_CHUNK` keys (several runs merged) and below it, with grouped heads, a
    /// window, a softcap and a query that sees no key: within f32 rounding of the f64
    /// definition.
    #[test]
    fn runs_of_keys_merge_to_the_definition() {
        let (d, nkv, group) = (16, 2, 3);
        let n_heads = nkv * group;
        let mut x = 1u64;
        let mut rnd = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        for (n_keys, window, softcap) in [
            (700, None, None),
            (600, Some(300), Some(5.0)),
            (40, None, Some(2.0)),
        ] {
            let k: Vec<f32> = (0..n_keys * nkv * d).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..n_keys * nkv * d).map(|_| rnd()).collect();
            // Keys at positions 10.. ; a query at 5 sees none.
            let positions: Vec<u32> = (0..n_keys as u32).map(|i| i + 10).collect();
            let q_positions = [5u32, n_keys as u32 / 2 + 10, n_keys as u32 + 9];
            let q: Vec<f32> = (0..q_positions.len() * n_heads * d)
                .map(|_| 4.0 * rnd())
                .collect();
            let kv = ContiguousKv {
                k: &k,
                v: &v,
                positions: &positions,
                n_kv_heads: nkv,
                head_dim: d,
            };
            let p = AttentionParams {
                n_heads,
                n_kv_heads: nkv,
                head_dim: d,
                scale: 0.3,
                window,
                causal: true,
                softcap,
            };
            let mut out = vec![f32::NAN; q.len()];
            attention_over(&q, &q_positions, &kv, p, &mut out).unwrap();
            for (t, &qp) in q_positions.iter().enumerate() {
                for h in 0..n_heads {
                    let at = (t * n_heads + h) * d;
                    let want = reference(&q[at..at + d], &kv, qp, h / group, &p);
                    for (a, b) in out[at..at + d].iter().zip(&want) {
                        assert!(
                            (f64::from(*a) - b).abs() < 1e-5,
                            "{n_keys} keys, token {t}, head {h}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
