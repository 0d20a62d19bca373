//! `out[T, N] = x[T, K] * W^T` with `W` row-major `[N, K]`: dense f32/bf16/f16 and
//! quantized (`RowDot`) weights.
//!
//! Work is split over blocks of output rows (each weight row is read by one thread).
//! Within a block, tokens are taken a tile at a time and each weight row is dotted with
//! every token of the tile while it sits in L1, so a weight row comes from memory once per
//! tile rather than once per token; the row block stays in L2 while the tiles pass over it.
//! For T > 1 results are produced row-major per weight row (`[N, T]`) and transposed at
//! the end, which keeps every parallel write contiguous.
//!
//! Quantized weights whose format can [`RowDot::prepare`] its inputs (8-bit activation
//! blocks for an integer dot) get them converted once per call, before the rows are split;
//! each task then hands a whole range of rows (and a tile of tokens) to
//! [`RowDot::dot_prepared`], so there is one dynamic call per task rather than per row.

use super::buffer::CpuBuffer;
use super::dot::{dot, DotWith};
use super::elementwise;
use super::par::with_scratch;
use crate::error::ensure;
use crate::quant::{PreparedInput, RowDot};
use crate::{Activation, DeviceBuffer, MatmulShape, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Tokens per outer tile: the slice of `x` that stays hot while a row block passes.
const OUTER_TOKENS: usize = 32;

/// A weight matrix seen one row at a time.
trait RowKernel: Sync {
    /// `out[i] = W[row] . xs[i*K .. (i+1)*K]` for each of the `out.len()` token vectors.
    fn dot_row_tokens(&self, row: usize, xs: &[f32], out: &mut [f32]);
}

struct Dense<'a, W> {
    w: &'a [W],
    cols: usize,
}

impl<W: DotWith> RowKernel for Dense<'_, W> {
    fn dot_row_tokens(&self, row: usize, xs: &[f32], out: &mut [f32]) {
        let k = self.cols;
        // The row (a few KiB) stays in L1 while every token of the tile passes over it.
        let w = &self.w[row * k..(row + 1) * k];
        for (o, x) in out.iter_mut().zip(xs.chunks_exact(k)) {
            *o = dot(w, x);
        }
    }
}

/// f16 has no cheap inline widening, so each row is converted once (SIMD where the CPU
/// has F16C) into a thread-local scratch row and then dotted as f32.
struct DenseF16<'a> {
    w: &'a [f16],
    cols: usize,
}

impl RowKernel for DenseF16<'_> {
    fn dot_row_tokens(&self, row: usize, xs: &[f32], out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        use std::cell::RefCell;
        thread_local!(static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) });
        let k = self.cols;
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            s.resize(k, 0.0);
            self.w[row * k..(row + 1) * k].convert_to_f32_slice(&mut s);
            Dense { w: &s[..], cols: k }.dot_row_tokens(0, xs, out);
        });
    }
}

struct Quant<'a>(&'a dyn RowDot);

impl RowKernel for Quant<'_> {
    fn dot_row_tokens(&self, row: usize, xs: &[f32], out: &mut [f32]) {
        if out.len() == 1 {
            out[0] = self.0.dot_row(row, xs);
        } else {
            self.0.dot_row_many(row, xs, out);
        }
    }
}

/// Output rows per parallel task: enough tasks to balance, few enough to amortise.
fn rows_per_task(rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (rows / (threads * 8)).clamp(1, 64)
}

fn run(kernel: &dyn RowKernel, x: &[f32], k: usize, n: usize, out: &mut [f32]) {
    let tokens = x.len() / k;
    let block = rows_per_task(n);
    if tokens == 1 {
        out.par_chunks_mut(block).enumerate().for_each(|(b, o)| {
            for (r, o) in o.iter_mut().enumerate() {
                kernel.dot_row_tokens(b * block + r, x, std::slice::from_mut(o));
            }
        });
        return;
    }
    by_row_blocks(tokens, n, block, out, |r0, o| {
        for t0 in (0..tokens).step_by(OUTER_TOKENS) {
            let t1 = (t0 + OUTER_TOKENS).min(tokens);
            for r in 0..o.len() / tokens {
                kernel.dot_row_tokens(
                    r0 + r,
                    &x[t0 * k..t1 * k],
                    &mut o[r * tokens + t0..r * tokens + t1],
                );
            }
        }
    });
}

/// Runs `fill(first_row, rows)` over blocks of `block` rows of a row-major `[n, tokens]`
/// result in parallel (on the thread's scratch), then transposes it into `out [tokens, n]`.
/// `fill` must write every value of its rows.
fn by_row_blocks(
    tokens: usize,
    n: usize,
    block: usize,
    out: &mut [f32],
    fill: impl Fn(usize, &mut [f32]) + Sync,
) {
    with_scratch(n * tokens, |by_row| {
        by_row
            .par_chunks_mut(block * tokens)
            .enumerate()
            .for_each(|(b, o)| fill(b * block, o));
        transpose(by_row, tokens, n, out);
    });
}

/// `out[t * n + r] = by_row[r * tokens + t]`, a strip of `STRIP` tokens at a time so each
/// read of `by_row` uses a whole cache line and the strip's output rows are written in
/// order (a plain token-at-a-time gather reads one float per line). Blocks of 8 rows x 8
/// tokens go through registers where the CPU has AVX.
fn transpose(by_row: &[f32], tokens: usize, n: usize, out: &mut [f32]) {
    const STRIP: usize = 16;
    out.par_chunks_mut(STRIP * n)
        .enumerate()
        .for_each(|(s, o)| {
            let t0 = s * STRIP;
            let here = o.len() / n;
            #[cfg(target_arch = "x86_64")]
            let done = if std::arch::is_x86_feature_detected!("avx") && here == STRIP {
                // SAFETY: the CPU has AVX (checked above).
                unsafe { transpose_blocks_avx(by_row, tokens, n, t0, o) }
            } else {
                0
            };
            #[cfg(not(target_arch = "x86_64"))]
            let done = 0;
            for r in done..n {
                let src = &by_row[r * tokens + t0..r * tokens + t0 + here];
                for (j, &v) in src.iter().enumerate() {
                    o[j * n + r] = v;
                }
            }
        });
}

/// [`transpose`]'s strip for rows `0 .. 8 * (n / 8)` in 8 x 8 blocks: eight loads of eight
/// tokens, shuffled, eight stores of eight rows. Returns the rows done. `o` holds the
/// strip's 16 tokens (`16 * n` values) from token `t0`.
///
/// # Safety
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_blocks_avx(
    by_row: &[f32],
    tokens: usize,
    n: usize,
    t0: usize,
    o: &mut [f32],
) -> usize {
    use std::arch::x86_64::*;
    let rows = n / 8 * 8;
    assert!(o.len() >= 16 * n && (rows == 0 || (rows - 1) * tokens + t0 + 16 <= by_row.len()));
    for r in (0..rows).step_by(8) {
        for j in (0..16).step_by(8) {
            // SAFETY: row r + k's tokens t0 + j .. + 8 lie in `by_row` (asserted above).
            let v: [__m256; 8] = std::array::from_fn(|k| unsafe {
                _mm256_loadu_ps(by_row.as_ptr().add((r + k) * tokens + t0 + j))
            });
            let t: [__m256; 8] = [
                _mm256_unpacklo_ps(v[0], v[1]),
                _mm256_unpackhi_ps(v[0], v[1]),
                _mm256_unpacklo_ps(v[2], v[3]),
                _mm256_unpackhi_ps(v[2], v[3]),
                _mm256_unpacklo_ps(v[4], v[5]),
                _mm256_unpackhi_ps(v[4], v[5]),
                _mm256_unpacklo_ps(v[6], v[7]),
                _mm256_unpackhi_ps(v[6], v[7]),
            ];
            let u: [__m256; 8] = [
                _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                _mm256_shuffle_ps::<0xee>(t[0], t[2]),
                _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                _mm256_shuffle_ps::<0xee>(t[1], t[3]),
                _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                _mm256_shuffle_ps::<0xee>(t[4], t[6]),
                _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                _mm256_shuffle_ps::<0xee>(t[5], t[7]),
            ];
            // Token j + c: its eight rows are column c of the block.
            let cols: [__m256; 8] = [
                _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
                _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
                _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
                _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
                _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
                _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
                _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
                _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
            ];
            for (c, col) in cols.iter().enumerate() {
                // SAFETY: token j + c's rows r .. r + 8 lie in `o` (16 n values, asserted).
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add((j + c) * n + r), *col) };
            }
        }
    }
    rows
}

fn check(op: &'static str, x: usize, out: usize, k: usize, n: usize) -> Result<()> {
    ensure(k > 0 && n > 0 && x.is_multiple_of(k), op, || {
        format!("x has {x} elements, not a multiple of in_features {k}")
    })?;
    ensure(out == x / k * n, op, || {
        format!("out has {out} elements, want {} tokens x {n}", x / k)
    })
}

pub(crate) fn matmul(
    x: &CpuBuffer,
    w: &CpuBuffer,
    shape: MatmulShape,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "matmul";
    let (k, n) = (shape.in_features, shape.out_features);
    let x = x.f32s(OP)?;
    let out = out.f32s_mut(OP)?;
    check(OP, x.len(), out.len(), k, n)?;
    ensure(w.len() == k * n, OP, || {
        format!("weight has {} elements, want {n} x {k}", w.len())
    })?;
    match w {
        CpuBuffer::F32(w) => run(&Dense::<f32> { w, cols: k }, x, k, n, out),
        CpuBuffer::BF16(w) => run(&Dense::<bf16> { w, cols: k }, x, k, n, out),
        CpuBuffer::F16(w) => run(&DenseF16 { w, cols: k }, x, k, n, out),
    }
    Ok(())
}

/// [`crate::Backend::matmul_parts`]: each part is [`matmul`] over its slice of the inputs
/// (the slices of x and W copied out), written to its place in `out [T, parts, n]`.
pub(crate) fn matmul_parts(
    x: &CpuBuffer,
    w: &CpuBuffer,
    shape: MatmulShape,
    parts: usize,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "matmul_parts";
    let (k, n) = (shape.in_features, shape.out_features);
    ensure(parts > 0 && k.is_multiple_of(parts), OP, || {
        format!("{k} inputs do not split into {parts} parts")
    })?;
    let xs = x.f32s(OP)?;
    let os = out.f32s_mut(OP)?;
    // A token's parts side by side: `[T, parts * n]`.
    check(OP, xs.len(), os.len(), k, parts * n)?;
    ensure(w.len() == k * n, OP, || {
        format!("weight has {} elements, want {n} x {k}", w.len())
    })?;
    let t = xs.len() / k;
    let kp = k / parts;
    let part_shape = MatmulShape {
        in_features: kp,
        out_features: n,
    };
    for p in 0..parts {
        let cols = p * kp..(p + 1) * kp;
        let xp = CpuBuffer::F32(columns(xs, k, cols.clone()));
        let wp = match w {
            CpuBuffer::F32(v) => CpuBuffer::F32(columns(v, k, cols)),
            CpuBuffer::BF16(v) => CpuBuffer::BF16(columns(v, k, cols)),
            CpuBuffer::F16(v) => CpuBuffer::F16(columns(v, k, cols)),
        };
        let mut y = CpuBuffer::F32(vec![0.0; t * n]);
        matmul(&xp, &wp, part_shape, &mut y)?;
        let y = y.f32s(OP)?;
        for (row, o) in y.chunks_exact(n).zip(os.chunks_exact_mut(parts * n)) {
            o[p * n..(p + 1) * n].copy_from_slice(row);
        }
    }
    Ok(())
}

/// Columns `cols` of every row of the row-major `v` (rows of `width`).
fn columns<T: Copy>(v: &[T], width: usize, cols: std::ops::Range<usize>) -> Vec<T> {
    v.chunks_exact(width)
        .flat_map(|row| row[cols.clone()].iter().copied())
        .collect()
}

pub(crate) fn matmul_quant(x: &CpuBuffer, w: &dyn RowDot, out: &mut CpuBuffer) -> Result<()> {
    const OP: &str = "matmul_quant";
    let (k, n) = (w.cols(), w.rows());
    let x = x.f32s(OP)?;
    let out = out.f32s_mut(OP)?;
    check(OP, x.len(), out.len(), k, n)?;
    with_prepared(|prepared| {
        if w.prepare(x, prepared) {
            run_prepared(w, prepared, x.len() / k, n, out);
        } else {
            run(&Quant(w), x, k, n, out);
        }
    });
    Ok(())
}

/// Runs `f` on this thread's prepared-input scratch, taken out while in use (so a nested
/// or concurrent call on the same thread simply starts a fresh one).
fn with_prepared<R>(f: impl FnOnce(&mut PreparedInput) -> R) -> R {
    thread_local!(static PREPARED: std::cell::RefCell<PreparedInput> =
        std::cell::RefCell::new(PreparedInput::default()));
    let mut prepared = PREPARED.with(|p| p.take());
    let r = f(&mut prepared);
    PREPARED.with(|p| *p.borrow_mut() = prepared);
    r
}

/// Whether an input prepared for the first of `ws` serves them all (see
/// [`RowDot::prepared_key`]).
fn share_prepared<'a>(mut ws: impl Iterator<Item = &'a dyn RowDot>) -> bool {
    let Some(first) = ws.next() else {
        return false;
    };
    let key = first.prepared_key();
    key.is_some() && ws.all(|w| w.prepared_key() == key && w.cols() == first.cols())
}

/// [`matmul_quant`] for matrices that all read `x`: the input prepared once, and for one
/// token every matrix's rows in one parallel pass (a decode step's q, k and v are small
/// products each, and a pass's hand-over to the threads costs about as much as one).
/// Each result has [`matmul_quant`]'s bits: the same kernels over the same prepared input.
pub(crate) fn matmul_quant_shared(
    x: &CpuBuffer,
    mats: &mut [(&(dyn RowDot + 'static), &mut CpuBuffer)],
) -> Result<()> {
    const OP: &str = "matmul_quant";
    if !share_prepared(mats.iter().map(|(w, _)| *w)) {
        for (w, out) in mats.iter_mut() {
            matmul_quant(x, *w, out)?;
        }
        return Ok(());
    }
    let x = x.f32s(OP)?;
    let k = mats[0].0.cols();
    let mut outs = Vec::with_capacity(mats.len());
    for (w, out) in mats.iter_mut() {
        let o = out.f32s_mut(OP)?;
        check(OP, x.len(), o.len(), k, w.rows())?;
        outs.push((*w, o));
    }
    let tokens = x.len() / k;
    with_prepared(|prepared| {
        if !outs[0].0.prepare(x, prepared) {
            for (w, o) in outs {
                run(&Quant(w), x, k, w.rows(), o);
            }
            return;
        }
        if tokens > 1 {
            for (w, o) in outs {
                run_prepared(w, prepared, tokens, w.rows(), o);
            }
            return;
        }
        let block = decode_rows_per_task(outs.iter().map(|(w, _)| w.rows()).sum());
        let tasks: Vec<(&dyn RowDot, usize, &mut [f32])> = outs
            .into_iter()
            .flat_map(|(w, o)| {
                o.chunks_mut(block)
                    .enumerate()
                    .map(move |(b, o)| (w, b * block, o))
            })
            .collect();
        let prepared = &*prepared;
        tasks.into_par_iter().for_each(|(w, r0, o)| {
            w.dot_prepared(r0..r0 + o.len(), prepared, 0..1, o, 1);
        });
    });
    Ok(())
}

/// `out = act(x * gate^T) * (x * up^T)` for quantized `gate` and `up` of one shape: for one
/// token a task takes a range of rows of both and writes its part of `out`, so neither
/// product reaches memory and the pair is one parallel pass; otherwise the two products and
/// the activation. The bits of [`matmul_quant`] twice and `act_mul` (elementwise, so any
/// split of the rows gives them).
pub(crate) fn gated_matmul_quant(
    act: Activation,
    x: &CpuBuffer,
    gate: &dyn RowDot,
    up: &dyn RowDot,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "gated_matmul_quant";
    let (k, n) = (gate.cols(), gate.rows());
    ensure(up.rows() == n && up.cols() == k, OP, || {
        format!(
            "gate is {n} x {k}, up {} x {}: they must match",
            up.rows(),
            up.cols()
        )
    })?;
    let xs = x.f32s(OP)?;
    check(OP, xs.len(), out.len(), k, n)?;
    let one_token = xs.len() == k;
    if !(one_token && share_prepared([gate, up].into_iter())) {
        let mut g = CpuBuffer::F32(vec![0.0; out.len()]);
        let mut u = CpuBuffer::F32(vec![0.0; out.len()]);
        matmul_quant(x, gate, &mut g)?;
        matmul_quant(x, up, &mut u)?;
        return elementwise::act_mul(act, &g, &u, out);
    }
    let out = out.f32s_mut(OP)?;
    with_prepared(|prepared| {
        if !gate.prepare(xs, prepared) {
            // Not reached for a format with a key; the plain products if it were.
            for (r, o) in out.iter_mut().enumerate() {
                let (g, u) = (gate.dot_row(r, xs), up.dot_row(r, xs));
                elementwise::gated(act, &[g], &[u], std::slice::from_mut(o));
            }
            return;
        }
        let prepared = &*prepared;
        let block = decode_rows_per_task(2 * n);
        out.par_chunks_mut(block).enumerate().for_each(|(b, o)| {
            let rows = b * block..b * block + o.len();
            with_scratch(2 * o.len(), |s| {
                let (g, u) = s.split_at_mut(o.len());
                gate.dot_prepared(rows.clone(), prepared, 0..1, g, 1);
                up.dot_prepared(rows, prepared, 0..1, u, 1);
                elementwise::gated(act, g, u, o);
            });
        });
    });
    Ok(())
}

/// Rows per task for one token: a few tasks per thread (memory-bound, so few large tasks,
/// but enough to even out a busy core), never tiny ones.
fn decode_rows_per_task(rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    rows.div_ceil(threads * 4).max(16)
}

/// Tokens per tile of the prepared (quantized-input) products: as many as keep the tile's
/// 8-bit activations (about `cols` bytes a token) within half of a 1 MiB L2, in whole
/// groups of eight. A kernel decodes each weight row once per tile, so longer tiles spread
/// that decoding over more tokens.
fn prepared_tile(cols: usize) -> usize {
    ((512 << 10) / cols.max(1)).clamp(OUTER_TOKENS, 512) / 8 * 8
}

fn run_prepared(w: &dyn RowDot, p: &PreparedInput, tokens: usize, n: usize, out: &mut [f32]) {
    if tokens == 1 {
        let block = decode_rows_per_task(n);
        out.par_chunks_mut(block).enumerate().for_each(|(b, o)| {
            let r0 = b * block;
            w.dot_prepared(r0..r0 + o.len(), p, 0..1, o, 1);
        });
        return;
    }
    let tile = prepared_tile(w.cols());
    by_row_blocks(tokens, n, rows_per_task(n), out, |r0, o| {
        let rows_here = o.len() / tokens;
        for t0 in (0..tokens).step_by(tile) {
            let t1 = (t0 + tile).min(tokens);
            w.dot_prepared(r0..r0 + rows_here, p, t0..t1, &mut o[t0..], tokens);
        }
    });
}

#[cfg(test)]
mod tests {
    /// The blocked transpose equals the definition for sizes with and without whole 8 x 8
    /// blocks and a last short strip.
    #[test]
    fn transpose_moves_every_value() {
        for (tokens, n) in [(16, 8), (37, 24), (5, 3), (33, 70), (64, 1)] {
            let by_row: Vec<f32> = (0..tokens * n).map(|i| i as f32).collect();
            let mut out = vec![f32::NAN; tokens * n];
            super::transpose(&by_row, tokens, n, &mut out);
            for t in 0..tokens {
                for r in 0..n {
                    assert_eq!(out[t * n + r], by_row[r * tokens + t], "{tokens} x {n}");
                }
            }
        }
    }
}
