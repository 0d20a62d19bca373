//! Q2_K: 256 values in 16 groups of 16. Each group has a 4-bit scale (low nibble of
//! `scales[g]`) and a 4-bit min (high nibble); the super-block an f16 `d` and `dmin`.
//! `y = (d * sc[g]) * q - dmin * mn[g]`, `q` in 0..4.
//!
//! Codes: element `e = 128 h + 32 s + l` is bits `2s..2s+2` of `qs[32 h + l]`.

use super::k_common::{dot_affine, idot_affine};
use super::{BlockQ8K, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 84 bytes: 16 scale/min bytes, 64 bytes of 2-bit codes, `d`, `dmin`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    /// Per group: 4-bit scale (low nibble) and 4-bit min (high nibble).
    pub scales: [u8; 16],
    /// The 2-bit codes.
    pub qs: [u8; 64],
    /// Super-block scale of the group scales.
    pub d: F16Le,
    /// Super-block scale of the group mins.
    pub dmin: F16Le,
}

const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// The 256 2-bit codes of a Q2_K/Q3_K low-bit field, in element order.
#[inline]
pub(super) fn crumb_codes(qs: &[u8; 64]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for h in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                q[128 * h + 32 * s + l] = (qs[32 * h + l] >> (2 * s)) & 3;
            }
        }
    }
    q
}

impl BlockQ2K {
    fn scales_mins(&self) -> ([u8; 16], [u8; 16]) {
        (self.scales.map(|b| b & 15), self.scales.map(|b| b >> 4))
    }
}

impl QuantBlock for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const ELEMS: usize = 256;
    type Activation = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let (sc, mn) = self.scales_mins();
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let codes = crumb_codes(&self.qs);
        for (g, (o, q)) in out[..256]
            .chunks_exact_mut(16)
            .zip(codes.chunks_exact(16))
            .enumerate()
        {
            let (dl, ml) = (d * f32::from(sc[g]), dmin * f32::from(mn[g]));
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * f32::from(q) - ml;
            }
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let (sc, mn) = self.scales_mins();
        let codes = crumb_codes(&self.qs);
        dot_affine::<16>(&codes, &sc, &mn, self.d.to_f32(), self.dmin.to_f32(), x)
    }

    fn dot_q8(&self, a: &BlockQ8K) -> f32 {
        let (sc, mn) = self.scales_mins();
        let (sq, sm) = idot_affine::<16>(&crumb_codes(&self.qs), &sc, &mn, a);
        a.d * (self.d.to_f32() * sq as f32 - self.dmin.to_f32() * sm as f32)
    }
}
