//! Rotary position embedding, in place.
//!
//! The angle is `pos as f32 * inv_freq[i]` rounded to f32, then cos/sin in f32: exactly
//! what transformers computes. An f64 angle would be more accurate but at long positions
//! it drifts from the reference by up to `pos * 2^-24` radians (~0.01 at 128k), which shows
//! up in logit comparisons. A zero frequency gives cos = 1, sin = 0, an exact pass-through.

use super::buffer::CpuBuffer;
use super::par::for_each_row_mut;
use crate::error::ensure;
use crate::{Result, RopeParams, RopeStyle};

pub(crate) fn rope(
    x: &mut CpuBuffer,
    positions: &[u32],
    inv_freq: &CpuBuffer,
    p: RopeParams,
) -> Result<()> {
    const OP: &str = "rope";
    let d = p.head_dim;
    let half = d / 2;
    let x = x.f32s_mut(OP)?;
    let inv_freq = inv_freq.f32s(OP)?;
    ensure(d > 0 && d.is_multiple_of(2), OP, || {
        format!("head_dim {d} must be even")
    })?;
    ensure(inv_freq.len() == half, OP, || {
        format!(
            "inv_freq has {} entries, head_dim/2 is {half}",
            inv_freq.len()
        )
    })?;
    let row = p.n_heads * d;
    ensure(row > 0 && x.len() == positions.len() * row, OP, || {
        format!(
            "x has {} elements, {} positions x {} heads x {d}",
            x.len(),
            positions.len(),
            p.n_heads
        )
    })?;
    for_each_row_mut(x, row, |t, heads| {
        let pos = positions[t] as f32;
        let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq
            .iter()
            .map(|&f| {
                let angle = pos * f;
                (angle.cos(), angle.sin())
            })
            .unzip();
        for head in heads.chunks_exact_mut(d) {
            match p.style {
                RopeStyle::Neox => {
                    let (lo, hi) = head.split_at_mut(half);
                    for i in 0..half {
                        let (a, b) = (lo[i], hi[i]);
                        lo[i] = a * cos[i] - b * sin[i];
                        hi[i] = b * cos[i] + a * sin[i];
                    }
                }
                RopeStyle::Interleaved => {
                    for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * cos[i] - b * sin[i];
                        pair[1] = b * cos[i] + a * sin[i];
                    }
                }
            }
        }
    });
    Ok(())
}
