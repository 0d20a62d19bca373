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
//! Within a task the scores take one key row at a time for the group's heads; the weighted
//! value sums then walk all the task's value rows eight values at a time, the heads' sums in
//! registers ([`axpy_rows`]: the row-at-a-time arithmetic in the same order, so the same
//! bits).
//!
//! Keys and values are read through [`KvSource`], so the same kernel serves contiguous f32
//! buffers ([`ContiguousKv`]) and a paged pool, whose bf16 rows are read in place
//! ([`KvRow`]) and whose 8-bit rows are dequantized one at a time into scratch.

use super::buffer::CpuBuffer;
use super::dot::axpy;
use super::elementwise::exp_f32;
use super::kv_row::{axpy_rows, KvRow};
use super::par::with_scratch;
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
    /// Key `i` as stored, where the kernel reads that format in place (bf16); by default
    /// [`KvSource::key`]'s f32 values.
    fn key_row<'a>(&'a self, i: usize, kv_head: usize, scratch: &'a mut [f32]) -> KvRow<'a> {
        KvRow::F32(self.key(i, kv_head, scratch))
    }
    /// Value `i` as stored, as [`KvSource::key_row`].
    fn value_row<'a>(&'a self, i: usize, kv_head: usize, scratch: &'a mut [f32]) -> KvRow<'a> {
        KvRow::F32(self.value(i, kv_head, scratch))
    }
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
    // Scores head-major (`[group, n]`), each key's row read once for the group.
    let mut scores = vec![0f32; group * n];
    let mut per_key = vec![0f32; group];
    for (j, &i) in visible.iter().enumerate() {
        kv.key_row(i, g, &mut scratch).dot_group(qs, &mut per_key);
        for (h, &dot) in per_key.iter().enumerate() {
            let mut s = dot * p.scale;
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
    // The weights exp(score - max), a head's row at a time through the vector exp, then
    // summed in key order.
    let mut sum = vec![0f32; group];
    for h in 0..group {
        let row = &mut scores[h * n..(h + 1) * n];
        exp_shifted(row, max[h]);
        sum[h] = row.iter().sum();
    }
    let mut acc = vec![0f32; group * d];
    // Every value row at once (rows converted from the pool's format each get their own
    // part of the thread's scratch), then summed eight values at a time across all of them.
    with_scratch(n * d, |row_scratch| {
        let rows: Vec<KvRow<'_>> = visible
            .iter()
            .zip(row_scratch.chunks_mut(d.max(1)))
            .map(|(&i, s)| kv.value_row(i, g, s))
            .collect();
        axpy_rows(&rows, &scores, &mut acc);
    });
    Run { max, sum, acc }
}

/// `x = exp(x - m)` for each value, through [`exp_f32`] (within 2 ulp of the library's,
/// no call, so the loop vectorizes: 8 lanes where the CPU has AVX2, with the same bits as 4
/// without, since it has plain multiplies and adds, no fused ones); exactly 0 below -87,
/// where `exp_f32` clamps; NaN stays NaN.
fn exp_shifted(xs: &mut [f32], m: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { exp_shifted_avx2(xs, m) };
    }
    exp_shifted_portable(xs, m);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_shifted_avx2(xs: &mut [f32], m: f32) {
    exp_shifted_portable(xs, m);
}

#[inline(always)]
fn exp_shifted_portable(xs: &mut [f32], m: f32) {
    for x in xs.iter_mut() {
        let d = *x - m;
        *x = if d < -87.0 { 0.0 } else { exp_f32(d) };
    }
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

    /// The vector exp within 2 ulp of f64's over the range softmax weights take, exactly 0
    /// below -87 and at -inf, NaN kept.
    #[test]
    fn exp_shifted_is_close_to_f64_exp() {
        let xs: Vec<f32> = (0..=200_000).map(|i| -90.0 + i as f32 * 0.00045).collect();
        let mut got = xs.clone();
        exp_shifted(&mut got, 0.0);
        for (&x, &g) in xs.iter().zip(&got) {
            if x < -87.0 {
                assert_eq!(g, 0.0, "exp({x})");
                continue;
            }
            let want = f64::from(x).exp();
            let rel = (f64::from(g) - want).abs() / want;
            assert!(rel < 2.5e-7, "exp({x}) = {g}, want {want} (rel {rel:.2e})");
        }
        let mut odd = [f32::NEG_INFINITY, f32::NAN, 3.0];
        exp_shifted(&mut odd, 3.0);
        assert_eq!(odd[0], 0.0);
        assert!(odd[1].is_nan());
        assert_eq!(odd[2], 1.0);
    }

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
