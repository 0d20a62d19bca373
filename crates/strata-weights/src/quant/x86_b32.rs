//! x86 kernels of the 32-value formats (Q8_0, Q4_0, Q4_1, Q5_0), in two shapes that give
//! the same bits:
//!
//! - **Eight tokens a lane** (prefill, batched decode): activations are stored eight tokens
//!   side by side, four codes of each token per 32-bit lane ([`Acts8`]). A weight block is
//!   decoded once, each four of its codes broadcast to every lane, and one byte dot adds
//!   them into eight tokens' integer sums at once. The f32 step (the block's scale times
//!   each token's, fused into the running sum) then runs once per block for eight tokens,
//!   not once per (token, block), and nothing is summed across lanes.
//! - **A row a lane** (one token): each row's byte products land in eight lanes, whose
//!   integer sums are reduced exactly to one lane per row; the f32 step runs for
//!   [`TOKEN_ROWS`] rows at once.
//!
//! Per (row, token) both do exactly this, block by block in order: the block's integer sum
//! (exact), `acc = fma(f32(sum), d_w * d_a, acc)`, `c = fma(corr_w, dsum_a, c)` for formats
//! with an offset or a minimum, and the result `acc + c`. So a token's result has the same
//! bits whichever shape, tile or batch it runs in (batch invariance), and the AVX2 and VNNI
//! forms of the byte dot (the same products, summed exactly) give the same bits too.

use std::arch::x86_64::*;
use std::ops::Range;

use super::fast::{row_blocks, Acts8, PairActs, Q8Input, GROUP};
use super::x86::{
    drive_groups, for_each_dot_form, h2f, h2f4, high_bits_shuffled, lanes, load32, nibbles16,
    prefetch_ahead, token_column, DecodedRow, PREFETCH_AHEAD,
};
use super::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, F16Le};

/// The exact sums of the first `R` (2 or 4) of `p`'s eight-lane partial sums, one row a
/// lane: `[Σp0, Σp1, Σp2, Σp3]`, or `[Σp0, Σp1, Σp0, Σp1]` for two. Integer additions, so
/// exact in any order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn reduce_rows<const R: usize>(p: [__m256i; 4]) -> __m128i {
    if R <= 2 {
        let t = _mm256_hadd_epi32(p[0], p[1]);
        let s = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        return _mm_hadd_epi32(s, s);
    }
    let t = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t))
}

/// The exact sums of four eight-lane partial sums, `[Σp0, Σp1, Σp2, Σp3]`, by unpacks and
/// adds: `phadd` costs a pair of shuffles per add, and shuffles are what a one-token pass
/// runs short of.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn reduce4(p: [__m256i; 4]) -> __m128i {
    let t0 = _mm256_add_epi32(
        _mm256_unpacklo_epi32(p[0], p[1]),
        _mm256_unpackhi_epi32(p[0], p[1]),
    );
    let t1 = _mm256_add_epi32(
        _mm256_unpacklo_epi32(p[2], p[3]),
        _mm256_unpackhi_epi32(p[2], p[3]),
    );
    let u = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
    _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256::<1>(u))
}

/// A one-token pass's view of a token's activations: its Q8_0 blocks, their scales,
/// their scales times code sums, and the same spread by pairs of blocks.
pub(super) type TokenActs<'a> = (&'a [BlockQ8_0], &'a [f32], &'a [f32], &'a [PairActs]);

/// Four blocks' f16 scale and correction pairs as eight f32 lanes `[d0, c0, d1, c1, ..]`,
/// each pair's 32 bits put together in general registers: the vector unit only converts.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn h2f4_pairs(p: [[F16Le; 2]; 4]) -> __m256 {
    let w = p.map(|[a, b]| u64::from(u32::from_le_bytes([a.0[0], a.0[1], b.0[0], b.0[1]])));
    _mm256_cvtph_ps(_mm_set_epi64x(
        (w[2] | w[3] << 32) as i64,
        (w[0] | w[1] << 32) as i64,
    ))
}

/// Four blocks' scales `d` and corrections `k * d` (`k` a power of two, so exact) as
/// `[d0, k d0, d1, k d1, ..]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn scale_pairs(d: [F16Le; 4], k: f32) -> __m256 {
    let v = h2f4_pairs(d.map(|d| [d, d]));
    _mm256_mul_ps(v, _mm256_setr_ps(1.0, k, 1.0, k, 1.0, k, 1.0, k))
}

/// Rows a one-token pass takes together (at most 4, the lanes of the f32 step). Two keep
/// as few weight streams in flight per thread as the memory system serves well: four
/// streamed the output head of a 262,144-token vocabulary slower on two threads.
pub(super) const TOKEN_ROWS: usize = 2;

/// The wanted tokens of each activation group they fall in: (group start, lanes).
pub(super) fn spans(tokens: &Range<usize>) -> Vec<(usize, Range<usize>)> {
    let mut v = Vec::new();
    let mut t = tokens.start;
    while t < tokens.end {
        let g0 = t / GROUP * GROUP;
        let end = (g0 + GROUP).min(tokens.end);
        v.push((g0, t - g0..end - g0));
        t = end;
    }
    v
}

/// Generates one form's kernels ([`for_each_dot_form`]), on that form's byte dots
/// ([`super::x86::dots`]) and its way of spreading Q5_0's fifth bits.
macro_rules! kernels {
    ($m:ident, $_feat_k:literal, $feat:literal, $_dot:expr, $_dot4:expr, |$bits:ident| $high:expr) => {
        pub(super) mod $m {
            use super::*;
            use super::super::x86::dots::$m::{dot, dot4};

            /// 16 in byte `i` where bit `i` of `bits` is set (the form's way).
            #[target_feature(enable = $feat)]
            #[inline]
            fn high($bits: u32) -> __m256i {
                $high
            }

            /// Q5_0's 32 unsigned 5-bit codes: the nibbles plus 16 where bit `i` of `qh`
            /// is set.
            #[target_feature(enable = $feat)]
            #[inline]
            fn codes5(b: &BlockQ5_0) -> __m256i {
                _mm256_or_si256(nibbles16(&b.qs), high(u32::from_le_bytes(b.qh)))
            }

            /// A block's integer sums against one activation group for unsigned codes below
            /// 32: row `r`'s codes `4 m .. 4 m + 4` (`word(r, m)`) broadcast to every
            /// token's lane, four runs into one [`dot4`]; row `r`'s eight lanes in
            /// element `r`.
            #[target_feature(enable = $feat)]
            #[inline]
            fn unsigned_sums<const R: usize>(
                word: &impl Fn(usize, usize) -> i32,
                a: &Acts8,
            ) -> [__m256i; R] {
                let mut isum = [_mm256_setzero_si256(); R];
                for h in 0..2 {
                    // SAFETY: each of `qs` is 32 bytes.
                    let av: [__m256i; 4] = std::array::from_fn(|k| unsafe {
                        load32(a.qs[4 * h + k].as_ptr() as *const u8)
                    });
                    for (r, s) in isum.iter_mut().enumerate() {
                        let u = std::array::from_fn(|k| _mm256_set1_epi32(word(r, 4 * h + k)));
                        *s = dot4(*s, u, av);
                    }
                }
                isum
            }

            /// [`dot`] of a block's codes `q` with activation codes `a`: unsigned codes as
            /// they are; signed ones (Q8_0) with the weight's sign moved onto the
            /// activation, so the unsigned operand is the magnitude.
            #[target_feature(enable = $feat)]
            #[inline]
            fn dot_codes<const SIGNED: bool>(acc: __m256i, q: __m256i, a: __m256i) -> __m256i {
                if SIGNED {
                    dot(acc, _mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q))
                } else {
                    dot(acc, q, a)
                }
            }

            /// `R` rows, decoded, against the eight tokens of one activation group: each
            /// row's eight results. Codes are signed when `SIGNED` (Q8_0); `CORR` adds
            /// each block's correction times the activation block's `d * code_sum`.
            #[target_feature(enable = $feat)]
            #[inline]
            fn group<const R: usize, const SIGNED: bool, const CORR: bool>(
                w: [&DecodedRow; R],
                acts: &[Acts8],
            ) -> [__m256; R] {
                assert!(w.iter().all(|w| w.blocks() == acts.len()));
                let mut acc = [_mm256_setzero_ps(); R];
                let mut c = [_mm256_setzero_ps(); R];
                for (i, a) in acts.iter().enumerate() {
                    // SAFETY: `d` and `dsum` are 8 f32 each.
                    let (ad, asum) = unsafe {
                        (
                            _mm256_loadu_ps(a.d.as_ptr()),
                            _mm256_loadu_ps(a.dsum.as_ptr()),
                        )
                    };
                    let mut sc = [_mm256_setzero_ps(); R];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let d = unsafe { *w[r].d.get_unchecked(i) };
                        sc[r] = _mm256_mul_ps(_mm256_set1_ps(d), ad);
                        if CORR {
                            // SAFETY: as above.
                            let k = unsafe { *w[r].corr.get_unchecked(i) };
                            c[r] = _mm256_fmadd_ps(_mm256_set1_ps(k), asum, c[r]);
                        }
                    }
                    let isum = if SIGNED {
                        let mut isum = [_mm256_setzero_si256(); R];
                        for (m, qs) in a.qs.iter().enumerate() {
                            // SAFETY: `qs` is 32 bytes.
                            let av = unsafe { load32(qs.as_ptr() as *const u8) };
                            for r in 0..R {
                                // Codes 4 m .. 4 m + 4 of the block, in every lane.
                                // SAFETY: as above; `m` < 8.
                                let wq = _mm256_set1_epi32(unsafe {
                                    *w[r].codes.get_unchecked(i).get_unchecked(m)
                                });
                                isum[r] = dot_codes::<SIGNED>(isum[r], wq, av);
                            }
                        }
                        isum
                    } else {
                        // SAFETY: as above; `m` < 8.
                        let word = |r: usize, m: usize| unsafe {
                            *w[r].codes.get_unchecked(i).get_unchecked(m)
                        };
                        unsigned_sums::<R>(&word, a)
                    };
                    for r in 0..R {
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), sc[r], acc[r]);
                    }
                }
                std::array::from_fn(|r| {
                    if CORR {
                        _mm256_add_ps(acc[r], c[r])
                    } else {
                        acc[r]
                    }
                })
            }

            /// [`group`] decoding each block as it goes (for tiles of few groups, where
            /// decoding a row once into [`DecodedRow`] costs more than it saves): `R` rows against the eight tokens of one activation group: each row's
            /// eight results. `codes` gives a block's codes (signed when `SIGNED`: Q8_0),
            /// `scale` its `d`, `corr` (with `CORR`) the factor of the activation block's
            /// `d * code_sum`, given the block and its `d`.
            #[target_feature(enable = $feat)]
            #[inline]
            fn group_blocks<B, const R: usize, const SIGNED: bool, const CORR: bool>(
                w: [&[B]; R],
                acts: &[Acts8],
                codes: impl Fn(&B) -> __m256i,
                scale: impl Fn(&B) -> f32,
                corr: impl Fn(&B, f32) -> f32,
            ) -> [__m256; R] {
                assert!(w.iter().all(|w| w.len() == acts.len()));
                let mut acc = [_mm256_setzero_ps(); R];
                let mut c = [_mm256_setzero_ps(); R];
                for (i, a) in acts.iter().enumerate() {
                    // SAFETY: `d` and `dsum` are 8 f32 each.
                    let (ad, asum) = unsafe {
                        (
                            _mm256_loadu_ps(a.d.as_ptr()),
                            _mm256_loadu_ps(a.dsum.as_ptr()),
                        )
                    };
                    let mut q = [[0i32; 8]; R];
                    let mut sc = [_mm256_setzero_ps(); R];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let b = unsafe { w[r].get_unchecked(i) };
                        // SAFETY: `q[r]` is 32 bytes.
                        unsafe { _mm256_storeu_si256(q[r].as_mut_ptr() as *mut __m256i, codes(b)) };
                        let d = scale(b);
                        sc[r] = _mm256_mul_ps(_mm256_set1_ps(d), ad);
                        if CORR {
                            c[r] = _mm256_fmadd_ps(_mm256_set1_ps(corr(b, d)), asum, c[r]);
                        }
                    }
                    let isum = if SIGNED {
                        let mut isum = [_mm256_setzero_si256(); R];
                        for (m, qs) in a.qs.iter().enumerate() {
                            // SAFETY: `qs` is 32 bytes.
                            let av = unsafe { load32(qs.as_ptr() as *const u8) };
                            for r in 0..R {
                                // Codes 4 m .. 4 m + 4 of the block, in every lane.
                                let wq = _mm256_set1_epi32(q[r][m]);
                                isum[r] = dot_codes::<SIGNED>(isum[r], wq, av);
                            }
                        }
                        isum
                    } else {
                        unsigned_sums::<R>(&|r, m| q[r][m], a)
                    };
                    for r in 0..R {
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), sc[r], acc[r]);
                    }
                }
                std::array::from_fn(|r| {
                    if CORR {
                        _mm256_add_ps(acc[r], c[r])
                    } else {
                        acc[r]
                    }
                })
            }

            /// `R` (at most 4) rows against one token's blocks `acts` (scales `ad`, scaled
            /// code sums `asum`): one result a row.
            #[target_feature(enable = $feat)]
            #[inline]
            #[allow(clippy::too_many_arguments)]
            fn token<B, const R: usize, const SIGNED: bool, const CORR: bool>(
                w: [&[B]; R],
                (acts, ad, asum, pairs): TokenActs<'_>,
                codes: impl Fn(&B) -> __m256i,
                scale: impl Fn(&B) -> f32,
                corr: impl Fn(&B, f32) -> f32,
                scales4: impl Fn([&B; 4]) -> __m256,
            ) -> [f32; R] {
                assert!(R <= 4 && w.iter().all(|w| w.len() == acts.len()));
                assert!(ad.len() == acts.len() && asum.len() == acts.len());
                assert!(pairs.len() == acts.len() / 2);
                let mut acc = _mm_setzero_ps();
                let mut c = _mm_setzero_ps();
                let mut first = 0;
                if R == 2 {
                    // Two rows: two blocks a step share one reduction, lanes (row 0, row 1)
                    // of block i then of block i + 1, each block's f32 step in turn. With
                    // a correction its f32 steps share the lanes: (row 0's sum, row 0's
                    // correction, row 1's sum, row 1's correction), so one pair of fused
                    // multiply-adds serves both.
                    // The integer half of a step (blocks i and i + 1): the four block-rows'
                    // sums as f32 and their scales (and corrections).
                    let sums = |i: usize| {
                        let mut p = [_mm256_setzero_si256(); 4];
                        // SAFETY: every row has `acts.len()` blocks (asserted above), and
                        // `i + 1` indexes `acts`. (`R - 1`: this branch runs only with R = 2;
                        // the bound keeps the R = 1 instantiation's index in range.)
                        let bs = unsafe {
                            let (w0, w1) = (w[0], w[R - 1]);
                            [
                                w0.get_unchecked(i),
                                w1.get_unchecked(i),
                                w0.get_unchecked(i + 1),
                                w1.get_unchecked(i + 1),
                            ]
                        };
                        for k in 0..2 {
                            // SAFETY: `i + k` indexes `acts`; `qs` is 32 bytes.
                            let av = unsafe {
                                load32(acts.get_unchecked(i + k).qs.as_ptr() as *const u8)
                            };
                            for r in 0..2 {
                                let q = codes(bs[2 * k + r]);
                                p[2 * k + r] = dot_codes::<SIGNED>(p[2 * k + r], q, av);
                            }
                        }
                        (_mm_cvtepi32_ps(reduce4(p)), scales4(bs))
                    };
                    // The f32 half, in block order.
                    let step = |i: usize, (x, dc): (__m128, __m256), acc: __m128| {
                        // SAFETY: `i / 2` indexes `pairs` (asserted above).
                        let pa = unsafe { pairs.get_unchecked(i / 2) };
                        if CORR {
                            // (d * a, corr * 1) and (sum, dsum): the same products as the
                            // separate steps below (the correction's operands swapped).
                            // SAFETY: both arrays are 32-byte aligned in `PairActs`.
                            let (da, s) = unsafe {
                                (
                                    _mm256_load_ps(pa.d_one.as_ptr()),
                                    _mm_load_ps(pa.dsum.as_ptr()),
                                )
                            };
                            let sc = _mm256_mul_ps(dc, da);
                            let acc =
                                _mm_fmadd_ps(_mm_unpacklo_ps(x, s), _mm256_castps256_ps128(sc), acc);
                            _mm_fmadd_ps(
                                _mm_unpackhi_ps(x, s),
                                _mm256_extractf128_ps::<1>(sc),
                                acc,
                            )
                        } else {
                            // SAFETY: 16-byte aligned in `PairActs`.
                            let a = unsafe { _mm_load_ps(pa.d.as_ptr()) };
                            let sc = _mm_mul_ps(_mm256_castps256_ps128(dc), a);
                            let acc = _mm_fmadd_ps(x, sc, acc);
                            _mm_fmadd_ps(_mm_movehl_ps(x, x), _mm_movehl_ps(sc, sc), acc)
                        }
                    };
                    // Two steps' integer halves before their f32 halves: more independent
                    // work in flight than one step's long chain of dependent instructions.
                    while first + 6 <= acts.len() {
                        let (a, b, c) = (sums(first), sums(first + 2), sums(first + 4));
                        acc = step(first + 4, c, step(first + 2, b, step(first, a, acc)));
                        first += 6;
                    }
                    while first + 4 <= acts.len() {
                        let (a, b) = (sums(first), sums(first + 2));
                        acc = step(first + 2, b, step(first, a, acc));
                        first += 4;
                    }
                    if first + 2 <= acts.len() {
                        acc = step(first, sums(first), acc);
                        first += 2;
                    }
                    if CORR {
                        // Back to (row 0, row 1) lanes of sums and of corrections.
                        c = _mm_shuffle_ps::<0b11_01_11_01>(acc, acc);
                        acc = _mm_shuffle_ps::<0b10_00_10_00>(acc, acc);
                    }
                }
                for (i, a) in acts.iter().enumerate().skip(first) {
                    // SAFETY: `qs` is 32 bytes.
                    let av = unsafe { load32(a.qs.as_ptr() as *const u8) };
                    let mut p = [_mm256_setzero_si256(); 4];
                    let mut d = [0f32; 4];
                    let mut cr = [0f32; 4];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let b = unsafe { w[r].get_unchecked(i) };
                        let q = codes(b);
                        p[r] = dot_codes::<SIGNED>(p[r], q, av);
                        d[r] = scale(b);
                        if CORR {
                            cr[r] = corr(b, d[r]);
                        }
                    }
                    // From registers: a vector load of four scalar stores would stall on
                    // store forwarding every block.
                    let dv = _mm_setr_ps(d[0], d[1], d[2], d[3]);
                    // SAFETY: `i` indexes `acts`, and `ad`, `asum` are as long (asserted).
                    let (a_d, a_sum) = unsafe { (*ad.get_unchecked(i), *asum.get_unchecked(i)) };
                    let sc = _mm_mul_ps(dv, _mm_set1_ps(a_d));
                    acc = _mm_fmadd_ps(_mm_cvtepi32_ps(reduce_rows::<R>(p)), sc, acc);
                    if CORR {
                        let cv = _mm_setr_ps(cr[0], cr[1], cr[2], cr[3]);
                        c = _mm_fmadd_ps(cv, _mm_set1_ps(a_sum), c);
                    }
                }
                lanes(if CORR { _mm_add_ps(acc, c) } else { acc })
            }

            /// Generates the row-range driver of one format.
            macro_rules! driver {
                ($name:ident, $B:ty, $signed:literal, $corr:literal, $codes:expr, $cf:expr, $s4:expr) => {
                    #[target_feature(enable = $feat)]
                    pub(in super::super) fn $name(
                        bytes: &[u8],
                        row_bytes: usize,
                        rows: Range<usize>,
                        input: &Q8Input,
                        tokens: Range<usize>,
                        out: &mut [f32],
                        stride: usize,
                    ) {
                        let scale = |b: &$B| h2f(b.d);
                        let codes = $codes;
                        let corr = $cf;
                        let scales4 = $s4;
                        drive::<$B>(
                            bytes,
                            row_bytes,
                            rows,
                            input,
                            tokens,
                            out,
                            stride,
                            |b: &$B, into: &mut DecodedRow| {
                                let d = scale(b);
                                // SAFETY: `codes` gives 32 bytes, eight i32 lanes.
                                into.codes.push(unsafe {
                                    std::mem::transmute::<__m256i, [i32; 8]>(codes(b))
                                });
                                into.d.push(d);
                                into.corr.push(corr(b, d));
                            },
                            |w: [&DecodedRow; 2], acts: &[Acts8]| {
                                group::<2, $signed, $corr>(w, acts)
                            },
                            |w: [&DecodedRow; 1], acts: &[Acts8]| {
                                group::<1, $signed, $corr>(w, acts)
                            },
                            |w: [&[$B]; 2], acts: &[Acts8]| {
                                group_blocks::<$B, 2, $signed, $corr>(w, acts, codes, scale, corr)
                            },
                            |w: [&[$B]; TOKEN_ROWS], t: TokenActs<'_>| {
                                token::<$B, TOKEN_ROWS, $signed, $corr>(
                                    w, t, codes, scale, corr, scales4,
                                )
                            },
                            |w: [&[$B]; 1], t: TokenActs<'_>| {
                                token::<$B, 1, $signed, $corr>(
                                    w, t, codes, scale, corr, scales4,
                                )
                            },
                        )
                    }
                };
            }

            driver!(
                rows_q8_0,
                BlockQ8_0,
                true,
                false,
                // SAFETY: `qs` is 32 bytes.
                |b: &BlockQ8_0| unsafe { load32(b.qs.as_ptr() as *const u8) },
                |_: &BlockQ8_0, _: f32| 0.0,
                |b: [&BlockQ8_0; 4]| _mm256_castps128_ps256(h2f4(b.map(|b| b.d)))
            );
            driver!(
                rows_q4_0,
                BlockQ4_0,
                false,
                true,
                |b: &BlockQ4_0| nibbles16(&b.qs),
                |_: &BlockQ4_0, d: f32| -8.0 * d,
                |b: [&BlockQ4_0; 4]| scale_pairs(b.map(|b| b.d), -8.0)
            );
            driver!(
                rows_q5_0,
                BlockQ5_0,
                false,
                true,
                |b: &BlockQ5_0| codes5(b),
                |_: &BlockQ5_0, d: f32| -16.0 * d,
                |b: [&BlockQ5_0; 4]| scale_pairs(b.map(|b| b.d), -16.0)
            );
            driver!(
                rows_q4_1,
                BlockQ4_1,
                false,
                true,
                |b: &BlockQ4_1| nibbles16(&b.qs),
                |b: &BlockQ4_1, _: f32| h2f(b.m),
                |b: [&BlockQ4_1; 4]| h2f4_pairs(b.map(|b| [b.d, b.m]))
            );

            /// The driver shared by every format: eight-token groups where two or more of a
            /// group's tokens are wanted, one-token passes for the rest.
            #[target_feature(enable = $feat)]
            #[inline]
            #[allow(clippy::too_many_arguments)]
            fn drive<B>(
                bytes: &[u8],
                row_bytes: usize,
                rows: Range<usize>,
                input: &Q8Input,
                tokens: Range<usize>,
                out: &mut [f32],
                stride: usize,
                decode: impl Fn(&B, &mut DecodedRow),
                group2: impl Fn([&DecodedRow; 2], &[Acts8]) -> [__m256; 2],
                group1: impl Fn([&DecodedRow; 1], &[Acts8]) -> [__m256; 1],
                group2_blocks: impl Fn([&[B]; 2], &[Acts8]) -> [__m256; 2],
                token_rows: impl Fn([&[B]; TOKEN_ROWS], TokenActs<'_>) -> [f32; TOKEN_ROWS],
                token1: impl Fn([&[B]; 1], TokenActs<'_>) -> [f32; 1],
            ) where
                B: super::super::QuantBlock,
            {
                if tokens.is_empty() || rows.is_empty() {
                    return;
                }
                let per_row = input.blocks_per_token();
                let blocks = |r: usize| row_blocks::<B>(bytes, row_bytes, r, per_row);
                let spans = spans(&tokens);
                drive_groups(
                    (bytes, row_bytes, rows.clone()),
                    blocks,
                    (&spans, &tokens),
                    (&mut *out, stride),
                    |g0| input.group_of(g0),
                    decode,
                    group2,
                    group1,
                    group2_blocks,
                );
                // Single tokens: `TOKEN_ROWS` rows a pass.
                for (g0, lanes) in spans.iter().filter(|s| s.1.len() == 1) {
                    let t = g0 + lanes.start;
                    let col = (&mut *out, stride, t - tokens.start);
                    let (blocks8, d, dsum) = input.q8_0_token(t);
                    let acts: TokenActs<'_> = (blocks8, d, dsum, input.q8_0_pairs(t));
                    token_column!(
                        TOKEN_ROWS,
                        (bytes, row_bytes, rows.clone()),
                        blocks,
                        acts,
                        col,
                        token_rows,
                        token1
                    );
                }
            }
        }
    };
}

for_each_dot_form!(kernels);
