//! Q4_0: 32 values per block, one f16 scale, 4-bit codes offset by 8. `y = d * (q - 8)`.
//!
//! Element `i < 16` is the low nibble of `qs[i]`, element `16 + i` its high nibble.

use super::{BlockQ8_0, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 18 bytes: `d`, then 16 bytes of nibbles.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    /// Block scale.
    pub d: F16Le,
    /// The 4-bit codes, two per byte.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl BlockQ4_0 {
    /// The 32 signed codes (`q - 8`) in element order.
    #[inline]
    fn codes(&self) -> [i8; 32] {
        let mut q = [0i8; 32];
        for (i, &b) in self.qs.iter().enumerate() {
            q[i] = (b & 0x0f) as i8 - 8;
            q[i + 16] = (b >> 4) as i8 - 8;
        }
        q
    }
}

impl QuantBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ELEMS: usize = 32;
    type Activation = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, q) in out[..32].iter_mut().zip(self.codes()) {
            *o = d * f32::from(q);
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        let s: f32 = self
            .codes()
            .iter()
            .zip(&x[..32])
            .map(|(&q, &x)| f32::from(q) * x)
            .sum();
        s * self.d.to_f32()
    }

    fn dot_q8(&self, a: &BlockQ8_0) -> f32 {
        let s: i32 = self
            .codes()
            .iter()
            .zip(&a.qs)
            .map(|(&w, &x)| i32::from(w) * i32::from(x))
            .sum();
        s as f32 * self.d.to_f32() * a.d.to_f32()
    }
}
