//! x86 kernels of Q4_K and Q6_K, in the two shapes of [`super::x86_b32`]: eight tokens a
//! lane (activations interleaved four codes a token, [`Acts8K`]) for more than one token,
//! a row a lane for one token.
//!
//! Per (row, token) both do exactly this, super-block by super-block in order: the
//! integer sum `Σ_g scale_g · Σ_{i∈g} q_i a_i` (exact), the integer correction
//! (`Σ_g min_g · Σ_{i∈g} a_i` for Q4_K, `32 · Σ_g scale_g · Σ_{i∈g} a_i` for Q6_K's offset
//! codes), then `acc = fma(f32(sum), d_w * d_a, acc)` and `c = fma(f32(corr), d'_w * d_a,
//! c)` (`d'` is Q4_K's `dmin`, Q6_K's `d`), and the result `acc - c`. So a token's result
//! has the same bits in either shape and any batch, and the AVX2 and VNNI byte dots (the
//! same products, summed exactly) agree too.

use std::arch::x86_64::*;
use std::ops::Range;

use super::fast::{row_blocks, Acts8K, Q8Input};
use super::k_common::unpack_scales_mins;
use super::x86::{
    drive_groups, for_each_dot_form, h2f, lanes, load32, prefetch_ahead, token_column, Decoded,
    PREFETCH_AHEAD,
};
use super::x86_b32::reduce_rows;
use super::{BlockQ4K, BlockQ6K, BlockQ8K, QuantBlock};

/// Rows a one-token pass takes together: one, so a row's decoded codes and sums stay in
/// registers (two rows measured slower here, unlike the 32-value formats).
const TOKEN_ROWS: usize = 1;

/// A super-block's 256 codes, decoded: `[sub-run of 32][four-code run]` as i32 words, so a
/// run broadcasts from memory.
type Codes = [[i32; 8]; 8];

/// Q4_K's 256 unsigned 4-bit codes in element order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn codes_q4_k(b: &BlockQ4K, q: &mut Codes) {
    let m4 = _mm256_set1_epi8(0x0f);
    for c in 0..4 {
        // SAFETY: `qs` has 128 bytes; `q` rows are 32 bytes.
        unsafe {
            let v = load32(b.qs.as_ptr().add(32 * c));
            _mm256_storeu_si256(
                q[2 * c].as_mut_ptr() as *mut __m256i,
                _mm256_and_si256(v, m4),
            );
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            _mm256_storeu_si256(q[2 * c + 1].as_mut_ptr() as *mut __m256i, hi);
        }
    }
}

/// Q6_K's 256 codes plus 32 (unsigned, below 64) in element order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn codes_q6_k(b: &BlockQ6K) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let mut u = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        // SAFETY: `ql` has 128 bytes, `qh` 64: offsets stay inside.
        let (ql0, ql1, qh) = unsafe {
            (
                load32(b.ql.as_ptr().add(64 * h)),
                load32(b.ql.as_ptr().add(64 * h + 32)),
                load32(b.qh.as_ptr().add(32 * h)),
            )
        };
        u[4 * h] = _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
        );
        u[4 * h + 1] = _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
        );
        u[4 * h + 2] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
            _mm256_and_si256(qh, m30),
        );
        u[4 * h + 3] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
        );
    }
    u
}

/// `Σ u[i] * s[i] * f` in eight i32 lanes (four products a lane) for codes `u` below 64:
/// one scale for all 32, through `maddubs` and a `madd` by the scale, which stays inside
/// i16 (2 * 63 * 127) and needs no 32-bit multiply. The one-token kernels use it in every
/// form: the same exact sums as the byte dot and a multiply.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn scaled(u: __m256i, s: __m256i, f: i16) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(f))
}

/// The exact sums of each row's products `p` and corrections `m` (eight-lane partials), one
/// row a lane. One row reduces both in one pass (`[Σp, Σm, ..]`, then `Σm` moved to lane 0).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn sums_and_corrections<const R: usize>(p: [__m256i; 4], m: [__m256i; 4]) -> (__m128i, __m128i) {
    if R == 1 {
        let z = _mm256_setzero_si256();
        let j = reduce_rows::<2>([p[0], m[0], z, z]);
        return (j, _mm_shuffle_epi32::<0b01_01_01_01>(j));
    }
    (reduce_rows::<R>(p), reduce_rows::<R>(m))
}

/// A Q8_K block's 16 group sums as one vector of i16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bsums(a: &BlockQ8K) -> __m256i {
    // SAFETY: `bsums` is 16 i16, 32 bytes.
    unsafe { load32(a.bsums.as_ptr() as *const u8) }
}

/// A weight row's super-blocks decoded once for every activation group that passes over
/// it: codes, each group's scale, the correction's factors as [`pair_word`]s (Q4_K's
/// minimums, Q6_K's scales), `d` and (Q4_K) `dmin`.
#[derive(Default)]
struct DecodedK {
    codes: Vec<Codes>,
    scales: Vec<[i32; 16]>,
    pairs: Vec<[i32; 8]>,
    d: Vec<f32>,
    dmin: Vec<f32>,
}

impl Decoded for DecodedK {
    fn clear(&mut self) {
        self.codes.clear();
        self.scales.clear();
        self.pairs.clear();
        self.d.clear();
        self.dmin.clear();
    }
}

impl DecodedK {
    fn blocks(&self) -> usize {
        self.codes.len()
    }
}

/// Two i16 factors in one 32-bit word, for `madd` against interleaved group sums.
fn pair_word(a: i32, b: i32) -> i32 {
    (a & 0xffff) | (b << 16)
}

/// [`pair_word`] in every 32-bit lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn pair16(a: i32, b: i32) -> __m256i {
    _mm256_set1_epi32(pair_word(a, b))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn decode_q4_k(b: &BlockQ4K, into: &mut DecodedK) {
    let mut q = [[0i32; 8]; 8];
    codes_q4_k(b, &mut q);
    let (sc, mn) = unpack_scales_mins(&b.scales);
    into.codes.push(q);
    into.scales.push(std::array::from_fn(|j| {
        if j < 8 {
            i32::from(sc[j])
        } else {
            0
        }
    }));
    into.pairs.push(std::array::from_fn(|p| {
        if p < 4 {
            pair_word(i32::from(mn[2 * p]), i32::from(mn[2 * p + 1]))
        } else {
            0
        }
    }));
    into.d.push(h2f(b.d));
    into.dmin.push(h2f(b.dmin));
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn decode_q6_k(b: &BlockQ6K, into: &mut DecodedK) {
    let mut q = [[0i32; 8]; 8];
    for (k, u) in codes_q6_k(b).into_iter().enumerate() {
        // SAFETY: `q[k]` is 32 bytes.
        unsafe { _mm256_storeu_si256(q[k].as_mut_ptr() as *mut __m256i, u) };
    }
    into.codes.push(q);
    into.scales
        .push(std::array::from_fn(|g| i32::from(b.scales[g])));
    into.pairs.push(std::array::from_fn(|p| {
        pair_word(i32::from(b.scales[2 * p]), i32::from(b.scales[2 * p + 1]))
    }));
    into.d.push(h2f(b.d));
    into.dmin.push(0.0);
}

/// Generates one form's Q4_K / Q6_K kernels ([`for_each_dot_form`]), on that form's byte
/// dots ([`super::x86::dots`]).
macro_rules! kernels {
    ($m:ident, $feat:literal, $_feat32:literal, $($_dots:tt)*) => {
        pub(super) mod $m {
            use super::super::x86::dots::$m::{dot, dot4};
            use super::*;

            /// `R` decoded rows of Q4_K against one group of eight tokens.
            #[target_feature(enable = $feat)]
            #[inline]
            fn group_q4_k<const R: usize>(w: [&DecodedK; R], acts: &[Acts8K]) -> [__m256; R] {
                assert!(w.iter().all(|w| w.blocks() == acts.len()));
                let mut acc = [_mm256_setzero_ps(); R];
                let mut c = [_mm256_setzero_ps(); R];
                for (i, a) in acts.iter().enumerate() {
                    // SAFETY: `d` is 8 f32.
                    let ad = unsafe { _mm256_loadu_ps(a.d.as_ptr()) };
                    let mut msum = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let pairs = unsafe { w[r].pairs.get_unchecked(i) };
                        for p in 0..4 {
                            // SAFETY: `bsum32[p]` is 32 bytes.
                            let bs = unsafe { load32(a.bsum32[p].as_ptr() as *const u8) };
                            let f = _mm256_set1_epi32(pairs[p]);
                            msum[r] = _mm256_add_epi32(msum[r], _mm256_madd_epi16(bs, f));
                        }
                    }
                    let mut isum = [_mm256_setzero_si256(); R];
                    for j in 0..8 {
                        let mut s = [_mm256_setzero_si256(); R];
                        for h in 0..2 {
                            // SAFETY: `qs[8 j + 4 h + k]` is 32 bytes.
                            let av: [__m256i; 4] = std::array::from_fn(|k| unsafe {
                                load32(a.qs[8 * j + 4 * h + k].as_ptr() as *const u8)
                            });
                            for r in 0..R {
                                // SAFETY: as above.
                                let q = unsafe { &w[r].codes.get_unchecked(i)[j] };
                                let u = std::array::from_fn(|k| _mm256_set1_epi32(q[4 * h + k]));
                                s[r] = dot4(s[r], u, av);
                            }
                        }
                        for r in 0..R {
                            // SAFETY: as above.
                            let f = _mm256_set1_epi32(unsafe { w[r].scales.get_unchecked(i)[j] });
                            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s[r], f));
                        }
                    }
                    for r in 0..R {
                        let (d, dmin) = (&w[r].d, &w[r].dmin);
                        // SAFETY: as above.
                        let (d, dmin) = unsafe { (*d.get_unchecked(i), *dmin.get_unchecked(i)) };
                        let dd = _mm256_mul_ps(_mm256_set1_ps(d), ad);
                        let dm = _mm256_mul_ps(_mm256_set1_ps(dmin), ad);
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), dd, acc[r]);
                        c[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[r]), dm, c[r]);
                    }
                }
                std::array::from_fn(|r| _mm256_sub_ps(acc[r], c[r]))
            }

            /// [`group_q4_k`] decoding each super-block as it goes (tiles of few groups).
            #[target_feature(enable = $feat)]
            #[inline]
            fn group_q4_k_blocks<const R: usize>(
                w: [&[BlockQ4K]; R],
                acts: &[Acts8K],
            ) -> [__m256; R] {
                assert!(w.iter().all(|w| w.len() == acts.len()));
                let mut acc = [_mm256_setzero_ps(); R];
                let mut c = [_mm256_setzero_ps(); R];
                let mut q = [[[0i32; 8]; 8]; R];
                for (i, a) in acts.iter().enumerate() {
                    // SAFETY: `d` is 8 f32.
                    let ad = unsafe { _mm256_loadu_ps(a.d.as_ptr()) };
                    let mut sc = [[0u8; 8]; R];
                    let mut msum = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let b = unsafe { w[r].get_unchecked(i) };
                        codes_q4_k(b, &mut q[r]);
                        let (s, mn) = unpack_scales_mins(&b.scales);
                        sc[r] = s;
                        for p in 0..4 {
                            // SAFETY: `bsum32[p]` is 32 bytes.
                            let bs = unsafe { load32(a.bsum32[p].as_ptr() as *const u8) };
                            let f = pair16(i32::from(mn[2 * p]), i32::from(mn[2 * p + 1]));
                            msum[r] = _mm256_add_epi32(msum[r], _mm256_madd_epi16(bs, f));
                        }
                    }
                    let mut isum = [_mm256_setzero_si256(); R];
                    for j in 0..8 {
                        let mut s = [_mm256_setzero_si256(); R];
                        for h in 0..2 {
                            // SAFETY: `qs[8 j + 4 h + k]` is 32 bytes.
                            let av: [__m256i; 4] = std::array::from_fn(|k| unsafe {
                                load32(a.qs[8 * j + 4 * h + k].as_ptr() as *const u8)
                            });
                            for r in 0..R {
                                let u =
                                    std::array::from_fn(|k| _mm256_set1_epi32(q[r][j][4 * h + k]));
                                s[r] = dot4(s[r], u, av);
                            }
                        }
                        for r in 0..R {
                            let f = _mm256_set1_epi32(i32::from(sc[r][j]));
                            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s[r], f));
                        }
                    }
                    for r in 0..R {
                        // SAFETY: as above.
                        let b = unsafe { w[r].get_unchecked(i) };
                        let dd = _mm256_mul_ps(_mm256_set1_ps(h2f(b.d)), ad);
                        let dm = _mm256_mul_ps(_mm256_set1_ps(h2f(b.dmin)), ad);
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), dd, acc[r]);
                        c[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[r]), dm, c[r]);
                    }
                }
                std::array::from_fn(|r| _mm256_sub_ps(acc[r], c[r]))
            }

            /// `R` (at most 4) rows of Q4_K against one token's blocks.
            #[target_feature(enable = $feat)]
            #[inline]
            fn token_q4_k<const R: usize>(w: [&[BlockQ4K]; R], acts: &[BlockQ8K]) -> [f32; R] {
                assert!(R <= 4 && w.iter().all(|w| w.len() == acts.len()));
                let m4 = _mm256_set1_epi8(0x0f);
                let (mut acc, mut c) = (_mm_setzero_ps(), _mm_setzero_ps());
                for (i, a) in acts.iter().enumerate() {
                    let mut p = [_mm256_setzero_si256(); 4];
                    let (mut d, mut dmin) = ([0f32; 4], [0f32; 4]);
                    let mut msum = [_mm256_setzero_si256(); 4];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let b = unsafe { w[r].get_unchecked(i) };
                        let (sc, mn) = unpack_scales_mins(&b.scales);
                        for k in 0..4 {
                            // SAFETY: `qs` has 128 bytes, an activation block 256 codes.
                            let (v, a0, a1) = unsafe {
                                let x = a.qs.as_ptr() as *const u8;
                                (
                                    load32(b.qs.as_ptr().add(32 * k)),
                                    load32(x.add(64 * k)),
                                    load32(x.add(64 * k + 32)),
                                )
                            };
                            let lo = _mm256_and_si256(v, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                            p[r] = _mm256_add_epi32(p[r], scaled(lo, a0, sc[2 * k].into()));
                            p[r] = _mm256_add_epi32(p[r], scaled(hi, a1, sc[2 * k + 1].into()));
                        }
                        // Σ_g min_{g/2} · bsum_g: the 16 group sums against each minimum
                        // twice, eight lanes to reduce with the products.
                        let m8 = _mm_set1_epi64x(i64::from_le_bytes(mn));
                        let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
                        msum[r] = _mm256_madd_epi16(bsums(a), m16);
                        (d[r], dmin[r]) = (h2f(b.d), h2f(b.dmin));
                    }
                    let ad = _mm_set1_ps(a.d);
                    // From registers (a vector load of scalar stores stalls on forwarding).
                    let dv = _mm_setr_ps(d[0], d[1], d[2], d[3]);
                    let mv = _mm_setr_ps(dmin[0], dmin[1], dmin[2], dmin[3]);
                    let (ps, ms) = sums_and_corrections::<R>(p, msum);
                    acc = _mm_fmadd_ps(_mm_cvtepi32_ps(ps), _mm_mul_ps(dv, ad), acc);
                    c = _mm_fmadd_ps(_mm_cvtepi32_ps(ms), _mm_mul_ps(mv, ad), c);
                }
                lanes(_mm_sub_ps(acc, c))
            }

            /// `R` decoded rows of Q6_K against one group of eight tokens.
            #[target_feature(enable = $feat)]
            #[inline]
            fn group_q6_k<const R: usize>(w: [&DecodedK; R], acts: &[Acts8K]) -> [__m256; R] {
                assert!(w.iter().all(|w| w.blocks() == acts.len()));
                let mut acc = [_mm256_setzero_ps(); R];
                let mut c = [_mm256_setzero_ps(); R];
                for (i, a) in acts.iter().enumerate() {
                    // SAFETY: `d` is 8 f32.
                    let ad = unsafe { _mm256_loadu_ps(a.d.as_ptr()) };
                    let mut osum = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let pairs = unsafe { w[r].pairs.get_unchecked(i) };
                        for p in 0..8 {
                            // SAFETY: `bsum16[p]` is 32 bytes.
                            let bs = unsafe { load32(a.bsum16[p].as_ptr() as *const u8) };
                            let f = _mm256_set1_epi32(pairs[p]);
                            osum[r] = _mm256_add_epi32(osum[r], _mm256_madd_epi16(bs, f));
                        }
                    }
                    let mut isum = [_mm256_setzero_si256(); R];
                    for g in 0..16 {
                        let mut s = [_mm256_setzero_si256(); R];
                        for m in 0..4 {
                            let run = 4 * g + m;
                            // SAFETY: `qs[run]` is 32 bytes.
                            let av = unsafe { load32(a.qs[run].as_ptr() as *const u8) };
                            for r in 0..R {
                                // SAFETY: as above.
                                let q = unsafe { w[r].codes.get_unchecked(i)[run / 8][run % 8] };
                                s[r] = dot(s[r], _mm256_set1_epi32(q), av);
                            }
                        }
                        for r in 0..R {
                            // SAFETY: as above.
                            let f = _mm256_set1_epi32(unsafe { w[r].scales.get_unchecked(i)[g] });
                            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s[r], f));
                        }
                    }
                    for r in 0..R {
                        // SAFETY: as above.
                        let d = unsafe { *w[r].d.get_unchecked(i) };
                        let dd = _mm256_mul_ps(_mm256_set1_ps(d), ad);
                        let o = _mm256_slli_epi32::<5>(osum[r]);
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), dd, acc[r]);
                        c[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(o), dd, c[r]);
                    }
                }
                std::array::from_fn(|r| _mm256_sub_ps(acc[r], c[r]))
            }

            /// [`group_q6_k`] decoding each super-block as it goes (tiles of few groups).
            #[target_feature(enable = $feat)]
            #[inline]
            fn group_q6_k_blocks<const R: usize>(
                w: [&[BlockQ6K]; R],
                acts: &[Acts8K],
            ) -> [__m256; R] {
                assert!(w.iter().all(|w| w.len() == acts.len()));
                let mut acc = [_mm256_setzero_ps(); R];
                let mut c = [_mm256_setzero_ps(); R];
                let mut q = [[[0i32; 8]; 8]; R];
                for (i, a) in acts.iter().enumerate() {
                    // SAFETY: `d` is 8 f32.
                    let ad = unsafe { _mm256_loadu_ps(a.d.as_ptr()) };
                    let mut osum = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let b = unsafe { w[r].get_unchecked(i) };
                        for (k, u) in codes_q6_k(b).into_iter().enumerate() {
                            // SAFETY: `q[r][k]` is 32 bytes.
                            unsafe { _mm256_storeu_si256(q[r][k].as_mut_ptr() as *mut __m256i, u) };
                        }
                        for p in 0..8 {
                            // SAFETY: `bsum16[p]` is 32 bytes.
                            let bs = unsafe { load32(a.bsum16[p].as_ptr() as *const u8) };
                            let f =
                                pair16(i32::from(b.scales[2 * p]), i32::from(b.scales[2 * p + 1]));
                            osum[r] = _mm256_add_epi32(osum[r], _mm256_madd_epi16(bs, f));
                        }
                    }
                    let mut isum = [_mm256_setzero_si256(); R];
                    for g in 0..16 {
                        let mut s = [_mm256_setzero_si256(); R];
                        for m in 0..4 {
                            let run = 4 * g + m;
                            // SAFETY: `qs[run]` is 32 bytes.
                            let av = unsafe { load32(a.qs[run].as_ptr() as *const u8) };
                            for r in 0..R {
                                s[r] = dot(s[r], _mm256_set1_epi32(q[r][run / 8][run % 8]), av);
                            }
                        }
                        for r in 0..R {
                            // SAFETY: as above.
                            let b = unsafe { w[r].get_unchecked(i) };
                            let f = _mm256_set1_epi32(i32::from(b.scales[g]));
                            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s[r], f));
                        }
                    }
                    for r in 0..R {
                        // SAFETY: as above.
                        let b = unsafe { w[r].get_unchecked(i) };
                        let dd = _mm256_mul_ps(_mm256_set1_ps(h2f(b.d)), ad);
                        let o = _mm256_slli_epi32::<5>(osum[r]);
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), dd, acc[r]);
                        c[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(o), dd, c[r]);
                    }
                }
                std::array::from_fn(|r| _mm256_sub_ps(acc[r], c[r]))
            }

            /// `R` (at most 4) rows of Q6_K against one token's blocks.
            #[target_feature(enable = $feat)]
            #[inline]
            fn token_q6_k<const R: usize>(w: [&[BlockQ6K]; R], acts: &[BlockQ8K]) -> [f32; R] {
                assert!(R <= 4 && w.iter().all(|w| w.len() == acts.len()));
                let (mut acc, mut c) = (_mm_setzero_ps(), _mm_setzero_ps());
                for (i, a) in acts.iter().enumerate() {
                    let mut p = [_mm256_setzero_si256(); 4];
                    let mut d = [0f32; 4];
                    let mut osum = [_mm256_setzero_si256(); 4];
                    for r in 0..R {
                        // SAFETY: every row has `acts.len()` blocks (asserted above).
                        let b = unsafe { w[r].get_unchecked(i) };
                        for (k, u) in codes_q6_k(b).into_iter().enumerate() {
                            // SAFETY: an activation block has 256 codes.
                            let av = unsafe { load32((a.qs.as_ptr() as *const u8).add(32 * k)) };
                            // Bytes 0-15 belong to group 2 k, bytes 16-31 to group 2 k + 1.
                            let f = _mm256_set_m128i(
                                _mm_set1_epi16(i16::from(b.scales[2 * k + 1])),
                                _mm_set1_epi16(i16::from(b.scales[2 * k])),
                            );
                            let s = _mm256_madd_epi16(_mm256_maddubs_epi16(u, av), f);
                            p[r] = _mm256_add_epi32(p[r], s);
                        }
                        // Σ_g scale_g · bsum_g in eight lanes, reduced with the products.
                        // SAFETY: `scales` is 16 bytes.
                        let sc = unsafe { _mm_loadu_si128(b.scales.as_ptr() as *const __m128i) };
                        osum[r] = _mm256_madd_epi16(bsums(a), _mm256_cvtepi8_epi16(sc));
                        d[r] = h2f(b.d);
                    }
                    // From registers (a vector load of scalar stores stalls on forwarding).
                    let dv = _mm_setr_ps(d[0], d[1], d[2], d[3]);
                    let (ps, os) = sums_and_corrections::<R>(p, osum);
                    let os = _mm_slli_epi32::<5>(os);
                    let dd = _mm_mul_ps(dv, _mm_set1_ps(a.d));
                    acc = _mm_fmadd_ps(_mm_cvtepi32_ps(ps), dd, acc);
                    c = _mm_fmadd_ps(_mm_cvtepi32_ps(os), dd, c);
                }
                lanes(_mm_sub_ps(acc, c))
            }

            /// Generates a format's row-range driver.
            macro_rules! driver {
                ($name:ident, $B:ty, $decode:ident, $group:ident, $blocks:ident, $token:ident) => {
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
                        super::drive::<$B>(
                            bytes,
                            row_bytes,
                            rows,
                            input,
                            tokens,
                            out,
                            stride,
                            |b: &$B, into: &mut DecodedK| $decode(b, into),
                            |w: [&DecodedK; 2], a: &[Acts8K]| $group::<2>(w, a),
                            |w: [&DecodedK; 1], a: &[Acts8K]| $group::<1>(w, a),
                            |w: [&[$B]; 2], a: &[Acts8K]| $blocks::<2>(w, a),
                            |w: [&[$B]; TOKEN_ROWS], a: &[BlockQ8K]| $token::<TOKEN_ROWS>(w, a),
                            |w: [&[$B]; 1], a: &[BlockQ8K]| $token::<1>(w, a),
                        )
                    }
                };
            }

            driver!(
                rows_q4_k,
                BlockQ4K,
                decode_q4_k,
                group_q4_k,
                group_q4_k_blocks,
                token_q4_k
            );
            driver!(
                rows_q6_k,
                BlockQ6K,
                decode_q6_k,
                group_q6_k,
                group_q6_k_blocks,
                token_q6_k
            );
        }
    };
}

/// The driver shared by both formats and every form of the dot: eight-token groups where
/// two or more of a group's tokens are wanted (two rows at a time, decoded once for every
/// group of the tile), [`TOKEN_ROWS`]-row passes for single tokens.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn drive<B: QuantBlock>(
    bytes: &[u8],
    row_bytes: usize,
    rows: Range<usize>,
    input: &Q8Input,
    tokens: Range<usize>,
    out: &mut [f32],
    stride: usize,
    decode: impl Fn(&B, &mut DecodedK),
    group2: impl Fn([&DecodedK; 2], &[Acts8K]) -> [__m256; 2],
    group1: impl Fn([&DecodedK; 1], &[Acts8K]) -> [__m256; 1],
    group2_blocks: impl Fn([&[B]; 2], &[Acts8K]) -> [__m256; 2],
    token_rows: impl Fn([&[B]; TOKEN_ROWS], &[BlockQ8K]) -> [f32; TOKEN_ROWS],
    token1: impl Fn([&[B]; 1], &[BlockQ8K]) -> [f32; 1],
) {
    if tokens.is_empty() || rows.is_empty() {
        return;
    }
    let per_row = input.blocks_per_token();
    let blocks = |r: usize| row_blocks::<B>(bytes, row_bytes, r, per_row);
    let spans = super::x86_b32::spans(&tokens);
    drive_groups(
        (bytes, row_bytes, rows.clone()),
        blocks,
        (&spans, &tokens),
        (&mut *out, stride),
        |g0| input.group_k_of(g0),
        decode,
        group2,
        group1,
        group2_blocks,
    );
    for (g0, lanes) in spans.iter().filter(|s| s.1.len() == 1) {
        let acts = input.q8k_token(g0 + lanes.start);
        let col = (&mut *out, stride, g0 + lanes.start - tokens.start);
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

for_each_dot_form!(kernels);
