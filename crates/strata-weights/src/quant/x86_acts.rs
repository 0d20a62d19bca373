//! AVX2 quantization of activations to 8-bit codes: the same IEEE operations as the scalar
//! `BlockQ8_0::quantize` / `BlockQ8K::quantize` (max of `|x|`, `d = amax / 127`,
//! `id = 1 / d`, each code `round(x * id)` half away from zero, clamped to ±127, NaN to 0),
//! eight values at a time, so the codes and scales have the same bits.

use std::arch::x86_64::*;

use super::q8_0::BlockQ8_0;
use super::F16Le;

/// `max |x|`, skipping NaN as `f32::max` does.
#[target_feature(enable = "avx2,fma,f16c")]
fn amax(x: &[f32]) -> f32 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_setzero_ps();
    for c in x.chunks_exact(8) {
        // SAFETY: `c` is 8 f32.
        let v = _mm256_and_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, abs);
        // `maxps` returns its second operand when either is NaN: a NaN value leaves `m`.
        m = _mm256_max_ps(v, m);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` is 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    lanes.iter().fold(0.0f32, |a, &v| a.max(v))
}

/// Eight codes `round(v * id)` clamped to ±127 (NaN to 0) as i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn codes8(v: __m256, id: __m256) -> __m256i {
    let y = _mm256_mul_ps(v, id);
    // NaN (from a NaN value, or an infinite one times a zero `id`) becomes 0, as `as i8` does.
    let y = _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
    // Round half away from zero: truncate, then step away from zero where the dropped
    // fraction (exact in f32) is at least one half.
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
    let sign = _mm256_and_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN)));
    let frac = _mm256_andnot_ps(
        _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN)),
        _mm256_sub_ps(y, t),
    );
    let half = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
    let step = _mm256_and_ps(half, _mm256_or_ps(_mm256_set1_ps(1.0), sign));
    let r = _mm256_add_ps(t, step);
    let r = _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-127.0)),
        _mm256_set1_ps(127.0),
    );
    _mm256_cvttps_epi32(r)
}

/// Quantizes `x` (a multiple of 32 values) with one scale into `qs`; returns the scale
/// `d = max|x| / 127` in f32.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize(x: &[f32], qs: &mut [i8]) -> f32 {
    quantize_summed(x, qs).0
}

/// [`quantize`], also returning the sum of the codes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn quantize_summed(x: &[f32], qs: &mut [i8]) -> (f32, i32) {
    assert!(x.len() == qs.len() && x.len().is_multiple_of(32));
    let d = amax(x) / 127.0;
    let id = _mm256_set1_ps(if d == 0.0 { 0.0 } else { 1.0 / d });
    // `packs` interleaves 128-bit lanes; this puts the 32 bytes back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut sum = _mm256_setzero_si256();
    for (x, q) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)) {
        // SAFETY: `x` is 32 f32: four loads of 8.
        let c: [__m256i; 4] =
            std::array::from_fn(|k| codes8(unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * k)) }, id));
        sum = _mm256_add_epi32(
            sum,
            _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3])),
        );
        let w = _mm256_packs_epi16(
            _mm256_packs_epi32(c[0], c[1]),
            _mm256_packs_epi32(c[2], c[3]),
        );
        let w = _mm256_permutevar8x32_epi32(w, order);
        // SAFETY: `q` is 32 bytes.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, w) };
    }
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` is 8 i32.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum) };
    (d, lanes.iter().sum())
}

/// `BlockQ8_0::quantize` over every 32 values of `xs` (a multiple of 32), appending each
/// block, its stored scale widened back to f32, and that scale times the block's code sum
/// (what the kernels of formats with an offset or a min read): the scale's rounding to
/// half is `cvtps2ph` to nearest even, the rounding `BlockQ8_0::quantize` does.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8_0_blocks(
    xs: &[f32],
    blocks: &mut Vec<BlockQ8_0>,
    d: &mut Vec<f32>,
    dsum: &mut Vec<f32>,
) {
    for x in xs.chunks_exact(32) {
        let mut qs = [0i8; 32];
        let (scale, sum) = quantize_summed(x, &mut qs);
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(scale));
        let stored = _mm_cvtss_f32(_mm_cvtph_ps(h));
        let bits = _mm_extract_epi16::<0>(h) as u16;
        blocks.push(BlockQ8_0 {
            d: F16Le(bits.to_le_bytes()),
            qs,
        });
        d.push(stored);
        dsum.push(stored * sum as f32);
    }
}
