//! Q8_0: 32 values per block, one f16 scale, signed 8-bit codes. `y = d * q`.
//!
//! Also the activation format the 32-element weight formats pair with in [`QuantBlock::dot_q8`].

use super::{block32, ActivationBlock, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 34 bytes: `d`, then 32 codes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_0 {
    /// Block scale.
    pub d: F16Le,
    /// The signed 8-bit codes.
    pub qs: [i8; 32],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

impl BlockQ8_0 {
    /// Quantizes 32 values: `d = max|x| / 127`, codes rounded half away from zero. Bit-exact
    /// with gguf-py's `Q8_0.quantize_blocks` (the scale is rounded to f16 after the codes
    /// are computed with the unrounded one, as ggml does).
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), 32, "a Q8_0 block holds 32 values");
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let mut qs = [0i8; 32];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        Self {
            d: F16Le::from_f32(d),
            qs,
        }
    }

    /// Sum of the codes, used by formats with a per-block minimum.
    pub(crate) fn code_sum(&self) -> i32 {
        self.qs.iter().map(|&q| i32::from(q)).sum()
    }
}

block32::scaled_block!(BlockQ8_0, Q8_0, |b| b.qs);

impl ActivationBlock for BlockQ8_0 {
    const ELEMS: usize = 32;
    fn quantize(x: &[f32]) -> Self {
        BlockQ8_0::quantize(x)
    }
}

/// Quantizes a row (length a multiple of 32) into `out` (one block per 32 values).
pub fn quantize_row(x: &[f32], out: &mut [BlockQ8_0]) -> crate::Result<()> {
    super::check_len("Q8_0 quantize input", out.len() * 32, x.len())?;
    for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
        *b = BlockQ8_0::quantize(x);
    }
    Ok(())
}
