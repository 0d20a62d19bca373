//! Attention for prefill, extend and decode over explicitly positioned keys.
//!
//! Past `KEY_CHUNK` keys, one parallel task per (KV head, run of `KEY_CHUNK` keys, tile of
//! `TILE_TOKENS` query tokens): each key and value row is read (and, from a quantized pool,
//! converted) once for all the query heads of its group, and where every token of the tile
//! sees every key of the run (a prompt's keys before its diagonal) once for the whole tile;
//! the task keeps each (token, head)'s maximum, weight sum and weighted value sum, and the
//! runs of a (token, head) are merged in key order at the end. Splitting the keys gives a
//! decode step over a long context work for every thread whatever the head count. Up to
//! `KEY_CHUNK` keys, one task per (query token, query head) in one pass. Each (token, head)
//! takes the same arithmetic in either case, fixed by the key count alone, so a token's
//! result does not depend on its batch or tile.
//!
//! Within a task the scores take one key row at a time for all the task's query rows; the
//! weighted value sums then walk blocks of the task's value rows eight values at a time, the
//! rows' sums in registers ([`axpy_rows`]: the row-at-a-time arithmetic in the same order,
//! so the same bits).
//!
//! Keys and values are read through [`KvSource`], so the same kernel serves contiguous f32
//! buffers ([`ContiguousKv`]) and a paged pool, whose f32 and bf16 rows are read in place
//! ([`KvRow`]) and whose 8-bit rows are dequantized one at a time into scratch. Keys whose
//! positions ascend (a sequence's) give each query its visible keys by bisection.

use super::buffer::CpuBuffer;
use super::dot::axpy;
use super::elementwise::exp_f32;
use super::kv_row::{axpy_rows, KvRow};
use super::par::{with_scratch, with_scratch_in, Scratch};
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
    /// Key `i` as stored, where the kernel reads that format in place (bf16, f32); by default
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
    // Keys in position order (a sequence's, as a pool and a prompt hold them): the keys a
    // query sees are one range, found by bisection instead of a test a key.
    let n = kv.num_keys();
    let ascending = (1..n).all(|i| kv.position(i - 1) <= kv.position(i));
    attention_over_keys(q, q_positions, kv, p, out, ascending)
}

/// [`attention_over`], the visible keys found by bisection where `ascending` (the keys'
/// positions in order) and by a test a key otherwise.
fn attention_over_keys<K: KvSource>(
    q: &[f32],
    q_positions: &[u32],
    kv: &K,
    p: AttentionParams,
    out: &mut [f32],
    ascending: bool,
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
        // Few keys: one pass, a task per (token, `per` query heads of one group): a key row
        // read once serves the task's heads, and `per` is the largest part of a group that
        // still gives every thread a task (a decode step has few KV heads).
        let tasks_at = |per: usize| q_positions.len() * p.n_heads / per;
        let threads = rayon::current_num_threads();
        let per = (1..=group)
            .rev()
            .find(|&per| group.is_multiple_of(per) && per <= MAX_GROUP && tasks_at(per) >= threads)
            .unwrap_or(1);
        out.par_chunks_mut(per * d)
            .enumerate()
            .for_each(|(task, o)| {
                let (t, h0) = (task * per / p.n_heads, task * per % p.n_heads);
                let q = &q[(t * p.n_heads + h0) * d..][..per * d];
                let mut stats = [0f32; 2 * MAX_GROUP];
                let (max, sum) = stats[..2 * per].split_at_mut(per);
                with_visible(
                    kv,
                    &p,
                    (&[q_positions[t]], ascending),
                    0..n_keys,
                    |visible| {
                        rows_run(kv, &p, q, h0 / group, visible[0], (max, sum, o));
                    },
                );
                // One run: its merge weight is exp(0) = 1, so the weighted sum (`o` itself)
                // and the weight sum stand as they are.
                for ((o, &m), &s) in o.chunks_mut(d).zip(&*max).zip(&*sum) {
                    if m == f32::NEG_INFINITY {
                        o.fill(0.0);
                        continue;
                    }
                    let inv = 1.0 / s;
                    for v in o.iter_mut() {
                        *v *= inv;
                    }
                }
            });
        return Ok(());
    }
    let tokens = q_positions.len();
    let tiles = tokens.div_ceil(TILE_TOKENS);
    let len = TILE_TOKENS * group * (d + 2);
    // Every task's runs side by side. A task is (KV head, run of keys, tile of tokens), the
    // tiles innermost, so that a thread's next task mostly reads the same keys and values,
    // still in its caches.
    let mut partials = vec![0f32; tiles * p.n_kv_heads * runs * len];
    partials
        .par_chunks_mut(len)
        .enumerate()
        .for_each(|(task, chunk)| {
            let (gc, tile) = (task / tiles, task % tiles);
            let (g, c) = (gc / runs, gc % runs);
            let ts = tile * TILE_TOKENS..tokens.min((tile + 1) * TILE_TOKENS);
            let keys = c * KEY_CHUNK..n_keys.min((c + 1) * KEY_CHUNK);
            let qs = (q, &q_positions[ts.clone()], ascending);
            tile_run(kv, &p, qs, ts.start, g, keys, chunk);
        });
    let rows = TILE_TOKENS * group;
    out.par_chunks_mut(group * d)
        .enumerate()
        .for_each(|(tg, o)| {
            let (t, g) = (tg / p.n_kv_heads, tg % p.n_kv_heads);
            let (tile, row0) = (t / TILE_TOKENS, (t % TILE_TOKENS) * group);
            let at = |c: usize| {
                let chunk = &partials[((g * runs + c) * tiles + tile) * len..][..len];
                let (max, rest) = chunk.split_at(rows);
                let (sum, acc) = rest.split_at(rows);
                RunRef {
                    max: &max[row0..row0 + group],
                    sum: &sum[row0..row0 + group],
                    acc: &acc[row0 * d..(row0 + group) * d],
                }
            };
            let parts: Vec<RunRef<'_>> = (0..runs).map(at).collect();
            merge_runs(&parts, group, d, o);
        });
    Ok(())
}

/// Query heads a one-run task takes at most (its softmax statistics live on the stack).
const MAX_GROUP: usize = 16;

/// Keys a task takes at most: a decode step over a long context splits into runs of this
/// many, so that all threads share it.
const KEY_CHUNK: usize = 256;

/// Query tokens a task takes: where every key of a run is visible to all of them (a
/// prompt's keys before its diagonal), each key and value row is read once for all their
/// heads, while it is in the core's first cache, instead of once a token. Each row's
/// arithmetic is the one-token task's, so the bits do not depend on the tile.
const TILE_TOKENS: usize = 4;

/// One task's share of the softmax for some query rows: per row the maximum score, the sum
/// of `exp(score - max)` and the value rows weighted by it (`[rows, d]`).
struct RunRef<'a> {
    max: &'a [f32],
    sum: &'a [f32],
    acc: &'a [f32],
}

thread_local!(static VISIBLE: std::cell::RefCell<Vec<usize>> =
    const { std::cell::RefCell::new(Vec::new()) });

/// Calls `f` with each query position's visible keys among `keys` (from this thread's
/// scratch), by bisection where the keys' positions `ascending`.
fn with_visible<K: KvSource, R>(
    kv: &K,
    p: &AttentionParams,
    (q_pos, ascending): (&[u32], bool),
    keys: std::ops::Range<usize>,
    f: impl FnOnce(&[&[usize]]) -> R,
) -> R {
    let mut all = VISIBLE.with(|v| v.take());
    all.clear();
    let mut ends = [0usize; TILE_TOKENS];
    for (e, &qp) in ends.iter_mut().zip(q_pos) {
        if ascending && !keys.is_empty() {
            // Visible keys are those neither too far behind the query nor ahead of it: with
            // positions in order, one range between two bisections.
            let behind = |i: usize| {
                let k_pos = kv.position(keys.start + i);
                !p.visible(qp, k_pos) && k_pos <= qp
            };
            let ahead = |i: usize| p.causal && kv.position(keys.start + i) > qp;
            let lo = bisect(0..keys.len(), behind);
            let hi = bisect(lo..keys.len(), |i| !ahead(i));
            all.extend(keys.start + lo..keys.start + hi);
        } else {
            all.extend(keys.clone().filter(|&i| p.visible(qp, kv.position(i))));
        }
        *e = all.len();
    }
    let mut lists: [&[usize]; TILE_TOKENS] = [&[]; TILE_TOKENS];
    let mut from = 0;
    for (l, &e) in lists.iter_mut().zip(&ends[..q_pos.len()]) {
        *l = &all[from..e];
        from = e;
    }
    let r = f(&lists[..q_pos.len()]);
    VISIBLE.with(|v| *v.borrow_mut() = all);
    r
}

/// The first index of `range` where `pred` is false, `pred` being true up to some index and
/// false from it on.
fn bisect(range: std::ops::Range<usize>, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (range.start, range.end);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The runs of the query tokens `ts` (positions `q_pos`, the first token `t0` of `q`) over
/// keys `keys` of KV head `g`, into `chunk`: `[rows]` maxima, `[rows]` sums, `[rows, d]`
/// weighted sums, a row a (token, head of the group). Where every token sees every key, the
/// rows share one pass; otherwise each token takes its own.
fn tile_run<K: KvSource>(
    kv: &K,
    p: &AttentionParams,
    (q, q_pos, ascending): (&[f32], &[u32], bool),
    t0: usize,
    g: usize,
    keys: std::ops::Range<usize>,
    chunk: &mut [f32],
) {
    let d = p.head_dim;
    let group = p.n_heads / p.n_kv_heads;
    let rows = TILE_TOKENS * group;
    let (max, rest) = chunk.split_at_mut(rows);
    let (sum, acc) = rest.split_at_mut(rows);
    let qs = |t: usize| &q[((t0 + t) * p.n_heads + g * group) * d..][..group * d];
    let n_run = keys.len();
    with_visible(kv, p, (q_pos, ascending), keys, |visible| {
        let used = q_pos.len() * group;
        if q_pos.len() > 1 && visible.iter().all(|v| v.len() == n_run) {
            // The tile's query rows side by side, then one pass.
            // The query rows' own scratch: `rows_run` takes the shared one.
            with_scratch_in(&QUERY_SCRATCH, used * d, |tile_q| {
                for (t, dst) in tile_q.chunks_mut(group * d).enumerate() {
                    dst.copy_from_slice(qs(t));
                }
                let out = (&mut max[..used], &mut sum[..used], &mut acc[..used * d]);
                rows_run(kv, p, tile_q, g, visible[0], out);
            });
            return;
        }
        for (t, vis) in visible.iter().enumerate() {
            let r = t * group..(t + 1) * group;
            let out = (
                &mut max[r.clone()],
                &mut sum[r.clone()],
                &mut acc[r.start * d..r.end * d],
            );
            rows_run(kv, p, qs(t), g, vis, out);
        }
    })
}

thread_local!(static QUERY_SCRATCH: Scratch = const { std::cell::RefCell::new(Vec::new()) });

/// The softmax share of query rows `qs` (`[rows, d]`, all of KV head `g`) over the keys
/// `visible`, into `(max, sum, acc)` (`[rows]`, `[rows]`, `[rows, d]`). The scores and
/// weights live in this thread's scratch.
fn rows_run<K: KvSource>(
    kv: &K,
    p: &AttentionParams,
    qs: &[f32],
    g: usize,
    visible: &[usize],
    (max, sum, acc): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let d = p.head_dim;
    let rows = qs.len() / d;
    let n = visible.len();
    // Scores row-major (`[rows, n]`), then `rows` of one key's, then a key row converted
    // from the pool's format, then the value rows converted.
    with_scratch(rows * n + rows + d + n * d, |scratch| {
        let (scores, rest) = scratch.split_at_mut(rows * n);
        let (per_key, rest) = rest.split_at_mut(rows);
        let (key, row_scratch) = rest.split_at_mut(d);
        // Each key's row read once for all the rows.
        for (j, &i) in visible.iter().enumerate() {
            kv.key_row(i, g, key).dot_group(qs, per_key);
            for (r, &dot) in per_key.iter().enumerate() {
                scores[r * n + j] = dot;
            }
        }
        for (r, m) in max.iter_mut().enumerate() {
            let row = &mut scores[r * n..(r + 1) * n];
            for s in row.iter_mut() {
                *s *= p.scale;
            }
            if let Some(cap) = p.softcap {
                for s in row.iter_mut() {
                    *s = cap * (*s / cap).tanh();
                }
            }
            *m = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            // The weights exp(score - max) through the vector exp.
            exp_shifted(row, *m);
        }
        sum_rows(scores, n, sum);
        acc.fill(0.0);
        // Every value row at once (rows converted from the pool's format each get their
        // own part of the scratch), then summed eight values at a time across all of them.
        let values: Vec<KvRow<'_>> = visible
            .iter()
            .zip(row_scratch.chunks_mut(d.max(1)))
            .map(|(&i, s)| kv.value_row(i, g, s))
            .collect();
        axpy_rows(&values, scores, acc);
    });
}

/// `sums[r]` = the sum of row `r` of `rows` (`[sums.len(), n]`) in order, as
/// `iter().sum()` adds; four rows side by side, so that each add waits only on its own
/// row's last one.
fn sum_rows(rows: &[f32], n: usize, sums: &mut [f32]) {
    for (r0, out) in (0..sums.len()).step_by(4).zip(sums.chunks_mut(4)) {
        let mut acc = [-0.0f32; 4];
        for j in 0..n {
            for (k, a) in acc.iter_mut().enumerate().take(out.len()) {
                *a += rows[(r0 + k) * n + j];
            }
        }
        out.copy_from_slice(&acc[..out.len()]);
    }
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

/// Merges a (token, KV head)'s runs (`parts`), in key order, into its heads' outputs `o`
/// (`[group, d]`); a head that sees no key gets zeros.
fn merge_runs(parts: &[RunRef<'_>], group: usize, d: usize, o: &mut [f32]) {
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

    /// Rows summed side by side give `iter().sum()`'s bits, row by row.
    #[test]
    fn rows_summed_together_equal_each_summed() {
        for (rows, n) in [(1, 5), (3, 256), (7, 33), (12, 0)] {
            let xs: Vec<f32> = (0..rows * n)
                .map(|i| ((i * 7919) % 1013) as f32 / 97.0 + 1e-3)
                .collect();
            let mut got = vec![f32::NAN; rows];
            sum_rows(&xs, n, &mut got);
            for (r, g) in got.iter().enumerate() {
                let want: f32 = xs[r * n..(r + 1) * n].iter().sum();
                assert_eq!(g.to_bits(), want.to_bits(), "{rows} rows of {n}, row {r}");
            }
        }
    }

    /// Pseudo-random values in [-0.5, 0.5) from `seed`.
    fn uniform(seed: u64) -> impl FnMut() -> f32 {
        let mut x = seed;
        move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        }
    }

    /// Random keys and values for `n_keys` positions from `first`, `nkv` heads of `d`.
    struct RandomKv {
        k: Vec<f32>,
        v: Vec<f32>,
        positions: Vec<u32>,
        nkv: usize,
        d: usize,
    }

    impl RandomKv {
        fn new(
            rnd: &mut impl FnMut() -> f32,
            n_keys: usize,
            nkv: usize,
            d: usize,
            first: u32,
        ) -> Self {
            let k = (0..n_keys * nkv * d).map(|_| rnd()).collect();
            let v = (0..n_keys * nkv * d).map(|_| rnd()).collect();
            let positions = (0..n_keys as u32).map(|i| i + first).collect();
            Self {
                k,
                v,
                positions,
                nkv,
                d,
            }
        }

        fn view(&self) -> ContiguousKv<'_> {
            ContiguousKv {
                k: &self.k,
                v: &self.v,
                positions: &self.positions,
                n_kv_heads: self.nkv,
                head_dim: self.d,
            }
        }
    }

    /// Causal-or-not attention parameters of `nkv` groups of `group` heads of `d`.
    fn params(
        (nkv, group, d): (usize, usize, usize),
        scale: f32,
        window: Option<usize>,
        causal: bool,
        softcap: Option<f32>,
    ) -> AttentionParams {
        AttentionParams {
            n_heads: nkv * group,
            n_kv_heads: nkv,
            head_dim: d,
            scale,
            window,
            causal,
            softcap,
        }
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
        let mut rnd = uniform(1);
        for (n_keys, window, softcap) in [
            (700, None, None),
            (600, Some(300), Some(5.0)),
            (40, None, Some(2.0)),
        ] {
            // Keys at positions 10.. ; a query at 5 sees none.
            let keys = RandomKv::new(&mut rnd, n_keys, nkv, d, 10);
            let q_positions = [5u32, n_keys as u32 / 2 + 10, n_keys as u32 + 9];
            let q: Vec<f32> = (0..q_positions.len() * n_heads * d)
                .map(|_| 4.0 * rnd())
                .collect();
            let kv = keys.view();
            let p = params((nkv, group, d), 0.3, window, true, softcap);
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

    /// A token's output has the same bits whatever tokens share its pass: a prompt's tokens
    /// in tiles (runs of keys every token of a tile sees, one pass for the tile) and each
    /// token alone, over several runs of keys; with grouped heads, a window, a softcap,
    /// queries past every key, queries on the diagonal and keys on both sides (not causal).
    #[test]
    fn tokens_in_tiles_equal_each_alone() {
        let mut rnd = uniform(7);
        let n_keys = 700;
        for (d, nkv, group, window, softcap, first, causal) in [
            (16, 2, 3, None, None, 663, true),
            (64, 1, 4, Some(400), Some(5.0), 663, true),
            (32, 3, 1, None, None, 700, true),
            (16, 1, 2, Some(300), None, 700, true),
            (16, 2, 2, Some(200), None, 300, false),
        ] {
            let n_heads = nkv * group;
            let keys = RandomKv::new(&mut rnd, n_keys, nkv, d, 0);
            let q_positions: Vec<u32> = (first..first + 37).collect();
            let q: Vec<f32> = (0..q_positions.len() * n_heads * d)
                .map(|_| 4.0 * rnd())
                .collect();
            let kv = keys.view();
            let p = params((nkv, group, d), 0.25, window, causal, softcap);
            let mut all = vec![f32::NAN; q.len()];
            attention_over(&q, &q_positions, &kv, p, &mut all).unwrap();
            // Keys in order take their visible range by bisection: the same keys as a test
            // a key, so the same bits.
            let mut tested = vec![f32::NAN; q.len()];
            attention_over_keys(&q, &q_positions, &kv, p, &mut tested, false).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all), bits(&tested), "d {d}, window {window:?}");
            let row = n_heads * d;
            for (t, &qp) in q_positions.iter().enumerate() {
                let mut alone = vec![f32::NAN; row];
                attention_over(&q[t * row..(t + 1) * row], &[qp], &kv, p, &mut alone).unwrap();
                assert_eq!(
                    bits(&all[t * row..(t + 1) * row]),
                    bits(&alone),
                    "d {d}, group {group}, window {window:?}, token at {qp}"
                );
            }
        }
    }

    /// A decode step over few keys splits a group's heads into tasks by the thread count:
    /// each head's row has the same bits however many heads its task took.
    #[test]
    fn heads_in_one_task_equal_each_alone() {
        let mut rnd = uniform(11);
        let n_keys = 200;
        for (d, nkv, group, window, softcap) in [
            (16, 2, 3, None, None),
            (64, 1, 4, Some(150), Some(5.0)),
            (32, 3, 1, None, None),
            (16, 1, 8, None, None),
        ] {
            let n_heads = nkv * group;
            let keys = RandomKv::new(&mut rnd, n_keys, nkv, d, 0);
            let q: Vec<f32> = (0..n_heads * d).map(|_| 4.0 * rnd()).collect();
            let kv = keys.view();
            let p = params((nkv, group, d), 0.25, window, true, softcap);
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut out = vec![f32::NAN; q.len()];
                pool.install(|| attention_over(&q, &[n_keys as u32 - 1], &kv, p, &mut out))
                    .unwrap();
                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let whole_groups = run(1);
            for threads in [2, 3, 4, 8] {
                assert_eq!(
                    run(threads),
                    whole_groups,
                    "d {d}, group {group}, {threads} threads"
                );
            }
        }
    }
}
