//! NEON integer dot products (aarch64) of weight blocks with 8-bit activation blocks.
//!
//! Weight codes are made signed (`q - 8`, `q - 16`, `q - 32`) so that no offset correction
//! is needed, then dotted with the activation codes 16 bytes at a time into four i32 lanes:
//! with the dot-product extension (`sdot`, `vdotq_s32`: Armv8.2 and later, detected at run
//! time) one instruction per 16 bytes, otherwise `smull` + `sadalp` (baseline NEON). Every
//! product fits i16 (`|w| <= 128`, `|a| <= 127`), so both give exact integer sums. A block's
//! lanes are added to one i32 before any f32 step, so the two forms give the same bits.
//!
//! The f32 steps: per (row, token) one accumulator, `acc = fma(isum, d_w * d_a, acc)` over
//! the blocks in order, then (Q4_1) plus the minimum's correction summed beside it. Every
//! (row, token) pair gets the same operations whatever tile it runs in, so a token's result
//! has the same bits alone or in a batch (`row_kernels_are_batch_invariant`). The integer
//! sums equal the portable [`super::QuantBlock::dot_q8`]'s; only f32 rounding differs.

use std::arch::aarch64::*;
use std::ops::Range;

use super::fast::{row_blocks, Q8Input};
use super::k_common::unpack_scales_mins;
use super::{BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0};
use strata_gguf::GgmlType;

/// How 16 byte products are summed into four i32 lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dot {
    /// `smull` + `sadalp`: baseline NEON.
    Neon,
    /// `sdot` (the dot-product extension).
    DotProd,
}

impl Dot {
    /// Whether this CPU runs it.
    pub(super) fn runs_here(self) -> bool {
        match self {
            Dot::Neon => true,
            Dot::DotProd => std::arch::is_aarch64_feature_detected!("dotprod"),
        }
    }
}

/// The dot the kernels take: `sdot` where the CPU has it and `STRATA_CPU_DOTPROD` is not
/// `0` (read once; it compares the two in one build).
pub(super) fn best_dot() -> Dot {
    static DOT: std::sync::OnceLock<Dot> = std::sync::OnceLock::new();
    *DOT.get_or_init(|| {
        let off = std::env::var("STRATA_CPU_DOTPROD").is_ok_and(|v| v == "0");
        if !off && Dot::DotProd.runs_here() {
            Dot::DotProd
        } else {
            Dot::Neon
        }
    })
}

/// `acc` plus the sums of four adjacent products of `a` and `b` in each lane (baseline NEON).
#[target_feature(enable = "neon")]
#[inline]
fn dot16_neon(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// [`dot16_neon`] as one `sdot`: other products in each lane, the same total. Written as
/// assembly since the intrinsic (`vdotq_s32`) is not yet in stable Rust.
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn dot16_dotprod(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `sdot` reads and writes registers only; the caller's target features include
    // the dot-product extension.
    unsafe {
        std::arch::asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// 16 bytes from `p`.
///
/// # Safety
/// `p` must be valid for reading 16 bytes.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn load16(p: *const u8) -> int8x16_t {
    // SAFETY: the caller guarantees 16 readable bytes; unaligned loads are allowed.
    unsafe { vreinterpretq_s8_u8(vld1q_u8(p)) }
}

/// The 32 codes of a 16-byte nibble field (low nibbles are elements 0..16, high nibbles
/// 16..32: Q4_0 / Q4_1 / Q5_0's order), unsigned.
#[target_feature(enable = "neon")]
#[inline]
fn nibbles16(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: `qs` is 16 bytes.
    let b = unsafe { vld1q_u8(qs.as_ptr()) };
    (vandq_u8(b, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(b))
}

/// Q4_0's signed codes `q - 8`.
#[target_feature(enable = "neon")]
#[inline]
fn codes_q4_0(b: &BlockQ4_0) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles16(&b.qs);
    let off = vdupq_n_s8(8);
    (
        vsubq_s8(vreinterpretq_s8_u8(lo), off),
        vsubq_s8(vreinterpretq_s8_u8(hi), off),
    )
}

/// Q4_1's unsigned codes (its minimum is the correction).
#[target_feature(enable = "neon")]
#[inline]
fn codes_q4_1(b: &BlockQ4_1) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles16(&b.qs);
    (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
}

/// Q5_0's signed codes: the nibbles plus 16 where bit `i` of `qh` is set, minus 16.
#[target_feature(enable = "neon")]
#[inline]
fn codes_q5_0(b: &BlockQ5_0) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles16(&b.qs);
    let bits = u32::from_le_bytes(b.qh);
    // Byte i of a half takes byte i / 8 of its 16 bits, then tests bit i % 8.
    let mask = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let spread = |h: u32| {
        let (b0, b1) = ((h & 0xff) as u8, (h >> 8) as u8);
        let v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
        // 0x10 where the bit is set.
        vandq_u8(vtstq_u8(v, mask), vdupq_n_u8(0x10))
    };
    let off = vdupq_n_s8(16);
    (
        vsubq_s8(
            vreinterpretq_s8_u8(vorrq_u8(lo, spread(bits & 0xffff))),
            off,
        ),
        vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, spread(bits >> 16))), off),
    )
}

/// Q8_0's codes.
#[target_feature(enable = "neon")]
#[inline]
fn codes_q8_0(b: &BlockQ8_0) -> (int8x16_t, int8x16_t) {
    let p = b.qs.as_ptr() as *const u8;
    // SAFETY: `qs` is 32 bytes.
    unsafe { (load16(p), load16(p.add(16))) }
}

/// A token's Q8_0 activation blocks, their scales, and their scales times code sums.
type Acts<'a> = (&'a [BlockQ8_0], &'a [f32], &'a [f32]);

/// Generates `$name`: `R` rows of a 32-value format against `N` tokens, a register tile of
/// `R x N` accumulators. `codes` gives a block's 32 codes (signed); `scale` its `d`; with
/// `CORR`, `corr` the factor of the activation block's `d * code_sum` (Q4_1's minimum). Each
/// weight block is decoded once for the `N` tokens and each activation block loaded once
/// for the `R` rows.
macro_rules! small_fn {
    ($name:ident, $feat:literal, $dot:ident) => {
        #[target_feature(enable = $feat)]
        #[inline]
        fn $name<B, const R: usize, const N: usize, const CORR: bool>(
            w: [&[B]; R],
            acts: [Acts<'_>; N],
            codes: impl Fn(&B) -> (int8x16_t, int8x16_t),
            scale: impl Fn(&B) -> f32,
            corr: impl Fn(&B) -> f32,
        ) -> [[f32; N]; R] {
            let blocks = acts[0].0.len();
            assert!(w.iter().all(|w| w.len() == blocks));
            assert!(acts
                .iter()
                .all(|a| a.0.len() == blocks && a.1.len() == blocks));
            let mut acc = [[0f32; N]; R];
            let mut c = [[0f32; N]; R];
            for i in 0..blocks {
                let mut q = [(vdupq_n_s8(0), vdupq_n_s8(0)); R];
                let mut s = [0f32; R];
                let mut m = [0f32; R];
                for r in 0..R {
                    // SAFETY: every row has `blocks` blocks (asserted above).
                    let b = unsafe { w[r].get_unchecked(i) };
                    q[r] = codes(b);
                    s[r] = scale(b);
                    if CORR {
                        m[r] = corr(b);
                    }
                }
                for k in 0..N {
                    // SAFETY: every token has `blocks` blocks and scales (asserted above).
                    let (a, ad, asum) = unsafe {
                        (
                            acts[k].0.get_unchecked(i),
                            *acts[k].1.get_unchecked(i),
                            if CORR {
                                *acts[k].2.get_unchecked(i)
                            } else {
                                0.0
                            },
                        )
                    };
                    let p = a.qs.as_ptr() as *const u8;
                    // SAFETY: `qs` is 32 bytes.
                    let (a0, a1) = unsafe { (load16(p), load16(p.add(16))) };
                    for r in 0..R {
                        let v = $dot($dot(vdupq_n_s32(0), q[r].0, a0), q[r].1, a1);
                        let isum = vaddvq_s32(v) as f32;
                        acc[r][k] = isum.mul_add(s[r] * ad, acc[r][k]);
                        if CORR {
                            c[r][k] += m[r] * asum;
                        }
                    }
                }
            }
            std::array::from_fn(|r| std::array::from_fn(|k| acc[r][k] + c[r][k]))
        }
    };
}

small_fn!(small_neon, "neon", dot16_neon);
small_fn!(small_dotprod, "neon,dotprod", dot16_dotprod);

/// Generates the 32-value formats' kernels over `$small`: `R` rows against `N` tokens.
macro_rules! small_formats {
    ($feat:literal, $small:ident, $q8_0:ident, $q4_0:ident, $q4_1:ident, $q5_0:ident) => {
        #[target_feature(enable = $feat)]
        #[inline]
        fn $q8_0<const R: usize, const N: usize>(
            w: [&[BlockQ8_0]; R],
            acts: [Acts<'_>; N],
        ) -> [[f32; N]; R] {
            $small::<_, R, N, false>(w, acts, |b| codes_q8_0(b), |b| b.d.to_f32(), |_| 0.0)
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn $q4_0<const R: usize, const N: usize>(
            w: [&[BlockQ4_0]; R],
            acts: [Acts<'_>; N],
        ) -> [[f32; N]; R] {
            $small::<_, R, N, false>(w, acts, |b| codes_q4_0(b), |b| b.d.to_f32(), |_| 0.0)
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn $q4_1<const R: usize, const N: usize>(
            w: [&[BlockQ4_1]; R],
            acts: [Acts<'_>; N],
        ) -> [[f32; N]; R] {
            $small::<_, R, N, true>(
                w,
                acts,
                |b| codes_q4_1(b),
                |b| b.d.to_f32(),
                |b| b.m.to_f32(),
            )
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn $q5_0<const R: usize, const N: usize>(
            w: [&[BlockQ5_0]; R],
            acts: [Acts<'_>; N],
        ) -> [[f32; N]; R] {
            $small::<_, R, N, false>(w, acts, |b| codes_q5_0(b), |b| b.d.to_f32(), |_| 0.0)
        }
    };
}

small_formats!("neon", small_neon, q8_0_neon, q4_0_neon, q4_1_neon, q5_0_neon);
small_formats!(
    "neon,dotprod",
    small_dotprod,
    q8_0_dotprod,
    q4_0_dotprod,
    q4_1_dotprod,
    q5_0_dotprod
);

/// Generates the K formats' kernels (one row against `N` tokens) over `$dot`.
macro_rules! k_formats {
    ($feat:literal, $dot:ident, $q4_k:ident, $q6_k:ident) => {
        #[target_feature(enable = $feat)]
        #[inline]
        fn $q4_k<const N: usize>(w: &[BlockQ4K], acts: [&[BlockQ8K]; N]) -> [f32; N] {
            assert!(acts.iter().all(|a| a.len() == w.len()));
            let mut acc = [0f32; N];
            let mut corr = [0f32; N];
            for (bi, b) in w.iter().enumerate() {
                let (sc, mn) = unpack_scales_mins(&b.scales);
                let mut isum = [0i32; N];
                for c in 0..4 {
                    let p = b.qs[32 * c..].as_ptr();
                    // SAFETY: `qs` has 128 bytes; 32 c + 32 <= 128.
                    let (q0, q1) = unsafe { (vld1q_u8(p), vld1q_u8(p.add(16))) };
                    let m4 = vdupq_n_u8(0x0f);
                    let lo = [vandq_u8(q0, m4), vandq_u8(q1, m4)].map(|v| vreinterpretq_s8_u8(v));
                    let hi =
                        [vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1)].map(|v| vreinterpretq_s8_u8(v));
                    for k in 0..N {
                        // SAFETY: each token has `w.len()` blocks (asserted above).
                        let a = unsafe { acts[k].get_unchecked(bi) }.qs.as_ptr() as *const u8;
                        // SAFETY: an activation block has 256 codes; 64 c + 64 <= 256.
                        let av = unsafe { [0, 16, 32, 48].map(|o| load16(a.add(64 * c + o))) };
                        let z = vdupq_n_s32(0);
                        let vlo = vaddvq_s32($dot($dot(z, lo[0], av[0]), lo[1], av[1]));
                        let vhi = vaddvq_s32($dot($dot(z, hi[0], av[2]), hi[1], av[3]));
                        isum[k] += i32::from(sc[2 * c]) * vlo + i32::from(sc[2 * c + 1]) * vhi;
                    }
                }
                let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
                for k in 0..N {
                    // SAFETY: as above.
                    let a = unsafe { acts[k].get_unchecked(bi) };
                    let msum: i32 = mn
                        .iter()
                        .zip(a.bsums.chunks_exact(2))
                        .map(|(&m, s)| i32::from(m) * (i32::from(s[0]) + i32::from(s[1])))
                        .sum();
                    acc[k] = (isum[k] as f32).mul_add(d * a.d, acc[k]);
                    corr[k] += dmin * a.d * msum as f32;
                }
            }
            std::array::from_fn(|k| acc[k] - corr[k])
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn $q6_k<const N: usize>(w: &[BlockQ6K], acts: [&[BlockQ8K]; N]) -> [f32; N] {
            assert!(acts.iter().all(|a| a.len() == w.len()));
            let m4 = vdupq_n_u8(0x0f);
            let m3 = vdupq_n_u8(0x03);
            let off = vdupq_n_s8(32);
            let mut acc = [0f32; N];
            for (bi, b) in w.iter().enumerate() {
                let mut isum = [0i32; N];
                for h in 0..2 {
                    for half in 0..2 {
                        // Elements 128 h + 32 k + 16 half .. + 16 for k in 0..4: the low
                        // nibbles from ql[64 h + 16 half ..] (k even: low, odd: high nibble
                        // of the second 32), the high bits from qh[32 h + 16 half ..].
                        let o = 16 * half;
                        // SAFETY: `ql` has 128 bytes and `qh` 64: offsets stay inside.
                        let (ql0, ql1, qh) = unsafe {
                            (
                                vld1q_u8(b.ql.as_ptr().add(64 * h + o)),
                                vld1q_u8(b.ql.as_ptr().add(64 * h + 32 + o)),
                                vld1q_u8(b.qh.as_ptr().add(32 * h + o)),
                            )
                        };
                        let u = [
                            vorrq_u8(vandq_u8(ql0, m4), vshlq_n_u8::<4>(vandq_u8(qh, m3))),
                            vorrq_u8(
                                vandq_u8(ql1, m4),
                                vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m3)),
                            ),
                            vorrq_u8(
                                vshrq_n_u8::<4>(ql0),
                                vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m3)),
                            ),
                            vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
                        ]
                        .map(|u| vsubq_s8(vreinterpretq_s8_u8(u), off));
                        for t in 0..N {
                            // SAFETY: each token has `w.len()` blocks (asserted above).
                            let a = unsafe { acts[t].get_unchecked(bi) }.qs.as_ptr() as *const u8;
                            for (k, &u) in u.iter().enumerate() {
                                let e = 128 * h + 32 * k + o;
                                // SAFETY: an activation block has 256 codes; e + 16 <= 256.
                                let av = unsafe { load16(a.add(e)) };
                                let v = vaddvq_s32($dot(vdupq_n_s32(0), u, av));
                                isum[t] += i32::from(b.scales[e / 16]) * v;
                            }
                        }
                    }
                }
                let d = b.d.to_f32();
                for t in 0..N {
                    // SAFETY: as above.
                    let a = unsafe { acts[t].get_unchecked(bi) };
                    acc[t] = (isum[t] as f32).mul_add(d * a.d, acc[t]);
                }
            }
            acc
        }
    };
}

k_formats!("neon", dot16_neon, q4_k_neon, q6_k_neon);
k_formats!("neon,dotprod", dot16_dotprod, q4_k_dotprod, q6_k_dotprod);

/// Tokens dotted per pass over a weight row: each block is decoded once for all of them.
const TOKENS_PER_PASS: usize = 4;

/// Rows of a 32-value format dotted per pass: each activation block loaded is used for
/// this many rows.
const ROWS_PER_PASS: usize = 2;

/// Generates a row-range driver for a 32-value format: tiles of `ROWS_PER_PASS` rows by
/// `TOKENS_PER_PASS` tokens (single rows and tokens at the edges), inside the
/// target-feature context so the kernel inlines.
macro_rules! rows32_fn {
    ($name:ident, $B:ty, $kernel:ident, $feat:literal) => {
        #[target_feature(enable = $feat)]
        fn $name(
            bytes: &[u8],
            row_bytes: usize,
            rows: Range<usize>,
            input: &Q8Input,
            tokens: Range<usize>,
            out: &mut [f32],
            stride: usize,
        ) {
            /// The tokens of `tokens` against the rows `ws` (output rows `i ..`).
            #[target_feature(enable = $feat)]
            #[inline]
            fn tile<const R: usize>(
                ws: [&[$B]; R],
                input: &Q8Input,
                tokens: Range<usize>,
                out: &mut [f32],
                i: usize,
                stride: usize,
            ) {
                let nt = tokens.len();
                let mut j = 0;
                while j + TOKENS_PER_PASS <= nt {
                    let acts = std::array::from_fn(|k| input.q8_0_token(tokens.start + j + k));
                    let v = $kernel::<R, TOKENS_PER_PASS>(ws, acts);
                    for (r, v) in v.iter().enumerate() {
                        let o = (i + r) * stride + j;
                        out[o..o + TOKENS_PER_PASS].copy_from_slice(v);
                    }
                    j += TOKENS_PER_PASS;
                }
                while j < nt {
                    let v = $kernel::<R, 1>(ws, [input.q8_0_token(tokens.start + j)]);
                    for (r, v) in v.iter().enumerate() {
                        out[(i + r) * stride + j] = v[0];
                    }
                    j += 1;
                }
            }

            let nt = tokens.len();
            if nt == 0 {
                return;
            }
            let per_row = input.q8_0_token(tokens.start).0.len();
            let blocks = |r: usize| row_blocks::<$B>(bytes, row_bytes, r, per_row);
            let mut i = 0;
            while i < rows.len() {
                let r = rows.start + i;
                if i + ROWS_PER_PASS <= rows.len() {
                    let ws: [_; ROWS_PER_PASS] = std::array::from_fn(|k| blocks(r + k));
                    if ws.iter().all(Option::is_some) {
                        let ws = ws.map(Option::unwrap);
                        tile::<ROWS_PER_PASS>(ws, input, tokens.clone(), out, i, stride);
                        i += ROWS_PER_PASS;
                        continue;
                    }
                }
                match blocks(r) {
                    Some(w) => tile::<1>([w], input, tokens.clone(), out, i, stride),
                    None => out[i * stride..i * stride + nt].fill(f32::NAN),
                }
                i += 1;
            }
        }
    };
}

/// Generates a row-range driver for a K format: one row against `TOKENS_PER_PASS` tokens a
/// pass (single tokens at the end).
macro_rules! rows_k_fn {
    ($name:ident, $B:ty, $kernel:ident, $feat:literal) => {
        #[target_feature(enable = $feat)]
        fn $name(
            bytes: &[u8],
            row_bytes: usize,
            rows: Range<usize>,
            input: &Q8Input,
            tokens: Range<usize>,
            out: &mut [f32],
            stride: usize,
        ) {
            let nt = tokens.len();
            if nt == 0 {
                return;
            }
            let per_row = input.q8k_token(tokens.start).len();
            for (i, r) in rows.enumerate() {
                let o = &mut out[i * stride..i * stride + nt];
                let Some(w) = row_blocks::<$B>(bytes, row_bytes, r, per_row) else {
                    o.fill(f32::NAN);
                    continue;
                };
                let mut j = 0;
                while j + TOKENS_PER_PASS <= nt {
                    let acts = std::array::from_fn(|k| input.q8k_token(tokens.start + j + k));
                    let v = $kernel::<TOKENS_PER_PASS>(w, acts);
                    o[j..j + TOKENS_PER_PASS].copy_from_slice(&v);
                    j += TOKENS_PER_PASS;
                }
                while j < nt {
                    o[j] = $kernel::<1>(w, [input.q8k_token(tokens.start + j)])[0];
                    j += 1;
                }
            }
        }
    };
}

rows32_fn!(rows_q8_0_neon, BlockQ8_0, q8_0_neon, "neon");
rows32_fn!(rows_q4_0_neon, BlockQ4_0, q4_0_neon, "neon");
rows32_fn!(rows_q4_1_neon, BlockQ4_1, q4_1_neon, "neon");
rows32_fn!(rows_q5_0_neon, BlockQ5_0, q5_0_neon, "neon");
rows_k_fn!(rows_q4_k_neon, BlockQ4K, q4_k_neon, "neon");
rows_k_fn!(rows_q6_k_neon, BlockQ6K, q6_k_neon, "neon");
rows32_fn!(rows_q8_0_dotprod, BlockQ8_0, q8_0_dotprod, "neon,dotprod");
rows32_fn!(rows_q4_0_dotprod, BlockQ4_0, q4_0_dotprod, "neon,dotprod");
rows32_fn!(rows_q4_1_dotprod, BlockQ4_1, q4_1_dotprod, "neon,dotprod");
rows32_fn!(rows_q5_0_dotprod, BlockQ5_0, q5_0_dotprod, "neon,dotprod");
rows_k_fn!(rows_q4_k_dotprod, BlockQ4K, q4_k_dotprod, "neon,dotprod");
rows_k_fn!(rows_q6_k_dotprod, BlockQ6K, q6_k_dotprod, "neon,dotprod");

/// A row-range driver: one format's kernel over whole rows.
type RowsFn = unsafe fn(&[u8], usize, Range<usize>, &Q8Input, Range<usize>, &mut [f32], usize);

/// The driver for `ty` with `dot`; `None` for formats without a NEON kernel.
fn driver(ty: GgmlType, dot: Dot) -> Option<RowsFn> {
    Some(match (ty, dot) {
        (GgmlType::Q8_0, Dot::Neon) => rows_q8_0_neon,
        (GgmlType::Q4_0, Dot::Neon) => rows_q4_0_neon,
        (GgmlType::Q4_1, Dot::Neon) => rows_q4_1_neon,
        (GgmlType::Q5_0, Dot::Neon) => rows_q5_0_neon,
        (GgmlType::Q4_K, Dot::Neon) => rows_q4_k_neon,
        (GgmlType::Q6_K, Dot::Neon) => rows_q6_k_neon,
        (GgmlType::Q8_0, Dot::DotProd) => rows_q8_0_dotprod,
        (GgmlType::Q4_0, Dot::DotProd) => rows_q4_0_dotprod,
        (GgmlType::Q4_1, Dot::DotProd) => rows_q4_1_dotprod,
        (GgmlType::Q5_0, Dot::DotProd) => rows_q5_0_dotprod,
        (GgmlType::Q4_K, Dot::DotProd) => rows_q4_k_dotprod,
        (GgmlType::Q6_K, Dot::DotProd) => rows_q6_k_dotprod,
        _ => return None,
    })
}

/// [`super::dot_rows_q8`] with `dot` (baseline NEON's where the CPU lacks it) for the
/// formats with a NEON kernel; returns `false` (having written nothing) for the others.
#[allow(clippy::too_many_arguments)]
pub(super) fn dot_rows_with(
    dot: Dot,
    ty: GgmlType,
    bytes: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    input: &Q8Input,
    tokens: Range<usize>,
    out: &mut [f32],
    stride: usize,
) -> bool {
    let dot = if dot.runs_here() { dot } else { Dot::Neon };
    let Some(f) = driver(ty, dot) else {
        return false;
    };
    // SAFETY: NEON is part of every aarch64 target; the dot-product extension is checked
    // by `runs_here`.
    unsafe { f(bytes, row_bytes, rows, input, tokens, out, stride) };
    true
}
