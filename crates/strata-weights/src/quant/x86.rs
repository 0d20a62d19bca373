//! AVX2 integer dot products of weight blocks with 8-bit activation blocks.
//!
//! The building block is `_mm256_maddubs_epi16(u, s)`: 32 unsigned bytes times 32 signed
//! bytes, adjacent products summed to 16 signed 16-bit lanes. Every use below stays inside
//! i16: unsigned codes are at most 63 and activation codes lie in -127..=127, so a pair
//! sums to at most 2 * 63 * 127 = 16002; for signed-by-signed (Q8_0 weights) the weight's
//! sign moves onto the activation so its magnitude (at most 128) is the unsigned operand:
//! 2 * 128 * 127 = 32512. `_mm256_madd_epi16` with a per-group scale (or with ones) widens
//! to i32. Formats whose codes carry an offset (`q - 8`, `q - 16`, `q - 32`) or a minimum
//! dot the unsigned codes and subtract offset times the activation code sums, which the
//! caller precomputed.
//!
//! Where the CPU has VNNI, the 32-value formats sum each lane's four products with one
//! `vpdpbusd` instead of the `maddubs` + `madd` pair: the same four products a lane, so the
//! same sums and the same bits (`STRATA_CPU_VNNI=0` turns it off). Two encodings of the
//! same 256-bit instruction: AVX-VNNI's (`_mm256_dpbusd_avx_epi32`, recent Intel cores) and
//! AVX-512 VNNI's with AVX-512VL (`_mm256_dpbusd_epi32`, AMD Zen 4 and Intel server cores,
//! which lack the former). The K formats keep the pair: their per-group scale rides in `madd`'s 16-bit lanes.
//!
//! The integer sums equal those of the portable [`super::QuantBlock::dot_q8`]; per-block
//! f32 scaling is fused (FMA) and summed in 8 lanes, so the f32 result differs from the
//! portable one only by rounding.

use std::arch::x86_64::*;
use std::ops::Range;

use super::fast::{Acts4, Q8Input};
use super::k_common::unpack_scales_mins;
use super::{
    as_blocks, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0, F16Le,
};
use strata_gguf::GgmlType;

/// Whether the CPU has what these kernels use (AVX2, FMA and F16C).
#[inline]
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn h2f(h: F16Le) -> f32 {
    let bits = u16::from_le_bytes(h.0);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_add_ss(x, _mm_shuffle_ps::<1>(x, x));
    _mm_cvtss_f32(x)
}

/// How far ahead of the weight stream to prefetch, in bytes.
const PREFETCH_AHEAD: usize = 1536;

/// Prefetches the cache lines of `bytes[from..to]` shifted `PREFETCH_AHEAD` bytes ahead,
/// starting at `*next` if that is further on, and moves `*next` past them: each line of
/// a stream is asked for once. The hardware prefetcher of some (virtualised) CPUs does not
/// keep a block-by-block stream fed; this keeps about `PREFETCH_AHEAD` bytes in flight.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn prefetch_ahead(bytes: &[u8], to: usize, next: &mut usize) {
    let base = bytes.as_ptr() as *const i8;
    let end = to + PREFETCH_AHEAD;
    while *next < end {
        // A hint: it does not fault on any address, in bounds or not.
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(*next));
        *next += 64;
    }
}

/// 32 bytes from `p`.
///
/// # Safety
/// `p` must be valid for reading 32 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes; unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// The 32 codes of a 16-byte nibble field: low nibbles in lane 0, high nibbles in lane 1
/// (element order for Q4_0 / Q4_1 / Q5_0).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn nibbles16(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 bytes.
    let b = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(b, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m4);
    _mm256_set_m128i(hi, lo)
}

/// Sum of `u[i] * s[i]` in 8 i32 lanes for unsigned `u` (< 64) and signed `s`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_us(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// [`dot_us`] in one VNNI instruction: the same four products a lane, so the same sums.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline]
fn dot_us_vnni(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
}

/// [`dot_us`] as AVX-512 VNNI's 256-bit `vpdpbusd`.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
#[inline]
fn dot_us_vnni512(u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
}

/// The Q8_K activations of `N` consecutive tokens.
fn acts_k<const N: usize>(input: &Q8Input, t0: usize) -> [&[BlockQ8K]; N] {
    std::array::from_fn(|k| input.q8k_parts(input.token_blocks(t0 + k)))
}

/// Generates `$name`: `R` rows of a 32-value format against `N` tokens of one activation
/// group (lanes `lane0 .. lane0 + N`), a register tile of `R x N` accumulators. `codes`
/// gives a block's 32 codes: unsigned, or signed when `SIGNED` (Q8_0); `scale` its `d`;
/// with `CORR`, `corr` the factor of the activation block's `d * code_sum` (the offset or
/// the minimum). Each weight block is decoded once for the `N` tokens and each activation
/// block loaded once for the `R` rows.
///
/// Every (row, token) pair gets the same operations in the same order whatever `R`, `N` and
/// `lane0` are (one accumulator, blocks in order, the same horizontal sum), so a token's
/// result has the same bits in any tile: batch invariance. `$dot` sums four adjacent byte
/// products into each i32 lane, the same grouping for the AVX2 pair of instructions and
/// the VNNI one, so both give the same bits.
macro_rules! small_n_fn {
    ($name:ident, $feat:literal, $dot:ident) => {
        #[target_feature(enable = $feat)]
        #[inline]
        fn $name<B, const R: usize, const N: usize, const SIGNED: bool, const CORR: bool>(
            w: [&[B]; R],
            acts: &[Acts4],
            lane0: usize,
            codes: impl Fn(&B) -> __m256i,
            scale: impl Fn(&B) -> f32,
            corr: impl Fn(&B) -> f32,
        ) -> [[f32; N]; R] {
            assert!(lane0 + N <= 4 && w.iter().all(|w| w.len() == acts.len()));
            let mut acc = [[_mm256_setzero_ps(); N]; R];
            if N == 1 {
                // One token: its scale products and corrections in scalars, the same IEEE
                // operations as the vector lanes below, without the round trip through memory.
                let mut c = [0f32; R];
                for (i, a) in acts.iter().enumerate() {
                    // SAFETY: `qs[lane0]` is 32 bytes.
                    let av = unsafe { load32(a.qs[lane0].as_ptr() as *const u8) };
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let b = unsafe { w[r].get_unchecked(i) };
                        let q = codes(b);
                        let u = if SIGNED { _mm256_sign_epi8(q, q) } else { q };
                        let sv = if SIGNED { _mm256_sign_epi8(av, q) } else { av };
                        let p = _mm256_cvtepi32_ps($dot(u, sv));
                        let sc = _mm256_set1_ps(scale(b) * a.d[lane0]);
                        acc[r][0] = _mm256_fmadd_ps(p, sc, acc[r][0]);
                        if CORR {
                            c[r] += corr(b) * a.dsum[lane0];
                        }
                    }
                }
                return std::array::from_fn(|r| std::array::from_fn(|_| hsum(acc[r][0]) + c[r]));
            }
            let mut c = [_mm_setzero_ps(); R];
            for (i, a) in acts.iter().enumerate() {
                // SAFETY: `d` and `dsum` are 4 f32 each.
                let ad = unsafe { _mm_loadu_ps(a.d.as_ptr()) };
                // SAFETY: as above.
                let asum = unsafe { _mm_loadu_ps(a.dsum.as_ptr()) };
                let mut q = [_mm256_setzero_si256(); R];
                let mut s = [[0f32; 4]; R];
                for r in 0..R {
                    // SAFETY: every row has `acts.len()` blocks (asserted above).
                    let b = unsafe { w[r].get_unchecked(i) };
                    q[r] = codes(b);
                    // The weight scale times each token's: the same products as scalar ones.
                    let sv = _mm_mul_ps(_mm_set1_ps(scale(b)), ad);
                    // SAFETY: `s[r]` is 4 f32.
                    unsafe { _mm_storeu_ps(s[r].as_mut_ptr(), sv) };
                    if CORR {
                        c[r] = _mm_add_ps(c[r], _mm_mul_ps(_mm_set1_ps(corr(b)), asum));
                    }
                }
                let u = q.map(|q| if SIGNED { _mm256_sign_epi8(q, q) } else { q });
                for k in 0..N {
                    // SAFETY: `qs[lane]` is 32 bytes.
                    let av = unsafe { load32(a.qs[lane0 + k].as_ptr() as *const u8) };
                    for r in 0..R {
                        let sv = if SIGNED {
                            _mm256_sign_epi8(av, q[r])
                        } else {
                            av
                        };
                        let p = _mm256_cvtepi32_ps($dot(u[r], sv));
                        let sc = _mm256_set1_ps(s[r][lane0 + k]);
                        acc[r][k] = _mm256_fmadd_ps(p, sc, acc[r][k]);
                    }
                }
            }
            std::array::from_fn(|r| {
                let mut cs = [0f32; 4];
                // SAFETY: `cs` is 4 f32.
                unsafe { _mm_storeu_ps(cs.as_mut_ptr(), c[r]) };
                std::array::from_fn(|k| hsum(acc[r][k]) + if CORR { cs[lane0 + k] } else { 0.0 })
            })
        }
    };
}

small_n_fn!(small_n, "avx2,fma,f16c", dot_us);
small_n_fn!(small_n_vnni, "avx2,fma,f16c,avxvnni", dot_us_vnni);
small_n_fn!(
    small_n_vnni512,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    dot_us_vnni512
);

/// Q5_0's 32 unsigned 5-bit codes: the nibbles plus 16 where bit `i` of `qh` is set.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn codes5(b: &BlockQ5_0) -> __m256i {
    let bits = u32::from_le_bytes(b.qh) as i32;
    // Byte i of the result takes byte i / 8 of `bits`, then tests bit i % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
    _mm256_or_si256(
        nibbles16(&b.qs),
        _mm256_and_si256(set, _mm256_set1_epi8(0x10)),
    )
}

/// Generates the 32-value formats' kernels over `$small` (AVX2, or VNNI): `R` rows
/// against `N` tokens of one activation group from lane `lane0`.
macro_rules! small_formats {
    ($feat:literal, $small:ident, $q8_0:ident, $q4_0:ident, $q4_1:ident, $q5_0:ident) => {
        #[target_feature(enable = $feat)]
        #[inline]
        fn $q8_0<const R: usize, const N: usize>(
            w: [&[BlockQ8_0]; R],
            acts: &[Acts4],
            lane0: usize,
        ) -> [[f32; N]; R] {
            $small::<_, R, N, true, false>(
                w,
                acts,
                lane0,
                // SAFETY: `qs` is 32 bytes.
                |b| unsafe { load32(b.qs.as_ptr() as *const u8) },
                |b| h2f(b.d),
                |_| 0.0,
            )
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn $q4_0<const R: usize, const N: usize>(
            w: [&[BlockQ4_0]; R],
            acts: &[Acts4],
            lane0: usize,
        ) -> [[f32; N]; R] {
            $small::<_, R, N, false, true>(
                w,
                acts,
                lane0,
                |b| nibbles16(&b.qs),
                |b| h2f(b.d),
                |b| -8.0 * h2f(b.d),
            )
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn $q4_1<const R: usize, const N: usize>(
            w: [&[BlockQ4_1]; R],
            acts: &[Acts4],
            lane0: usize,
        ) -> [[f32; N]; R] {
            $small::<_, R, N, false, true>(
                w,
                acts,
                lane0,
                |b| nibbles16(&b.qs),
                |b| h2f(b.d),
                |b| h2f(b.m),
            )
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn $q5_0<const R: usize, const N: usize>(
            w: [&[BlockQ5_0]; R],
            acts: &[Acts4],
            lane0: usize,
        ) -> [[f32; N]; R] {
            $small::<_, R, N, false, true>(
                w,
                acts,
                lane0,
                |b| codes5(b),
                |b| h2f(b.d),
                |b| -16.0 * h2f(b.d),
            )
        }
    };
}

small_formats!("avx2,fma,f16c", small_n, q8_0_n, q4_0_n, q4_1_n, q5_0_n);
small_formats!(
    "avx2,fma,f16c,avxvnni",
    small_n_vnni,
    q8_0_n_vnni,
    q4_0_n_vnni,
    q4_1_n_vnni,
    q5_0_n_vnni
);
small_formats!(
    "avx2,fma,f16c,avx512vnni,avx512vl",
    small_n_vnni512,
    q8_0_n_vnni512,
    q4_0_n_vnni512,
    q4_1_n_vnni512,
    q5_0_n_vnni512
);

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q4_k_n<const N: usize>(w: &[BlockQ4K], input: &Q8Input, t0: usize) -> [f32; N] {
    let acts = acts_k::<N>(input, t0);
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut corr = [0f32; N];
    for (bi, b) in w.iter().enumerate() {
        let (sc, mn) = unpack_scales_mins(&b.scales);
        let mut isum = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            // SAFETY: `qs` has 128 bytes.
            let q = unsafe { load32(b.qs.as_ptr().add(32 * c)) };
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            let (slo, shi) = (
                _mm256_set1_epi16(i16::from(sc[2 * c])),
                _mm256_set1_epi16(i16::from(sc[2 * c + 1])),
            );
            for k in 0..N {
                let a = acts[k][bi].qs.as_ptr() as *const u8;
                // SAFETY: an activation block has 256 codes; 64 c + 64 <= 256.
                let (a0, a1) = unsafe { (load32(a.add(64 * c)), load32(a.add(64 * c + 32))) };
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), slo);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), shi);
                isum[k] = _mm256_add_epi32(isum[k], _mm256_add_epi32(p0, p1));
            }
        }
        let (d, dmin) = (h2f(b.d), h2f(b.dmin));
        for k in 0..N {
            let a = &acts[k][bi];
            let msum: i32 = mn
                .iter()
                .zip(a.bsums.chunks_exact(2))
                .map(|(&m, s)| i32::from(m) * (i32::from(s[0]) + i32::from(s[1])))
                .sum();
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[k]), _mm256_set1_ps(d * a.d), acc[k]);
            corr[k] += dmin * a.d * msum as f32;
        }
    }
    std::array::from_fn(|k| hsum(acc[k]) - corr[k])
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q6_k_n<const N: usize>(w: &[BlockQ6K], input: &Q8Input, t0: usize) -> [f32; N] {
    let acts = acts_k::<N>(input, t0);
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut corr = [0f32; N];
    for (bi, b) in w.iter().enumerate() {
        let mut isum = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            // SAFETY: `ql` has 128 bytes, `qh` 64: offsets stay inside.
            let (ql0, ql1, qh) = unsafe {
                (
                    load32(b.ql.as_ptr().add(64 * h)),
                    load32(b.ql.as_ptr().add(64 * h + 32)),
                    load32(b.qh.as_ptr().add(32 * h)),
                )
            };
            // Elements 128 h + 32 k .. + 32 as unsigned 6-bit codes (q + 32).
            let u = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    _mm256_and_si256(qh, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                ),
            ];
            // Lane 0 of each holds group 2 k, lane 1 group 2 k + 1 (16 values each).
            let scales: [__m256i; 4] = std::array::from_fn(|k| {
                let g = 8 * h + 2 * k;
                _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(b.scales[g + 1])),
                    _mm_set1_epi16(i16::from(b.scales[g])),
                )
            });
            for t in 0..N {
                let a = acts[t][bi].qs.as_ptr() as *const u8;
                for k in 0..4 {
                    // SAFETY: an activation block has 256 codes; 128 h + 32 k + 32 <= 256.
                    let av = unsafe { load32(a.add(128 * h + 32 * k)) };
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], av), scales[k]);
                    isum[t] = _mm256_add_epi32(isum[t], p);
                }
            }
        }
        let d = h2f(b.d);
        for t in 0..N {
            let a = &acts[t][bi];
            let mut osum = 0i32;
            for g in 0..16 {
                osum += i32::from(b.scales[g]) * i32::from(a.bsums[g]);
            }
            let da = d * a.d;
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(da), acc[t]);
            corr[t] += da * (32 * osum) as f32;
        }
    }
    std::array::from_fn(|t| hsum(acc[t]) - corr[t])
}

/// Tokens dotted per pass over a weight row in prefill and batched decode: each block is
/// decoded once for all of them. Every kernel keeps one accumulator per token and does each
/// token's arithmetic in the same order whatever `N` is, so a token's result has the same
/// bits in a pass of 4 as alone (`row_kernels_are_batch_invariant`): a request's tokens do
/// not depend on what else is in its batch or on how its prompt was chunked.
const TOKENS_PER_PASS: usize = 4;

/// Generates a row-range driver for one format: the loops run inside the AVX2 context so
/// the kernel inlines.
macro_rules! rows_fn {
    ($name:ident, $B:ty, $kernel:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
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
            // Line-aligned start of the prefetch stream, at the first row's bytes.
            let mut next = (rows.start * row_bytes + PREFETCH_AHEAD) & !63;
            for (i, r) in rows.enumerate() {
                prefetch_ahead(bytes, (r + 1) * row_bytes, &mut next);
                let o = &mut out[i * stride..i * stride + nt];
                let Ok(w) = as_blocks::<$B>(&bytes[r * row_bytes..(r + 1) * row_bytes]) else {
                    o.fill(f32::NAN);
                    continue;
                };
                let mut j = 0;
                while j + TOKENS_PER_PASS <= nt {
                    let v = $kernel::<TOKENS_PER_PASS>(w, input, tokens.start + j);
                    o[j..j + TOKENS_PER_PASS].copy_from_slice(&v);
                    j += TOKENS_PER_PASS;
                }
                while j < nt {
                    o[j] = $kernel::<1>(w, input, tokens.start + j)[0];
                    j += 1;
                }
            }
        }
    };
}

/// Rows of a 32-value format dotted per pass: each activation block loaded is used for
/// this many rows.
const ROWS_PER_PASS: usize = 2;

/// Generates a row-range driver for a 32-value format: tiles of `ROWS_PER_PASS` rows by
/// one group of 4 tokens (single rows and tokens at the edges), inside the target-feature
/// context so the kernel inlines.
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
                while j < nt {
                    let (acts, lane) = input.group_of(tokens.start + j);
                    if lane == 0 && j + 4 <= nt {
                        let v = $kernel::<R, 4>(ws, acts, 0);
                        for (r, v) in v.iter().enumerate() {
                            let o = (i + r) * stride + j;
                            out[o..o + 4].copy_from_slice(v);
                        }
                        j += 4;
                    } else {
                        let v = $kernel::<R, 1>(ws, acts, lane);
                        for (r, v) in v.iter().enumerate() {
                            out[(i + r) * stride + j] = v[0];
                        }
                        j += 1;
                    }
                }
            }

            let nt = tokens.len();
            if nt == 0 {
                return;
            }
            let per_row = input.group_of(tokens.start).0.len();
            let blocks = |r: usize| {
                as_blocks::<$B>(&bytes[r * row_bytes..(r + 1) * row_bytes])
                    .ok()
                    .filter(|w| w.len() == per_row)
            };
            // Line-aligned start of the prefetch stream, at the first row's bytes.
            let mut next = (rows.start * row_bytes + PREFETCH_AHEAD) & !63;
            let mut i = 0;
            while i < rows.len() {
                let r = rows.start + i;
                if i + ROWS_PER_PASS <= rows.len() {
                    prefetch_ahead(bytes, (r + ROWS_PER_PASS) * row_bytes, &mut next);
                    let ws: [_; ROWS_PER_PASS] = std::array::from_fn(|k| blocks(r + k));
                    if ws.iter().all(Option::is_some) {
                        let ws = ws.map(Option::unwrap);
                        tile::<ROWS_PER_PASS>(ws, input, tokens.clone(), out, i, stride);
                        i += ROWS_PER_PASS;
                        continue;
                    }
                }
                prefetch_ahead(bytes, (r + 1) * row_bytes, &mut next);
                match blocks(r) {
                    Some(w) => tile::<1>([w], input, tokens.clone(), out, i, stride),
                    None => out[i * stride..i * stride + nt].fill(f32::NAN),
                }
                i += 1;
            }
        }
    };
}

rows32_fn!(rows_q8_0, BlockQ8_0, q8_0_n, "avx2,fma,f16c");
rows32_fn!(rows_q4_0, BlockQ4_0, q4_0_n, "avx2,fma,f16c");
rows32_fn!(rows_q4_1, BlockQ4_1, q4_1_n, "avx2,fma,f16c");
rows32_fn!(rows_q5_0, BlockQ5_0, q5_0_n, "avx2,fma,f16c");
rows_fn!(rows_q4_k, BlockQ4K, q4_k_n);
rows_fn!(rows_q6_k, BlockQ6K, q6_k_n);
rows32_fn!(
    rows_q8_0_vnni,
    BlockQ8_0,
    q8_0_n_vnni,
    "avx2,fma,f16c,avxvnni"
);
rows32_fn!(
    rows_q4_0_vnni,
    BlockQ4_0,
    q4_0_n_vnni,
    "avx2,fma,f16c,avxvnni"
);
rows32_fn!(
    rows_q4_1_vnni,
    BlockQ4_1,
    q4_1_n_vnni,
    "avx2,fma,f16c,avxvnni"
);
rows32_fn!(
    rows_q5_0_vnni,
    BlockQ5_0,
    q5_0_n_vnni,
    "avx2,fma,f16c,avxvnni"
);
rows32_fn!(
    rows_q8_0_vnni512,
    BlockQ8_0,
    q8_0_n_vnni512,
    "avx2,fma,f16c,avx512vnni,avx512vl"
);
rows32_fn!(
    rows_q4_0_vnni512,
    BlockQ4_0,
    q4_0_n_vnni512,
    "avx2,fma,f16c,avx512vnni,avx512vl"
);
rows32_fn!(
    rows_q4_1_vnni512,
    BlockQ4_1,
    q4_1_n_vnni512,
    "avx2,fma,f16c,avx512vnni,avx512vl"
);
rows32_fn!(
    rows_q5_0_vnni512,
    BlockQ5_0,
    q5_0_n_vnni512,
    "avx2,fma,f16c,avx512vnni,avx512vl"
);

/// How the 32-value formats sum four byte products into a lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dot {
    /// `maddubs` + `madd` (AVX2).
    Avx2,
    /// `vpdpbusd`, AVX-VNNI's encoding.
    AvxVnni,
    /// `vpdpbusd`, AVX-512 VNNI's 256-bit encoding (with AVX-512VL).
    Avx512Vnni,
}

impl Dot {
    /// Whether this CPU runs it (AVX2, FMA and F16C taken as given).
    pub(super) fn runs_here(self) -> bool {
        match self {
            Dot::Avx2 => true,
            Dot::AvxVnni => is_x86_feature_detected!("avxvnni"),
            Dot::Avx512Vnni => {
                is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
            }
        }
    }
}

/// The dot the kernels take: VNNI where the CPU has either encoding (AVX-VNNI first: it
/// needs no AVX-512 state) and `STRATA_CPU_VNNI` is not `0` (read once; it compares the
/// two in one build).
pub(super) fn best_dot() -> Dot {
    static DOT: std::sync::OnceLock<Dot> = std::sync::OnceLock::new();
    *DOT.get_or_init(|| {
        let off = std::env::var("STRATA_CPU_VNNI").is_ok_and(|v| v == "0");
        [Dot::AvxVnni, Dot::Avx512Vnni]
            .into_iter()
            .find(|d| !off && available() && d.runs_here())
            .unwrap_or(Dot::Avx2)
    })
}

/// A row-range driver: one format's kernel over whole rows.
type RowsFn = unsafe fn(&[u8], usize, Range<usize>, &Q8Input, Range<usize>, &mut [f32], usize);

/// The driver for `ty` with the 32-value formats' `dot`; `None` for formats without an
/// AVX2 kernel.
fn driver(ty: GgmlType, dot: Dot) -> Option<RowsFn> {
    Some(match (ty, dot) {
        (GgmlType::Q8_0, Dot::AvxVnni) => rows_q8_0_vnni,
        (GgmlType::Q4_0, Dot::AvxVnni) => rows_q4_0_vnni,
        (GgmlType::Q4_1, Dot::AvxVnni) => rows_q4_1_vnni,
        (GgmlType::Q5_0, Dot::AvxVnni) => rows_q5_0_vnni,
        (GgmlType::Q8_0, Dot::Avx512Vnni) => rows_q8_0_vnni512,
        (GgmlType::Q4_0, Dot::Avx512Vnni) => rows_q4_0_vnni512,
        (GgmlType::Q4_1, Dot::Avx512Vnni) => rows_q4_1_vnni512,
        (GgmlType::Q5_0, Dot::Avx512Vnni) => rows_q5_0_vnni512,
        (GgmlType::Q8_0, _) => rows_q8_0,
        (GgmlType::Q4_0, _) => rows_q4_0,
        (GgmlType::Q4_1, _) => rows_q4_1,
        (GgmlType::Q5_0, _) => rows_q5_0,
        (GgmlType::Q4_K, _) => rows_q4_k,
        (GgmlType::Q6_K, _) => rows_q6_k,
        _ => return None,
    })
}

/// [`super::dot_rows_q8`] with the 32-value formats' `dot` (AVX2's where the CPU lacks it)
/// for the formats with an AVX2 kernel, when the CPU has the features; returns `false`
/// (having written nothing) otherwise.
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
    if !available() {
        return false;
    }
    let dot = if dot.runs_here() { dot } else { Dot::Avx2 };
    let Some(f) = driver(ty, dot) else {
        return false;
    };
    // SAFETY: the CPU has the features the driver is compiled for (AVX2, FMA and F16C
    // checked above, the VNNI encoding by `runs_here`).
    unsafe { f(bytes, row_bytes, rows, input, tokens, out, stride) };
    true
}
