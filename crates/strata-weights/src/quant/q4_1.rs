//! Q4_1: 32 values per block, f16 scale and f16 minimum, unsigned 4-bit codes.
//! `y = d * q + m`. Nibble order as in Q4_0.

use super::{BlockQ8_0, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 20 bytes: `d`, `m`, then 16 bytes of nibbles.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_1 {
    /// Block scale.
    pub d: F16Le,
    /// Block minimum (added to every value).
    pub m: F16Le,
    /// The 4-bit codes, two per byte.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl BlockQ4_1 {
    #[inline]
    fn codes(&self) -> [u8; 32] {
        let mut q = [0u8; 32];
        for (i, &b) in self.qs.iter().enumerate() {
            q[i] = b & 0x0f;
            q[i + 16] = b >> 4;
        }
        q
    }
}

impl QuantBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMS: usize = 32;
    type Activation = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (o, q) in out[..32].iter_mut().zip(self.codes()) {
            *o = d * f32::from(q) + m;
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let x = &x[..32];
        let qx: f32 = self
            .codes()
            .iter()
            .zip(x)
            .map(|(&q, &x)| f32::from(q) * x)
            .sum();
        let sx: f32 = x.iter().sum();
        self.d.to_f32() * qx + self.m.to_f32() * sx
    }

    fn dot_q8(&self, a: &BlockQ8_0) -> f32 {
        let s: i32 = self
            .codes()
            .iter()
            .zip(&a.qs)
            .map(|(&w, &x)| i32::from(w) * i32::from(x))
            .sum();
        let da = a.d.to_f32();
        da * (self.d.to_f32() * s as f32 + self.m.to_f32() * a.code_sum() as f32)
    }
}
