//! Q5_1: 32 values per block, f16 scale and minimum, unsigned 5-bit codes. `y = d * q + m`.
//! Bit layout as in Q5_0.

use super::q5_0::codes5;
use super::{block32, BlockQ8_0, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 24 bytes: `d`, `m`, 4 bytes of high bits, 16 bytes of nibbles.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_1 {
    /// Block scale.
    pub d: F16Le,
    /// Block minimum (added to every value).
    pub m: F16Le,
    /// The fifth bit of each code, as a little-endian u32.
    pub qh: [u8; 4],
    /// The low 4 bits of each code, two per byte.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

impl QuantBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ELEMS: usize = 32;
    type Activation = BlockQ8_0;

    fn dequantize(&self, out: &mut [f32]) {
        block32::dequantize_min(self.d, self.m, &codes5(self.qh, &self.qs), out);
    }

    fn dot(&self, x: &[f32]) -> f32 {
        block32::dot_min(self.d, self.m, &codes5(self.qh, &self.qs), x)
    }

    fn dot_q8(&self, a: &BlockQ8_0) -> f32 {
        block32::dot_q8_min(self.d, self.m, &codes5(self.qh, &self.qs), a)
    }
}
