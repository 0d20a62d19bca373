//! x86 integer dot products of weight blocks with 8-bit activation blocks: the pieces the
//! kernels share, the choice of byte dot, and the dispatch. The kernels live in
//! [`super::x86_b32`] (Q8_0, Q4_0, Q4_1, Q5_0) and [`super::x86_k`] (Q4_K, Q6_K).
//!
//! The byte dot sums four adjacent `u8 x i8` products into each i32 lane: `maddubs` +
//! `madd` on AVX2 (every use stays inside i16: unsigned codes are at most 63, activation
//! codes lie in -127..=127, so a pair sums to at most 2 * 63 * 127 = 16002; for Q8_0's
//! signed weights the weight's sign moves onto the activation, 2 * 128 * 127 = 32512), one
//! `vpdpbusd` where the CPU has VNNI: AVX-VNNI's encoding (recent Intel cores) or AVX-512
//! VNNI's 256-bit one with AVX-512VL (AMD Zen 4, Intel server cores). The same products
//! summed exactly, so every form gives the same bits (`STRATA_CPU_VNNI=0` turns VNNI off).
//! Formats whose codes carry an offset or a minimum dot the unsigned codes and subtract
//! the offset times the activation code sums, which the caller precomputed.
//!
//! The integer sums equal those of the portable [`super::QuantBlock::dot_q8`]; the f32
//! steps that combine blocks differ from it only by rounding.

use std::arch::x86_64::*;
use std::ops::Range;

use super::fast::Q8Input;
use super::x86_b32 as b32;
use super::x86_k as kq;
use super::F16Le;
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
pub(super) fn h2f(h: F16Le) -> f32 {
    let bits = u16::from_le_bytes(h.0);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Four f16 values as f32 in one conversion (the same values as [`h2f`] each), their bits
/// put together in a general register: the vector unit only converts.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn h2f4(h: [F16Le; 4]) -> __m128 {
    let b = h.map(|h| u64::from(u16::from_le_bytes(h.0)));
    let bits = b[0] | b[1] << 16 | b[2] << 32 | b[3] << 48;
    _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
}

/// How far ahead of the weight stream to prefetch, in bytes.
pub(super) const PREFETCH_AHEAD: usize = 1536;

/// A weight row's blocks decoded once for every activation group that passes over it:
/// each block's 32 codes as eight lanes of four, its scale and its correction factor.
#[derive(Default)]
pub(super) struct DecodedRow {
    pub(super) codes: Vec<[i32; 8]>,
    pub(super) d: Vec<f32>,
    pub(super) corr: Vec<f32>,
}

impl Decoded for DecodedRow {
    fn clear(&mut self) {
        self.codes.clear();
        self.d.clear();
        self.corr.clear();
    }
}

impl DecodedRow {
    pub(super) fn blocks(&self) -> usize {
        self.codes.len()
    }
}

/// A weight row decoded once for every activation group of a tile ([`DecodedRow`], the K
/// formats' own), emptied for the next row.
pub(super) trait Decoded: Default {
    fn clear(&mut self);
}

/// Groups of a tile from which a row pair is decoded once for all of them ([`Decoded`]);
/// below it the group kernels decode each block as they go (a batched decode step's single
/// group was 2x slower through the decoded row).
const DECODE_ONCE_MIN_GROUPS: usize = 4;

/// The eight-token half of a row-range driver, shared by the 32-value and the K kernels:
/// every span of `spans` with two or more tokens (`(group start, lanes)`, group `g0`'s
/// activations `group_of(g0)`), over `rows` (row `r`'s blocks `blocks(r)`, `None` when
/// malformed), into `out` (row `i` of the range at `i * stride`, token `t` at column
/// `t - tokens.start`). Few groups (a batched decode step) take row pairs decoded block by
/// block inside the group kernel (`group2_blocks`); the rest (and a last single or
/// malformed row) rows decoded once for every group (`decode`, then `group2` / `group1`);
/// a malformed row's results are NaN.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) fn drive_groups<'a, B: 'a, D: Decoded, G: 'a>(
    (bytes, row_bytes, rows): (&[u8], usize, Range<usize>),
    blocks: impl Fn(usize) -> Option<&'a [B]>,
    (spans, tokens): (&[(usize, Range<usize>)], &Range<usize>),
    (out, stride): (&mut [f32], usize),
    group_of: impl Fn(usize) -> &'a [G],
    decode: impl Fn(&B, &mut D),
    group2: impl Fn([&D; 2], &[G]) -> [__m256; 2],
    group1: impl Fn([&D; 1], &[G]) -> [__m256; 1],
    group2_blocks: impl Fn([&[B]; 2], &[G]) -> [__m256; 2],
) {
    let wide = |s: &&(usize, Range<usize>)| s.1.len() >= 2;
    let write = |out: &mut [f32], i: usize, g0: usize, lanes: &Range<usize>, v: __m256| {
        write_lanes((out, stride), i, g0 + lanes.start - tokens.start, lanes, v)
    };
    let groups = spans.iter().filter(wide).count();
    if groups == 0 {
        return;
    }
    let mut first_row = 0;
    if groups < DECODE_ONCE_MIN_GROUPS {
        let mut next = (rows.start * row_bytes + PREFETCH_AHEAD) & !63;
        while first_row + 2 <= rows.len() {
            let r = rows.start + first_row;
            prefetch_ahead(bytes, (r + 2) * row_bytes, &mut next);
            let (Some(w0), Some(w1)) = (blocks(r), blocks(r + 1)) else {
                break;
            };
            for (g0, lanes) in spans.iter().filter(wide) {
                let v = group2_blocks([w0, w1], group_of(*g0));
                write(out, first_row, *g0, lanes, v[0]);
                write(out, first_row + 1, *g0, lanes, v[1]);
            }
            first_row += 2;
        }
    }
    let mut next = ((rows.start + first_row) * row_bytes + PREFETCH_AHEAD) & !63;
    let mut dec = [D::default(), D::default()];
    let mut i = first_row;
    while i < rows.len() {
        let r = rows.start + i;
        let n = if i + 2 <= rows.len() { 2 } else { 1 };
        prefetch_ahead(bytes, (r + n) * row_bytes, &mut next);
        let mut whole = 0;
        for (k, d) in dec.iter_mut().enumerate().take(n) {
            d.clear();
            let Some(w) = blocks(r + k) else { break };
            w.iter().for_each(|b| decode(b, d));
            whole += 1;
        }
        if whole == 2 {
            for (g0, lanes) in spans.iter().filter(wide) {
                let v = group2([&dec[0], &dec[1]], group_of(*g0));
                write(out, i, *g0, lanes, v[0]);
                write(out, i + 1, *g0, lanes, v[1]);
            }
            i += 2;
            continue;
        }
        for (g0, lanes) in spans.iter().filter(wide) {
            if whole == 1 {
                let v = group1([&dec[0]], group_of(*g0));
                write(out, i, *g0, lanes, v[0]);
            } else {
                let o = i * stride + g0 + lanes.start - tokens.start;
                out[o..o + lanes.len()].fill(f32::NAN);
            }
        }
        i += 1;
    }
}

/// Prefetches the cache lines of `bytes[from..to]` shifted `PREFETCH_AHEAD` bytes ahead,
/// starting at `*next` if that is further on, and moves `*next` past them: each line of
/// a stream is asked for once. The hardware prefetcher of some (virtualised) CPUs does not
/// keep a block-by-block stream fed; this keeps about `PREFETCH_AHEAD` bytes in flight.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn prefetch_ahead(bytes: &[u8], to: usize, next: &mut usize) {
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
pub(super) unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes; unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// The 32 codes of a 16-byte nibble field: low nibbles in lane 0, high nibbles in lane 1
/// (element order for Q4_0 / Q4_1 / Q5_0).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn nibbles16(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 bytes.
    let b = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(b, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m4);
    _mm256_set_m128i(hi, lo)
}

/// One token's results, column `j` of `out` (`$col` is `(out, stride, j)`; row `i` at
/// `i * stride + j`), over `rows`:
/// `$n` rows a pass through `$many`, the rest one at a time through `$one`; a row whose
/// bytes are malformed (`$blocks` gives `None`) gets NaN. Shared by the formats' drivers; a
/// macro so the kernels inline into each driver's target features.
macro_rules! token_column {
    ($n:expr, ($bytes:expr, $row_bytes:expr, $rows:expr), $blocks:expr, $acts:expr,
     $col:expr, $many:expr, $one:expr) => {{
        let (bytes, row_bytes, rows) = ($bytes, $row_bytes, $rows);
        let ((out, stride, j), acts): ((&mut [f32], usize, usize), _) = ($col, $acts);
        let mut next = (rows.start * row_bytes + PREFETCH_AHEAD) & !63;
        let mut i = 0;
        while i < rows.len() {
            let r = rows.start + i;
            if i + $n <= rows.len() {
                prefetch_ahead(bytes, (r + $n) * row_bytes, &mut next);
                let ws: [_; $n] = std::array::from_fn(|k| $blocks(r + k));
                if ws.iter().all(Option::is_some) {
                    let v = $many(ws.map(Option::unwrap), acts);
                    for (k, v) in v.into_iter().enumerate() {
                        out[(i + k) * stride + j] = v;
                    }
                    i += $n;
                    continue;
                }
            }
            prefetch_ahead(bytes, (r + 1) * row_bytes, &mut next);
            out[i * stride + j] = match $blocks(r) {
                Some(w) => $one([w], acts)[0],
                None => f32::NAN,
            };
            i += 1;
        }
    }};
}
pub(super) use token_column;

/// 16 in byte `i` where bit `i` of `bits` is set, 0 elsewhere (Q5_0's fifth bits).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn high_bits_shuffled(bits: u32) -> __m256i {
    // Byte i of the result takes byte i / 8 of `bits`, then tests bit i % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Instantiates `$kernels!(module, target features, the 32-value formats' features, |acc,
/// u, s| dot, |acc, u4, s4| dot4, |bits| high)` for each form of the byte dot (`dot4`: four
/// dots into one sum; AVX2 adds the four `maddubs` results in i16 before one `madd`, which
/// holds for codes below 32: 4 x 2 x 31 x 127 = 31,496): AVX2's `maddubs` + `madd`,
/// AVX-VNNI's and AVX-512 VNNI's `vpdpbusd`. `high` spreads a Q5_0 block's 32 high bits to
/// 16 in the bytes where set: AVX-512 from a mask register in one instruction (AVX-512 BW,
/// enabled for the 32-value kernels only: the K kernels compiled slower with it), the
/// others by a byte shuffle and a compare.
macro_rules! for_each_dot_form {
    ($kernels:ident) => {
        $kernels!(
            avx2,
            "avx2,fma,f16c",
            "avx2,fma,f16c",
            |acc, u, s| _mm256_add_epi32(
                acc,
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
            ),
            |acc4, u4, s4| _mm256_add_epi32(
                acc4,
                _mm256_madd_epi16(
                    _mm256_add_epi16(
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(u4[0], s4[0]),
                            _mm256_maddubs_epi16(u4[1], s4[1])
                        ),
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(u4[2], s4[2]),
                            _mm256_maddubs_epi16(u4[3], s4[3])
                        )
                    ),
                    _mm256_set1_epi16(1)
                )
            ),
            |bits| high_bits_shuffled(bits)
        );
        $kernels!(
            avx_vnni,
            "avx2,fma,f16c,avxvnni",
            "avx2,fma,f16c,avxvnni",
            |acc, u, s| _mm256_dpbusd_avx_epi32(acc, u, s),
            |acc4, u4, s4| (0..4).fold(acc4, |a, k| _mm256_dpbusd_avx_epi32(a, u4[k], s4[k])),
            |bits| high_bits_shuffled(bits)
        );
        $kernels!(
            avx512_vnni,
            "avx2,fma,f16c,avx512vnni,avx512vl",
            "avx2,fma,f16c,avx512vnni,avx512vl,avx512bw",
            |acc, u, s| _mm256_dpbusd_epi32(acc, u, s),
            |acc4, u4, s4| (0..4).fold(acc4, |a, k| _mm256_dpbusd_epi32(a, u4[k], s4[k])),
            |bits| _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(0x10))
        );
    };
}
pub(super) use for_each_dot_form;

/// Generates one form's byte dots, which the 32-value and the K kernels share (its narrower
/// feature set, so that either form of kernel can inline them).
macro_rules! byte_dots {
    ($m:ident, $feat:literal, $_feat32:literal, |$acc:ident, $u:ident, $s:ident| $dot:expr, |$four_acc:ident, $four_u:ident, $four_s:ident| $dot4:expr, |$bits:ident| $high:expr) => {
        pub(crate) mod $m {
            use std::arch::x86_64::*;

            /// `acc` plus, in each i32 lane, the sum of its four byte products `u[i] * s[i]`
            /// (unsigned by signed).
            #[target_feature(enable = $feat)]
            #[inline]
            pub(crate) fn dot($acc: __m256i, $u: __m256i, $s: __m256i) -> __m256i {
                $dot
            }

            /// Four [`dot`]s into one sum, `u4[k]` against `s4[k]`, for unsigned codes
            /// below 32 (Q4_0, Q4_1, Q5_0, Q4_K): AVX2 adds the four in i16 before widening
            /// (4 x 2 x 31 x 127 < 2^15), the VNNI forms take four `vpdpbusd`.
            #[target_feature(enable = $feat)]
            #[inline]
            pub(crate) fn dot4(
                $four_acc: __m256i,
                $four_u: [__m256i; 4],
                $four_s: [__m256i; 4],
            ) -> __m256i {
                $dot4
            }
        }
    };
}

/// Each form's byte dots ([`for_each_dot_form`]), one module a form.
pub(super) mod dots {
    for_each_dot_form!(byte_dots);
}

/// The first `R` lanes of `v` (one result a row of a one-token kernel).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn lanes<const R: usize>(v: __m128) -> [f32; R] {
    let mut out = [0f32; 4];
    // SAFETY: `out` is 4 f32.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), v) };
    std::array::from_fn(|r| out[r])
}

/// Lanes `lanes` of `v` (one result a token of an eight-token group) into row `i` of `out`
/// from column `o0`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn write_lanes(
    (out, stride): (&mut [f32], usize),
    i: usize,
    o0: usize,
    lanes: &Range<usize>,
    v: __m256,
) {
    let mut vals = [0f32; 8];
    // SAFETY: `vals` is 8 f32.
    unsafe { _mm256_storeu_ps(vals.as_mut_ptr(), v) };
    out[i * stride + o0..i * stride + o0 + lanes.len()].copy_from_slice(&vals[lanes.clone()]);
}

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
                is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bw")
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
        (GgmlType::Q8_0, Dot::AvxVnni) => b32::avx_vnni::rows_q8_0,
        (GgmlType::Q4_0, Dot::AvxVnni) => b32::avx_vnni::rows_q4_0,
        (GgmlType::Q4_1, Dot::AvxVnni) => b32::avx_vnni::rows_q4_1,
        (GgmlType::Q5_0, Dot::AvxVnni) => b32::avx_vnni::rows_q5_0,
        (GgmlType::Q8_0, Dot::Avx512Vnni) => b32::avx512_vnni::rows_q8_0,
        (GgmlType::Q4_0, Dot::Avx512Vnni) => b32::avx512_vnni::rows_q4_0,
        (GgmlType::Q4_1, Dot::Avx512Vnni) => b32::avx512_vnni::rows_q4_1,
        (GgmlType::Q5_0, Dot::Avx512Vnni) => b32::avx512_vnni::rows_q5_0,
        (GgmlType::Q8_0, _) => b32::avx2::rows_q8_0,
        (GgmlType::Q4_0, _) => b32::avx2::rows_q4_0,
        (GgmlType::Q4_1, _) => b32::avx2::rows_q4_1,
        (GgmlType::Q5_0, _) => b32::avx2::rows_q5_0,
        (GgmlType::Q4_K, Dot::AvxVnni) => kq::avx_vnni::rows_q4_k,
        (GgmlType::Q6_K, Dot::AvxVnni) => kq::avx_vnni::rows_q6_k,
        (GgmlType::Q4_K, Dot::Avx512Vnni) => kq::avx512_vnni::rows_q4_k,
        (GgmlType::Q6_K, Dot::Avx512Vnni) => kq::avx512_vnni::rows_q6_k,
        (GgmlType::Q4_K, _) => kq::avx2::rows_q4_k,
        (GgmlType::Q6_K, _) => kq::avx2::rows_q6_k,
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
