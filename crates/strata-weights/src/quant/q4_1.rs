//! Q4_1: 32 values per block, f16 scale and f16 minimum, unsigned 4-bit codes.
//! `y = d * q + m`. Nibble order as in Q4_0.

use super::{block32, BlockQ8_0, F16Le, QuantBlock};
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

impl QuantBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMS: usize = 32;
    type Activation = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        block32::dequantize_min(self.d, self.m, &block32::nibbles(&self.qs), out);
    }

    fn dot(&self, x: &[f32]) -> f32 {
        block32::dot_min(self.d, self.m, &block32::nibbles(&self.qs), x)
    }

    fn dot_q8(&self, a: &BlockQ8_0) -> f32 {
        block32::dot_q8_min(self.d, self.m, &block32::nibbles(&self.qs), a)
    }
}
