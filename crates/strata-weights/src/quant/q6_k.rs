//! Q6_K: 256 values in 16 groups of 16, symmetric. `y = (d * sc[g]) * q` with a signed 8-bit
//! group scale and `q` in -32..32 (stored +32 as 6 bits). `d` comes last in the block.
//!
//! Codes: element `e = 128 h + r`: low 4 bits from `ql[64 h + r % 64]` (low nibble when
//! `r < 64`), high 2 bits from `qh[32 h + r % 32]` shifted right by `2 (r / 32)`.

use super::k_common::{dot_symmetric, idot_symmetric};
use super::{BlockQ8K, F16Le, QuantBlock};
use strata_gguf::GgmlType;

/// 210 bytes: 128 bytes of low nibbles, 64 of high bits, 16 scales, `d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    /// The low 4 bits of each code.
    pub ql: [u8; 128],
    /// The high 2 bits of each code.
    pub qh: [u8; 64],
    /// Signed 8-bit group scales.
    pub scales: [i8; 16],
    /// Super-block scale.
    pub d: F16Le,
}

const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// Byte/shift positions of element `e`'s low nibble and high bits.
#[inline]
fn positions(e: usize) -> (usize, u32, usize, u32) {
    let (h, r) = (e / 128, e % 128);
    (
        64 * h + r % 64,
        4 * (r / 64) as u32,
        32 * h + r % 32,
        2 * (r / 32) as u32,
    )
}

impl BlockQ6K {
    /// The 256 signed codes in element order (the layout of [`positions`], unrolled).
    fn codes(&self) -> [i8; 256] {
        let mut q = [0i8; 256];
        for h in 0..2 {
            for l in 0..32 {
                let (lo0, lo1, hi) = (
                    self.ql[64 * h + l],
                    self.ql[64 * h + 32 + l],
                    self.qh[32 * h + l],
                );
                let code = |nibble: u8, shift: u32| {
                    ((nibble & 15) | (((hi >> shift) & 3) << 4)) as i8 - 32
                };
                q[128 * h + l] = code(lo0, 0);
                q[128 * h + 32 + l] = code(lo1, 2);
                q[128 * h + 64 + l] = code(lo0 >> 4, 4);
                q[128 * h + 96 + l] = code(lo1 >> 4, 6);
            }
        }
        q
    }

    /// Quantizes 256 values. Group scales are rounded up so no code is clamped: each value's
    /// error is at most half its group's step `d * sc[g]` (up to f32 rounding).
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), 256, "a Q6_K block holds 256 values");
        let need: [f32; 16] = std::array::from_fn(|g| {
            x[16 * g..16 * (g + 1)]
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()))
                / 31.0
        });
        let d = F16Le::round_up(need.iter().fold(0.0f32, |m, &v| m.max(v)) / 127.0);
        let df = d.to_f32();
        let scales: [i8; 16] = need.map(|n| {
            if df > 0.0 {
                (n / df).ceil().clamp(0.0, 127.0) as i8
            } else {
                0
            }
        });
        let mut ql = [0u8; 128];
        let mut qh = [0u8; 64];
        for (e, &v) in x.iter().enumerate() {
            let step = df * f32::from(scales[e / 16]);
            let q = if step > 0.0 {
                (v / step).round().clamp(-32.0, 31.0) as i32
            } else {
                0
            };
            let u = (q + 32) as u8;
            let (lb, ls, hb, hs) = positions(e);
            ql[lb] |= (u & 15) << ls;
            qh[hb] |= (u >> 4) << hs;
        }
        Self { ql, qh, scales, d }
    }
}

impl QuantBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const ELEMS: usize = 256;
    type Activation = BlockQ8K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let codes = self.codes();
        for (g, (o, q)) in out[..256]
            .chunks_exact_mut(16)
            .zip(codes.chunks_exact(16))
            .enumerate()
        {
            let dl = d * f32::from(self.scales[g]);
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * f32::from(q);
            }
        }
    }

    fn dot(&self, x: &[f32]) -> f32 {
        dot_symmetric::<16>(&self.codes(), &self.scales, self.d.to_f32(), x)
    }

    fn dot_q8(&self, a: &BlockQ8K) -> f32 {
        let s = idot_symmetric::<16>(&self.codes(), &self.scales, a);
        a.d * self.d.to_f32() * s as f32
    }
}

/// Quantizes a row (length a multiple of 256) into `out`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ6K]) -> crate::Result<()> {
    super::check_len("Q6_K quantize input", out.len() * 256, x.len())?;
    for (b, x) in out.iter_mut().zip(x.chunks_exact(256)) {
        *b = BlockQ6K::quantize(x);
    }
    Ok(())
}
