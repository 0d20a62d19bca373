//! The ops of Gemma-4's audio conformer that no text model has: a clamp, the light
//! convolution's causal depthwise filter, and chunked local attention with relative
//! positions. The slice functions are public so that the host audio tower
//! (`strata-model`'s `AudioTower`) runs the very same code.

use rayon::prelude::*;

use super::buffer::CpuBuffer;
use crate::error::ensure;
use crate::{ChunkedAttentionParams, DepthwiseConv, Result};

/// `x = x.clamp(lo, hi)` (NaN stays NaN).
pub(crate) fn clamp(x: &mut CpuBuffer, lo: f32, hi: f32) -> Result<()> {
    const OP: &str = "clamp";
    ensure(lo <= hi, OP, || format!("bounds {lo} > {hi}"))?;
    let x = x.f32s_mut(OP)?;
    x.par_chunks_mut(1 << 14)
        .for_each(|c| c.iter_mut().for_each(|v| *v = v.clamp(lo, hi)));
    Ok(())
}

/// Causal depthwise convolution over frames: `out[t, c] = sum_j w[c, j] x[t - K + 1 + j, c]`
/// for `x`, `out` `[frames, channels]` and `w` `[channels, K]`, frames before the first
/// reading zero; each sum in tap order.
pub fn depthwise_conv1d_causal_rows(x: &[f32], w: &[f32], p: DepthwiseConv, out: &mut [f32]) {
    let (c, k) = (p.channels, p.kernel);
    out.par_chunks_mut(c).enumerate().for_each(|(t, o)| {
        for (ch, o) in o.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for tap in 0..k {
                let src = t as isize + tap as isize - (k as isize - 1);
                if src >= 0 {
                    acc += w[ch * k + tap] * x[src as usize * c + ch];
                }
            }
            *o = acc;
        }
    });
}

pub(crate) fn depthwise_conv1d_causal(
    x: &CpuBuffer,
    w: &CpuBuffer,
    p: DepthwiseConv,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "depthwise_conv1d_causal";
    let (x, w, out) = (x.f32s(OP)?, w.f32s(OP)?, out.f32s_mut(OP)?);
    p.check_sizes(OP, x.len(), w.len(), out.len())?;
    depthwise_conv1d_causal_rows(x, w, p, out);
    Ok(())
}

/// [`crate::Backend::chunked_attention`] on slices, one head after another (in parallel):
/// for each block of `chunk` queries and each query in it, the logits of the `context`
/// frames from `left - 1` before the block's start, each `q . k + q' . rel_k[col]` (the
/// relative term read through transformers' relative shift: the block's `[chunk, positions]`
/// scores padded to rows of `context + 1` and read as rows of `context`), soft-capped, the
/// frames outside `[t - left + 2, t + right]` or past the clip set to `invalid_logit`;
/// softmax over them, then the values' weighted sum.
pub fn chunked_attention_rows(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    rel_k: &[f32],
    p: ChunkedAttentionParams,
    out: &mut [f32],
) {
    let (heads, d) = (p.n_heads, p.head_dim);
    let h = heads * d;
    let frames = q.len() / h;
    let (chunk, ctx, positions) = (p.chunk, p.context(), p.positions());
    let past = p.left - 1;
    let dot = |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| x * y).sum() };
    let blocks = frames.div_ceil(chunk);
    // Each head's output columns, computed apart and then scattered into `out`.
    let per_head: Vec<Vec<f32>> = (0..heads)
        .into_par_iter()
        .map(|hd| {
            let span = |t: usize| t * h + hd * d..t * h + (hd + 1) * d;
            let mut o_head = vec![0.0f32; frames * d];
            let mut bd = vec![0.0f32; chunk * positions];
            let mut logits = vec![0.0f32; ctx];
            for b in 0..blocks {
                // The block's queries against every relative position (padding queries: 0).
                for r in 0..chunk {
                    let i = b * chunk + r;
                    for pos in 0..positions {
                        bd[r * positions + pos] = if i < frames {
                            dot(
                                &q[span(i)],
                                &rel_k[pos * h + hd * d..pos * h + (hd + 1) * d],
                            )
                        } else {
                            0.0
                        };
                    }
                }
                for u in 0..chunk {
                    let i = b * chunk + u;
                    if i >= frames {
                        break;
                    }
                    let qi = &q[span(i)];
                    let mut max = f32::NEG_INFINITY;
                    for (cidx, logit) in logits.iter_mut().enumerate() {
                        let j = (b * chunk + cidx) as isize - past as isize;
                        let inside = j >= 0 && (j as usize) < frames;
                        let ac = if inside {
                            dot(qi, &k[span(j as usize)])
                        } else {
                            0.0
                        };
                        let flat = u * ctx + cidx;
                        let (row, col) = (flat / (ctx + 1), flat % (ctx + 1));
                        let rel = if col < positions {
                            bd[row * positions + col]
                        } else {
                            0.0
                        };
                        let mut s = ((ac + rel) / p.logit_cap).tanh() * p.logit_cap;
                        let dist = i as isize - j;
                        let seen = (dist >= 0 && dist < past as isize)
                            || (dist < 0 && -dist < p.right as isize);
                        if !(inside && seen) {
                            s = p.invalid_logit;
                        }
                        *logit = s;
                        max = max.max(s);
                    }
                    let mut total = 0.0f32;
                    for s in logits.iter_mut() {
                        *s = (*s - max).exp();
                        total += *s;
                    }
                    let o = &mut o_head[i * d..(i + 1) * d];
                    for (cidx, &s) in logits.iter().enumerate() {
                        let j = (b * chunk + cidx) as isize - past as isize;
                        if s == 0.0 || j < 0 || j as usize >= frames {
                            continue;
                        }
                        let w = s / total;
                        let vj = &v[span(j as usize)];
                        o.iter_mut().zip(vj).for_each(|(a, b)| *a += w * b);
                    }
                }
            }
            o_head
        })
        .collect();
    for (hd, o_head) in per_head.iter().enumerate() {
        for t in 0..frames {
            out[t * h + hd * d..t * h + (hd + 1) * d].copy_from_slice(&o_head[t * d..(t + 1) * d]);
        }
    }
}

pub(crate) fn chunked_attention(
    q: &CpuBuffer,
    k: &CpuBuffer,
    v: &CpuBuffer,
    rel_k: &CpuBuffer,
    p: ChunkedAttentionParams,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "chunked_attention";
    let (q, k, v, rel_k) = (q.f32s(OP)?, k.f32s(OP)?, v.f32s(OP)?, rel_k.f32s(OP)?);
    let out = out.f32s_mut(OP)?;
    p.check_sizes(OP, (q.len(), k.len(), v.len(), rel_k.len(), out.len()))?;
    chunked_attention_rows(q, k, v, rel_k, p, out);
    Ok(())
}
