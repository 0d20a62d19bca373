//! Q5_K: like Q4_K with a fifth code bit. `y = (d * sc[j]) * q - dmin * mn[j]`, `q` in 0..32.
//! The fifth bit of element `e` is bit `e / 32` of `qh[e % 32]`.

use super::k_common::{dot_affine, idot_affine, unpack_scales_mins};
use super::q4_k::nibble_codes;
use super::{BlockQ8K, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 176 bytes: `d`, `dmin`, 12 bytes of scales/mins, 32 bytes of high bits, 128 of nibbles.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the sub-block scales.
    pub d: F16Le,
    /// Super-block scale of the sub-block mins.
    pub dmin: F16Le,
    /// 8 packed 6-bit sub-block scales and 8 6-bit mins, as in Q4_K.
    pub scales: [u8; 12],
    /// The fifth bit of each code.
    pub qh: [u8; 32],
    /// The low 4 bits of each code, two per byte.
    pub qs: [u8; 128],
}

const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockQ5K {
    #[inline]
    fn codes(&self) -> [u8; 256] {
        let mut q = nibble_codes(&self.qs);
        for (e, q) in q.iter_mut().enumerate() {
            *q |= ((self.qh[e % 32] >> (e / 32)) & 1) << 4;
        }
        q
    }
}

impl QuantBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const ELEMS: usize = 256;
    type Activation = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let (sc, mn) = unpack_scales_mins(&self.scales);
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let codes = self.codes();
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
        dot_affine::<32>(
            &self.codes(),
            &sc,
            &mn,
            self.d.to_f32(),
            self.dmin.to_f32(),
            x,
        )
    }

    fn dot_q8(&self, a: &BlockQ8K) -> f32 {
        let (sc, mn) = unpack_scales_mins(&self.scales);
        let (sq, sm) = idot_affine::<32>(&self.codes(), &sc, &mn, a);
        a.d * (self.d.to_f32() * sq as f32 - self.dmin.to_f32() * sm as f32)
    }
}
