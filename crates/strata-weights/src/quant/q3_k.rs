//! Q3_K: 256 values in 16 groups of 16, symmetric. `y = (d * sc[g]) * q` with a signed 6-bit
//! group scale `sc` (stored +32) and `q` in -4..4.
//!
//! Codes: the low two bits as in Q2_K; element `e` subtracts 4 unless bit `e / 32` of
//! `hmask[e % 32]` is set. Scales: the low 4 bits of scale `g` are the low nibble of byte
//! `g` (g < 8) or the high nibble of byte `g - 8`; its top 2 bits are bits `2 (g / 4)..` of
//! byte `8 + g % 4`.

use super::k_common::{dot_symmetric, idot_symmetric};
use super::q2_k::crumb_codes;
use super::{BlockQ8K, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 110 bytes: 32 bytes of high-bit mask, 64 bytes of 2-bit codes, 12 bytes of scales, `d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ3K {
    /// High (third) bit of each code: clear means subtract 4.
    pub hmask: [u8; 32],
    /// The low two bits of each code.
    pub qs: [u8; 64],
    /// 16 packed 6-bit group scales, stored +32.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: F16Le,
}

const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

impl BlockQ3K {
    fn group_scales(&self) -> [i8; 16] {
        let s = &self.scales;
        std::array::from_fn(|g| {
            let low = if g < 8 { s[g] & 15 } else { s[g - 8] >> 4 };
            let high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }

    fn codes(&self) -> [i8; 256] {
        let low = crumb_codes(&self.qs);
        std::array::from_fn(|e| {
            let high_set = (self.hmask[e % 32] >> (e / 32)) & 1 == 1;
            low[e] as i8 - if high_set { 0 } else { 4 }
        })
    }
}

impl QuantBlock for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const ELEMS: usize = 256;
    type Activation = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let sc = self.group_scales();
        let d = self.d.to_f32();
        let codes = self.codes();
        for (g, (o, q)) in out[..256]
            .chunks_exact_mut(16)
            .zip(codes.chunks_exact(16))
            .enumerate()
        {
            let dl = d * f32::from(sc[g]);
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * f32::from(q);
            }
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        dot_symmetric::<16>(&self.codes(), &self.group_scales(), self.d.to_f32(), x)
    }

    fn dot_q8(&self, a: &BlockQ8K) -> f32 {
        let s = idot_symmetric::<16>(&self.codes(), &self.group_scales(), a);
        a.d * self.d.to_f32() * s as f32
    }
}
