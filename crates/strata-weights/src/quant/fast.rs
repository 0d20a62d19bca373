//! Matrix-vector products of quantized weight rows with activations quantized once per
//! matmul: the CPU decode and prefill hot path.
//!
//! [`Q8Input`] holds one or more activation vectors quantized to the 8-bit block format the
//! weight type pairs with ([`BlockQ8_0`] for the 32-value formats, [`BlockQ8K`] for the
//! K-quants), plus per-block scales and code sums in f32 so the row kernels do no f16
//! conversion or code summing of their own. [`dot_rows_q8`] then dots a range of weight rows
//! with a range of those vectors.
//!
//! On x86-64 with AVX2 + FMA + F16C (detected at run time) and on aarch64 (NEON, with the
//! dot-product extension where the CPU has it) Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q6_K use
//! hand-written integer kernels; every other format, and every x86 CPU without those
//! features, uses the portable [`QuantBlock::dot_q8`]. The integer parts of both are
//! identical; only the order of the f32 operations that combine block results differs.
//!
//! Numerics: quantizing activations to 8 bits changes a dot product by at most
//! `sum_blocks (d_a / 2) * sum |w_i|` (`d_a = max|x| / 127` of the activation block) plus
//! f32 rounding; `tests.rs` checks that bound against the f32 dot.

use std::ops::Range;

use super::{
    as_blocks, ActivationBlock, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K,
    BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, QuantBlock,
};
use strata_gguf::GgmlType;

/// The activation block family of a weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Q8_0,
    Q8K,
}

fn kind_of(ty: GgmlType) -> Option<Kind> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            Some(Kind::Q8_0)
        }
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            Some(Kind::Q8K)
        }
        _ => None,
    }
}

/// The family of activation blocks [`Q8Input::quantize`] makes for weights of type `ty`:
/// an input quantized for one type serves every type of its family (of the same row
/// length). `None` where [`dot_rows_q8`] does not handle `ty`.
pub fn q8_family(ty: GgmlType) -> Option<u8> {
    kind_of(ty).map(|k| k as u8)
}

/// Whether [`dot_rows_q8`] handles weights of type `ty`.
pub fn has_q8_path(ty: GgmlType) -> bool {
    kind_of(ty).is_some()
}

/// Activation vectors quantized for the integer dot of one weight type. Reusable: quantizing
/// again overwrites the contents and keeps the allocations.
#[derive(Clone, Debug, Default)]
pub struct Q8Input {
    kind: Option<Kind>,
    tokens: usize,
    /// Activation blocks per token.
    blocks: usize,
    q8_0: Vec<BlockQ8_0>,
    q8k: Vec<BlockQ8K>,
    /// Per Q8_0 block: its scale as f32.
    d: Vec<f32>,
    /// Per Q8_0 block: scale times the sum of its codes (for formats with an offset or min).
    dsum: Vec<f32>,
    /// The Q8_0 blocks again, eight tokens interleaved (see [`Acts8`]): what the x86
    /// kernels read for spans of two or more tokens, so not built for an input of one.
    #[cfg(target_arch = "x86_64")]
    groups: Vec<Acts8>,
    /// The Q8_K blocks again, eight tokens interleaved (see [`Acts8K`]); as `groups`, not
    /// built for one token.
    #[cfg(target_arch = "x86_64")]
    groups_k: Vec<Acts8K>,
    /// Each token's Q8_0 scales and code sums again, a pair of blocks at a time, laid out
    /// for the one-token kernels' f32 steps (see [`PairActs`]).
    #[cfg(target_arch = "x86_64")]
    pairs: Vec<PairActs>,
}

/// Blocks `2 j` and `2 j + 1` of one token's Q8_0 activations, scales and code sums
/// spread the way a one-token pass of two rows uses them (its lanes: row 0 and row 1 of
/// block `2 j`, then of block `2 j + 1`), so that the pass loads them instead of
/// shuffling them into place each step.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub(super) struct PairActs {
    /// `[a0, 1, a0, 1, a1, 1, a1, 1]`: the scales `a0`, `a1` beside ones, to multiply
    /// lanes of (weight scale, weight correction) pairs.
    pub(super) d_one: [f32; 8],
    /// `[a0, a0, a1, a1]`.
    pub(super) d: [f32; 4],
    /// `[s0, s0, s1, s1]`: scale times code sum of each block.
    pub(super) dsum: [f32; 4],
}

/// Tokens in an activation group ([`Acts8`]).
#[cfg(target_arch = "x86_64")]
pub(super) const GROUP: usize = 8;

/// The Q8_0 activation blocks of eight consecutive tokens (`8 g .. 8 g + 8`) at one block
/// index, interleaved four codes at a time: `qs[m]` holds codes `4 m .. 4 m + 4` of each
/// token, token `t` at bytes `4 t ..`, so one 32-bit lane is one token and a broadcast
/// weight run of four codes dots all eight at once. A last group with fewer tokens is
/// padded with zeros.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub(super) struct Acts8 {
    /// Codes `4 m .. 4 m + 4` of each token, at `qs[m][4 t ..]`.
    pub(super) qs: [[i8; 32]; 8],
    /// Each token's block scale.
    pub(super) d: [f32; GROUP],
    /// Each token's scale times its code sum.
    pub(super) dsum: [f32; GROUP],
}

/// The Q8_K activation blocks of eight consecutive tokens at one super-block index,
/// interleaved as in [`Acts8`], with each token's group sums laid out for `madd`: lane `t`
/// of `bsum32[p]` holds token `t`'s sums of 32-code groups `2 p` and `2 p + 1` (two i16),
/// lane `t` of `bsum16[p]` its sums of 16-code groups `2 p` and `2 p + 1`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub(super) struct Acts8K {
    /// Codes `4 m .. 4 m + 4` of each token, at `qs[m][4 t ..]`.
    pub(super) qs: [[i8; 32]; 64],
    /// Each token's block scale.
    pub(super) d: [f32; GROUP],
    /// Sums of 32-code groups, two a lane.
    pub(super) bsum32: [[i16; 16]; 4],
    /// Sums of 16-code groups, two a lane.
    pub(super) bsum16: [[i16; 16]; 8],
}

#[cfg(target_arch = "x86_64")]
impl Default for Acts8K {
    fn default() -> Self {
        Self {
            qs: [[0; 32]; 64],
            d: [0.0; GROUP],
            bsum32: [[0; 16]; 4],
            bsum16: [[0; 16]; 8],
        }
    }
}

impl Q8Input {
    /// An empty buffer; [`Q8Input::quantize`] fills it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of quantized vectors.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Quantizes the `xs.len() / cols` vectors of `cols` values in `xs` for weights of type
    /// `ty`. Returns `false` (and leaves nothing usable) when `ty` has no integer path or
    /// `cols` is not a whole number of activation blocks.
    pub fn quantize(&mut self, ty: GgmlType, xs: &[f32], cols: usize) -> bool {
        self.kind = None;
        let Some(kind) = kind_of(ty) else {
            return false;
        };
        let elems = match kind {
            Kind::Q8_0 => <BlockQ8_0 as ActivationBlock>::ELEMS,
            Kind::Q8K => <BlockQ8K as ActivationBlock>::ELEMS,
        };
        if cols == 0 || !cols.is_multiple_of(elems) || !xs.len().is_multiple_of(cols) {
            return false;
        }
        let n = xs.len() / elems;
        let simd = simd_quantize();
        self.tokens = xs.len() / cols;
        self.blocks = cols / elems;
        match kind {
            Kind::Q8_0 => {
                self.q8_0.clear();
                self.d.clear();
                self.dsum.clear();
                self.q8_0.reserve(n);
                self.d.reserve(n);
                self.dsum.reserve(n);
                self.quantize_q8_0_blocks(xs, simd);
                #[cfg(target_arch = "x86_64")]
                {
                    // Eight-token groups serve spans of two or more tokens only.
                    if self.tokens > 1 {
                        self.group_q8_0();
                    }
                    self.pair_q8_0();
                }
            }
            Kind::Q8K => {
                self.q8k.clear();
                self.q8k.reserve(n);
                self.q8k
                    .extend(xs.chunks_exact(elems).map(|x| quantize_q8k(x, simd)));
                #[cfg(target_arch = "x86_64")]
                if self.tokens > 1 {
                    self.group_q8k();
                }
            }
        }
        self.kind = Some(kind);
        true
    }

    /// Appends `xs`'s Q8_0 blocks, their scales as f32 and each scale times its code sum:
    /// in one vectorized pass on x86 when `simd` says the CPU can, block by block otherwise.
    fn quantize_q8_0_blocks(&mut self, xs: &[f32], simd: bool) {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is `x86::available()`.
            unsafe {
                super::x86_acts::quantize_q8_0_blocks(
                    xs,
                    &mut self.q8_0,
                    &mut self.d,
                    &mut self.dsum,
                )
            };
            return;
        }
        for x in xs.chunks_exact(<BlockQ8_0 as ActivationBlock>::ELEMS) {
            let b = quantize_q8_0(x, simd);
            let d = b.d.to_f32();
            self.d.push(d);
            self.dsum.push(d * b.code_sum() as f32);
            self.q8_0.push(b);
        }
    }

    fn token_range(&self, t: usize) -> Range<usize> {
        t * self.blocks..(t + 1) * self.blocks
    }

    /// Fills `groups_k` from the per-token Q8_K blocks.
    #[cfg(target_arch = "x86_64")]
    fn group_q8k(&mut self) {
        let n = self.tokens.div_ceil(GROUP) * self.blocks;
        self.groups_k.clear();
        self.groups_k.resize(n, Acts8K::default());
        for t in 0..self.tokens {
            let (g, lane) = (t / GROUP, t % GROUP);
            for i in 0..self.blocks {
                let src = &self.q8k[t * self.blocks + i];
                let dst = &mut self.groups_k[g * self.blocks + i];
                interleave(&src.qs, &mut dst.qs, lane);
                dst.d[lane] = src.d;
                for p in 0..4 {
                    for h in 0..2 {
                        let j = 2 * p + h;
                        dst.bsum32[p][2 * lane + h] = src.bsums[2 * j] + src.bsums[2 * j + 1];
                    }
                }
                for p in 0..8 {
                    for h in 0..2 {
                        dst.bsum16[p][2 * lane + h] = src.bsums[2 * p + h];
                    }
                }
            }
        }
    }

    /// Fills `groups` from the per-token Q8_0 blocks.
    #[cfg(target_arch = "x86_64")]
    fn group_q8_0(&mut self) {
        let n = self.tokens.div_ceil(GROUP) * self.blocks;
        self.groups.clear();
        self.groups.resize(n, Acts8::default());
        for t in 0..self.tokens {
            let (g, lane) = (t / GROUP, t % GROUP);
            for i in 0..self.blocks {
                let (src, dst) = (t * self.blocks + i, &mut self.groups[g * self.blocks + i]);
                interleave(&self.q8_0[src].qs, &mut dst.qs, lane);
                dst.d[lane] = self.d[src];
                dst.dsum[lane] = self.dsum[src];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Q8Input {
    /// Fills `pairs` from the per-token Q8_0 scales and code sums.
    fn pair_q8_0(&mut self) {
        self.pairs.clear();
        let per_token = self.blocks / 2;
        self.pairs.reserve(self.tokens * per_token);
        for t in 0..self.tokens {
            for j in 0..per_token {
                let i = t * self.blocks + 2 * j;
                let (a0, a1) = (self.d[i], self.d[i + 1]);
                let (s0, s1) = (self.dsum[i], self.dsum[i + 1]);
                self.pairs.push(PairActs {
                    d_one: [a0, 1.0, a0, 1.0, a1, 1.0, a1, 1.0],
                    d: [a0, a0, a1, a1],
                    dsum: [s0, s0, s1, s1],
                });
            }
        }
    }

    /// Token `t`'s [`PairActs`]: one for each two of its blocks.
    pub(super) fn q8_0_pairs(&self, t: usize) -> &[PairActs] {
        let per_token = self.blocks / 2;
        &self.pairs[t * per_token..(t + 1) * per_token]
    }
}

/// A token's codes into lane `lane` of an interleaved group: codes `4 m .. 4 m + 4` to
/// `runs[m][4 lane ..]`.
#[cfg(target_arch = "x86_64")]
fn interleave(codes: &[i8], runs: &mut [[i8; 32]], lane: usize) {
    for (run, four) in runs.iter_mut().zip(codes.chunks_exact(4)) {
        run[4 * lane..4 * lane + 4].copy_from_slice(four);
    }
}

/// [`BlockQ8_0::quantize`], vectorized when `simd` says the CPU can (NEON; the same bits;
/// x86 quantizes a whole input in one pass, [`Q8Input::quantize_q8_0_blocks`]).
#[cfg_attr(not(target_arch = "aarch64"), allow(unused_variables))]
fn quantize_q8_0(x: &[f32], simd: bool) -> BlockQ8_0 {
    #[cfg(target_arch = "aarch64")]
    if simd {
        let mut qs = [0i8; 32];
        let d = super::neon_acts::quantize(x, &mut qs);
        return BlockQ8_0 {
            d: super::F16Le::from_f32(d),
            qs,
        };
    }
    BlockQ8_0::quantize(x)
}

/// [`BlockQ8K`]'s quantization, vectorized when `simd` says the CPU can (AVX2, NEON; the
/// same bits).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_variables)
)]
fn quantize_q8k(x: &[f32], simd: bool) -> BlockQ8K {
    #[cfg(target_arch = "x86_64")]
    if simd {
        let mut qs = [0i8; 256];
        // SAFETY: `simd` is `x86::available()`.
        let d = unsafe { super::x86_acts::quantize(x, &mut qs) };
        return BlockQ8K::from_codes(d, qs);
    }
    #[cfg(target_arch = "aarch64")]
    if simd {
        let mut qs = [0i8; 256];
        let d = super::neon_acts::quantize(x, &mut qs);
        return BlockQ8K::from_codes(d, qs);
    }
    <BlockQ8K as ActivationBlock>::quantize(x)
}

/// Whether the vectorized activation quantization can run (checked once per matmul input).
fn simd_quantize() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::x86::available();
    // NEON is part of every aarch64 target.
    #[cfg(target_arch = "aarch64")]
    return true;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    false
}

/// The hand-written kernels of this architecture (`dot_rows_with` returns `false`, having
/// written nothing, for a format or CPU they do not cover).
#[cfg(target_arch = "aarch64")]
use super::neon as simd;
#[cfg(target_arch = "x86_64")]
use super::x86 as simd;

/// Which activation blocks a weight block type reads from a [`Q8Input`].
trait PickActs: ActivationBlock {
    fn pick(input: &Q8Input) -> &[Self];
}

impl PickActs for BlockQ8_0 {
    fn pick(input: &Q8Input) -> &[Self] {
        &input.q8_0
    }
}

impl PickActs for BlockQ8K {
    fn pick(input: &Q8Input) -> &[Self] {
        &input.q8k
    }
}

/// Per-row kernel: `W[row] . x[token]` for one row's blocks and one token's activations.
type RowKernel<B> = fn(&[B], &Q8Input, Range<usize>) -> f32;

fn portable_for<B>(w: &[B], input: &Q8Input, acts: Range<usize>) -> f32
where
    B: QuantBlock,
    B::Activation: PickActs,
{
    let a = &<B::Activation as PickActs>::pick(input)[acts];
    w.iter().zip(a).map(|(w, a)| w.dot_q8(a)).sum()
}

#[allow(clippy::too_many_arguments)]
fn rows_with<B>(
    kernel: RowKernel<B>,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    input: &Q8Input,
    tokens: Range<usize>,
    out: &mut [f32],
    stride: usize,
) where
    B: QuantBlock,
{
    let nt = tokens.len();
    for (i, r) in rows.enumerate() {
        let Ok(blocks) = as_blocks::<B>(&w[r * row_bytes..(r + 1) * row_bytes]) else {
            out[i * stride..i * stride + nt].fill(f32::NAN);
            continue;
        };
        for (j, t) in tokens.clone().enumerate() {
            out[i * stride + j] = kernel(blocks, input, input.token_range(t));
        }
    }
}

/// Row `r`'s blocks of a matrix of `row_bytes`-long rows in `bytes`, when they are whole
/// blocks of `B` and `per_row` of them; `None` otherwise (the kernels write NaN for it).
pub(super) fn row_blocks<B: QuantBlock>(
    bytes: &[u8],
    row_bytes: usize,
    r: usize,
    per_row: usize,
) -> Option<&[B]> {
    as_blocks::<B>(&bytes[r * row_bytes..(r + 1) * row_bytes])
        .ok()
        .filter(|w| w.len() == per_row)
}

/// `out[i * stride + j] = W[rows.start + i] . x[tokens.start + j]` where `w` holds the whole
/// matrix (`row_bytes` per row) of type `ty` and `input` was quantized for `ty`.
///
/// Rows whose bytes are malformed give NaN. Panics if `input` was quantized for another
/// activation family, or if a range is out of bounds.
#[allow(clippy::too_many_arguments)]
pub fn dot_rows_q8(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    input: &Q8Input,
    tokens: Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    assert_eq!(
        kind_of(ty),
        input.kind,
        "activations were quantized for another weight type"
    );
    assert!(tokens.end <= input.tokens, "token range out of bounds");
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if simd::dot_rows_with(
        simd::best_dot(),
        ty,
        w,
        row_bytes,
        rows.clone(),
        input,
        tokens.clone(),
        out,
        stride,
    ) {
        return;
    }
    dot_rows_q8_portable(ty, w, row_bytes, rows, input, tokens, out, stride);
}

/// The portable kernel for `ty` over whole rows, for tests: same contract as
/// [`dot_rows_q8`] but never SIMD.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn dot_rows_q8_portable(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    input: &Q8Input,
    tokens: Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    assert_eq!(kind_of(ty), input.kind);
    macro_rules! go {
        ($B:ty) => {
            rows_with(
                portable_for::<$B>,
                w,
                row_bytes,
                rows,
                input,
                tokens,
                out,
                stride,
            )
        };
    }
    match ty {
        GgmlType::Q8_0 => go!(BlockQ8_0),
        GgmlType::Q4_0 => go!(BlockQ4_0),
        GgmlType::Q4_1 => go!(BlockQ4_1),
        GgmlType::Q5_0 => go!(BlockQ5_0),
        GgmlType::Q5_1 => go!(BlockQ5_1),
        GgmlType::Q2_K => go!(BlockQ2K),
        GgmlType::Q3_K => go!(BlockQ3K),
        GgmlType::Q4_K => go!(BlockQ4K),
        GgmlType::Q5_K => go!(BlockQ5K),
        GgmlType::Q6_K => go!(BlockQ6K),
        _ => unreachable!("kind_of checked the type"),
    }
}

/// Accessors the SIMD kernels need.
impl Q8Input {
    /// The grouped Q8_0 blocks of the group that starts at token `g0`.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn group_of(&self, g0: usize) -> &[Acts8] {
        let g = g0 / GROUP;
        &self.groups[g * self.blocks..(g + 1) * self.blocks]
    }

    /// The grouped Q8_K blocks of the group that starts at token `g0`.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn group_k_of(&self, g0: usize) -> &[Acts8K] {
        let g = g0 / GROUP;
        &self.groups_k[g * self.blocks..(g + 1) * self.blocks]
    }

    /// Activation blocks per token.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn blocks_per_token(&self) -> usize {
        self.blocks
    }

    /// Token `t`'s Q8_0 blocks, their scales, and their scales times code sums.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub(super) fn q8_0_token(&self, t: usize) -> (&[BlockQ8_0], &[f32], &[f32]) {
        let r = self.token_range(t);
        (&self.q8_0[r.clone()], &self.d[r.clone()], &self.dsum[r])
    }

    /// Token `t`'s Q8_K blocks.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub(super) fn q8k_token(&self, t: usize) -> &[BlockQ8K] {
        &self.q8k[self.token_range(t)]
    }
}
