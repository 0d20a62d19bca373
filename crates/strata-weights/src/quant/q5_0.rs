//! Q5_0: 32 values per block, f16 scale, 5-bit codes offset by 16. `y = d * (q - 16)`.
//!
//! Low 4 bits as in Q4_0; the fifth bit of element `i` is bit `i` of the little-endian u32 `qh`.

use super::{block32, BlockQ8_0, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 22 bytes: `d`, 4 bytes of high bits, 16 bytes of nibbles.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_0 {
    /// Block scale.
    pub d: F16Le,
    /// The fifth bit of each code, as a little-endian u32.
    pub qh: [u8; 4],
    /// The low 4 bits of each code, two per byte.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// The 32 unsigned 5-bit codes of a Q5_0/Q5_1 block in element order.
#[inline]
pub(super) fn codes5(qh: [u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let h = u32::from_le_bytes(qh);
    let mut q = block32::nibbles(qs);
    for (i, q) in q.iter_mut().enumerate() {
        *q |= (((h >> i) & 1) as u8) << 4;
    }
    q
}

impl BlockQ5_0 {
    #[inline]
    fn codes(&self) -> [i8; 32] {
        codes5(self.qh, &self.qs).map(|q| q as i8 - 16)
    }
}

block32::scaled_block!(BlockQ5_0, Q5_0, |b| b.codes());
