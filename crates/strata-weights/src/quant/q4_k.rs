//! Q4_K: 256 values per super-block in 8 sub-blocks of 32. Each sub-block has a 6-bit scale
//! and a 6-bit min; the super-block an f16 `d` and `dmin`.
//! `y = (d * sc[j]) * q - dmin * mn[j]` with `q` in 0..16 and `j = e / 32`.
//!
//! Codes: element `e` of sub-block `j` is byte `32 * (j / 2) + e % 32` of `qs`, low nibble
//! when `j` is even, high nibble when odd.

use super::k_common::{dot_affine, idot_affine, pack_scales_mins, unpack_scales_mins};
use super::{BlockQ8K, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 144 bytes: `d`, `dmin`, 12 bytes of packed scales/mins, 128 bytes of nibbles.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the sub-block scales.
    pub d: F16Le,
    /// Super-block scale of the sub-block mins.
    pub dmin: F16Le,
    /// 8 packed 6-bit sub-block scales and 8 6-bit mins.
    pub scales: [u8; 12],
    /// The 4-bit codes, two per byte.
    pub qs: [u8; 128],
}

const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// The 256 unsigned 4-bit codes of a Q4_K/Q5_K nibble field, in element order.
#[inline]
pub(super) fn nibble_codes(qs: &[u8; 128]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for (c, bytes) in qs.chunks_exact(32).enumerate() {
        for (l, &b) in bytes.iter().enumerate() {
            q[64 * c + l] = b & 0x0f;
            q[64 * c + 32 + l] = b >> 4;
        }
    }
    q
}

impl QuantBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const ELEMS: usize = 256;
    type Activation = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let (sc, mn) = unpack_scales_mins(&self.scales);
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let codes = nibble_codes(&self.qs);
        for (j, (o, q)) in out[..256]
            .chunks_exact_mut(32)
            .zip(codes.chunks_exact(32))
            .enumerate()
        {
            let (dj, mj) = (d * f32::from(sc[j]), dmin * f32::from(mn[j]));
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dj * f32::from(q) - mj;
            }
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let (sc, mn) = unpack_scales_mins(&self.scales);
        let codes = nibble_codes(&self.qs);
        dot_affine::<32>(&codes, &sc, &mn, self.d.to_f32(), self.dmin.to_f32(), x)
    }

    fn dot_q8(&self, a: &BlockQ8K) -> f32 {
        let (sc, mn) = unpack_scales_mins(&self.scales);
        let (sq, sm) = idot_affine::<32>(&nibble_codes(&self.qs), &sc, &mn, a);
        a.d * (self.d.to_f32() * sq as f32 - self.dmin.to_f32() * sm as f32)
    }
}

/// Sub-block scales and mins chosen so that every value of the sub-block is covered:
/// `-M_j <= x <= 15 * S_j - M_j` with `S_j = d * sc[j]`, `M_j = dmin * mn[j]`.
/// Codes are rounded up and the super-scales rounded up to f16, so clamping never happens
/// and the error of each value is at most `S_j / 2` (up to f32 rounding).
pub(super) struct AffineScales {
    pub d: F16Le,
    pub dmin: F16Le,
    pub sc: [u8; 8],
    pub mn: [u8; 8],
}

/// Picks 6-bit scales/mins for eight 32-value sub-blocks whose codes span `0..=qmax`.
pub(super) fn choose_affine_scales(x: &[f32], qmax: f32) -> AffineScales {
    let mut need_min = [0.0f32; 8];
    let mut hi = [0.0f32; 8];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let lo = sub.iter().fold(0.0f32, |m, &v| m.min(v));
        need_min[j] = -lo;
        hi[j] = sub.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    }
    let dmin = F16Le::round_up(need_min.iter().fold(0.0f32, |m, &v| m.max(v)) / 63.0);
    let dminf = dmin.to_f32();
    let mut mn = [0u8; 8];
    let mut need_scale = [0.0f32; 8];
    for j in 0..8 {
        mn[j] = code_up(need_min[j], dminf);
        need_scale[j] = ((hi[j] + dminf * f32::from(mn[j])) / qmax).max(0.0);
    }
    let d = F16Le::round_up(need_scale.iter().fold(0.0f32, |m, &v| m.max(v)) / 63.0);
    let df = d.to_f32();
    let sc = need_scale.map(|s| code_up(s, df));
    AffineScales { d, dmin, sc, mn }
}

/// `ceil(need / unit)` as a 6-bit code (0 when `unit` is 0).
fn code_up(need: f32, unit: f32) -> u8 {
    if unit > 0.0 {
        (need / unit).ceil().clamp(0.0, 63.0) as u8
    } else {
        0
    }
}

/// The code for `x` under step `s` and offset `m`: `round((x + m) / s)` clamped to `0..=qmax`.
#[inline]
pub(super) fn affine_code(x: f32, s: f32, m: f32, qmax: u8) -> u8 {
    if s > 0.0 {
        ((x + m) / s).round().clamp(0.0, f32::from(qmax)) as u8
    } else {
        0
    }
}

impl BlockQ4K {
    /// Quantizes 256 values (see [`AffineScales`] for the error bound).
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), 256, "a Q4_K block holds 256 values");
        let s = choose_affine_scales(x, 15.0);
        let (d, dmin) = (s.d.to_f32(), s.dmin.to_f32());
        let mut qs = [0u8; 128];
        for (j, sub) in x.chunks_exact(32).enumerate() {
            let (sj, mj) = (d * f32::from(s.sc[j]), dmin * f32::from(s.mn[j]));
            for (l, &v) in sub.iter().enumerate() {
                let q = affine_code(v, sj, mj, 15);
                qs[32 * (j / 2) + l] |= if j % 2 == 0 { q } else { q << 4 };
            }
        }
        Self {
            d: s.d,
            dmin: s.dmin,
            scales: pack_scales_mins(&s.sc, &s.mn),
            qs,
        }
    }
}

/// Quantizes a row (length a multiple of 256) into `out`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ4K]) -> crate::Result<()> {
    super::check_len("Q4_K quantize input", out.len() * 256, x.len())?;
    for (b, x) in out.iter_mut().zip(x.chunks_exact(256)) {
        *b = BlockQ4K::quantize(x);
    }
    Ok(())
}
