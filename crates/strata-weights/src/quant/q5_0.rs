//! Q5_0: 32 values per block, f16 scale, 5-bit codes offset by 16. `y = d * (q - 16)`.
//!
//! Low 4 bits as in Q4_0; the fifth bit of element `i` is bit `i` of the little-endian u32 `qh`.

use super::{BlockQ8_0, F16Le, QuantBlock};
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
    let mut q = [0u8; 32];
    for (i, &b) in qs.iter().enumerate() {
        q[i] = (b & 0x0f) | ((((h >> i) & 1) as u8) << 4);
        q[i + 16] = (b >> 4) | ((((h >> (i + 16)) & 1) as u8) << 4);
    }
    q
}

impl BlockQ5_0 {
    #[inline]
    fn codes(&self) -> [i8; 32] {
        codes5(self.qh, &self.qs).map(|q| q as i8 - 16)
    }
}

impl QuantBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
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
