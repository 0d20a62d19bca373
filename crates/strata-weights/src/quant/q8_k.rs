//! Q8_K: the 256-value activation block the K-quants pair with in integer dot products.
//! Never stored in model files. `x ≈ d * q`; `bsums` holds the sum of each 16 codes so the
//! formats with per-group minimums need no second pass over the codes.

use super::ActivationBlock;

/// 292 bytes: f32 scale, 256 codes, 16 group sums.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8K {
    /// Block scale.
    pub d: f32,
    /// The signed 8-bit codes.
    pub qs: [i8; 256],
    /// Sum of the codes of each group of 16.
    pub bsums: [i16; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl BlockQ8K {
    /// The block of scale `d` and codes `qs`, with their group sums.
    pub(super) fn from_codes(d: f32, qs: [i8; 256]) -> Self {
        let mut bsums = [0i16; 16];
        for (s, q) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
            *s = q.iter().map(|&q| i16::from(q)).sum();
        }
        Self { d, qs, bsums }
    }

    /// Sum of the codes of group `g` when groups are `GROUP` (16 or 32) values long.
    #[inline]
    pub(super) fn group_sum<const GROUP: usize>(&self, g: usize) -> i32 {
        let per = GROUP / 16;
        self.bsums[g * per..(g + 1) * per]
            .iter()
            .map(|&s| i32::from(s))
            .sum()
    }
}

impl ActivationBlock for BlockQ8K {
    const ELEMS: usize = 256;

    /// Symmetric: `d = max|x| / 127`, codes rounded to nearest.
    fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), 256, "a Q8_K block holds 256 values");
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let mut qs = [0i8; 256];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        Self::from_codes(d, qs)
    }
}
