//! Arithmetic shared by the 32-element formats (Q4_0, Q5_0, Q8_0 with `y = d * q`; Q4_1,
//! Q5_1 with `y = d * q + m`), given a block's codes in element order.

use super::{BlockQ8_0, F16Le};

/// Implements [`QuantBlock`](super::QuantBlock) for a 32-element `y = d * q` format, given
/// its GGUF type and its 32 signed codes in element order (`|block| codes`).
macro_rules! scaled_block {
    ($block:ty, $ggml:ident, |$b:ident| $codes:expr) => {
        impl QuantBlock for $block {
            const TYPE: GgmlType = GgmlType::$ggml;
            const ELEMS: usize = 32;
            type Activation = BlockQ8_0;

            fn dequantize(&self, out: &mut [f32]) {
                let $b = self;
                block32::dequantize(self.d, &$codes, out);
            }

            fn dot(&self, x: &[f32]) -> f32 {
                let $b = self;
                block32::dot(self.d, &$codes, x)
            }

            fn dot_q8(&self, a: &BlockQ8_0) -> f32 {
                let $b = self;
                block32::dot_q8(self.d, &$codes, a)
            }
        }
    };
}
pub(super) use scaled_block;

/// The 32 nibbles of a 16-byte field: element `i < 16` is the low nibble of `qs[i]`,
/// element `16 + i` its high nibble.
#[inline]
pub(super) fn nibbles(qs: &[u8; 16]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (i, &b) in qs.iter().enumerate() {
        q[i] = b & 0x0f;
        q[i + 16] = b >> 4;
    }
    q
}

/// `out[i] = d * q[i]`.
#[inline]
pub(super) fn dequantize(d: F16Le, q: &[i8; 32], out: &mut [f32]) {
    let d = d.to_f32();
    for (o, &q) in out[..32].iter_mut().zip(q) {
        *o = d * f32::from(q);
    }
}

/// `sum(d * q[i] * x[i])`, accumulated before scaling.
#[inline]
pub(super) fn dot(d: F16Le, q: &[i8; 32], x: &[f32]) -> f32 {
    let s: f32 = q
        .iter()
        .zip(&x[..32])
        .map(|(&q, &x)| f32::from(q) * x)
        .sum();
    s * d.to_f32()
}

/// The integer sum of code products, scaled by both blocks' scales.
#[inline]
pub(super) fn dot_q8(d: F16Le, q: &[i8; 32], a: &BlockQ8_0) -> f32 {
    let s: i32 = q
        .iter()
        .zip(&a.qs)
        .map(|(&w, &x)| i32::from(w) * i32::from(x))
        .sum();
    s as f32 * d.to_f32() * a.d.to_f32()
}

/// `out[i] = d * q[i] + m`.
#[inline]
pub(super) fn dequantize_min(d: F16Le, m: F16Le, q: &[u8; 32], out: &mut [f32]) {
    let (d, m) = (d.to_f32(), m.to_f32());
    for (o, &q) in out[..32].iter_mut().zip(q) {
        *o = d * f32::from(q) + m;
    }
}

/// `d * sum(q[i] * x[i]) + m * sum(x[i])`.
#[inline]
pub(super) fn dot_min(d: F16Le, m: F16Le, q: &[u8; 32], x: &[f32]) -> f32 {
    let x = &x[..32];
    let qx: f32 = q.iter().zip(x).map(|(&q, &x)| f32::from(q) * x).sum();
    let sx: f32 = x.iter().sum();
    d.to_f32() * qx + m.to_f32() * sx
}

/// The integer dot product with a minimum: `da * (d * sum(q * x) + m * sum(x))`.
#[inline]
pub(super) fn dot_q8_min(d: F16Le, m: F16Le, q: &[u8; 32], a: &BlockQ8_0) -> f32 {
    let s: i32 = q
        .iter()
        .zip(&a.qs)
        .map(|(&w, &x)| i32::from(w) * i32::from(x))
        .sum();
    let da = a.d.to_f32();
    da * (d.to_f32() * s as f32 + m.to_f32() * a.code_sum() as f32)
}
