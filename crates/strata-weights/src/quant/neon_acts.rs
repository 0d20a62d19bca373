//! NEON quantization of activations to 8-bit codes: the same IEEE operations as the scalar
//! `BlockQ8_0::quantize` / `BlockQ8K::quantize` (max of `|x|` skipping NaN, `d = amax / 127`,
//! `id = 1 / d`, each code `round(x * id)` half away from zero, clamped to ±127, NaN to 0),
//! four values at a time, so the codes and scales have the same bits. `fcvtas` rounds half
//! away from zero and turns NaN into 0, as `f32::round` then `as i8` do.

use std::arch::aarch64::*;

/// Quantizes `x` (a multiple of 32 values) with one scale into `qs`; returns the scale
/// `d = max|x| / 127` in f32.
pub(super) fn quantize(x: &[f32], qs: &mut [i8]) -> f32 {
    assert!(x.len() == qs.len() && x.len().is_multiple_of(32));
    // SAFETY: NEON is part of every aarch64 target.
    unsafe { quantize_neon(x, qs) }
}

#[target_feature(enable = "neon")]
fn quantize_neon(x: &[f32], qs: &mut [i8]) -> f32 {
    // `fmaxnm` returns the number where one side is NaN, as `f32::max` does.
    let mut m = vdupq_n_f32(0.0);
    for c in x.chunks_exact(4) {
        // SAFETY: `c` is 4 f32.
        m = vmaxnmq_f32(m, vabsq_f32(unsafe { vld1q_f32(c.as_ptr()) }));
    }
    let d = vmaxnmvq_f32(m) / 127.0;
    let id = vdupq_n_f32(if d == 0.0 { 0.0 } else { 1.0 / d });
    let (lo, hi) = (vdupq_n_s32(-127), vdupq_n_s32(127));
    for (x, q) in x.chunks_exact(16).zip(qs.chunks_exact_mut(16)) {
        let c: [int32x4_t; 4] = std::array::from_fn(|k| {
            // SAFETY: `x` is 16 f32: four loads of 4.
            let v = unsafe { vld1q_f32(x.as_ptr().add(4 * k)) };
            vminq_s32(vmaxq_s32(vcvtaq_s32_f32(vmulq_f32(v, id)), lo), hi)
        });
        let h0 = vcombine_s16(vmovn_s32(c[0]), vmovn_s32(c[1]));
        let h1 = vcombine_s16(vmovn_s32(c[2]), vmovn_s32(c[3]));
        let b = vcombine_s8(vmovn_s16(h0), vmovn_s16(h1));
        // SAFETY: `q` is 16 bytes.
        unsafe { vst1q_s8(q.as_mut_ptr(), b) };
    }
    d
}
