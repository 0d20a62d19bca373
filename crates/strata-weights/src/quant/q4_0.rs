//! Q4_0: 32 values per block, one f16 scale, 4-bit codes offset by 8. `y = d * (q - 8)`.
//!
//! Element `i < 16` is the low nibble of `qs[i]`, element `16 + i` its high nibble.

use super::{block32, BlockQ8_0, F16Le, QuantBlock};
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
        block32::nibbles(&self.qs).map(|q| q as i8 - 8)
    }
}

block32::scaled_block!(BlockQ4_0, Q4_0, |b| b.codes());
