//! Straightforward scalar references in f64, written for clarity rather than speed.
//!
//! Each takes the exact (already dtype-rounded) inputs the backend saw and returns the
//! expected outputs, plus, for ops that accumulate, a per-element magnitude for
//! [`super::Tolerance`].

use crate::{AttentionParams, RopeStyle};

/// RMSNorm of each `dim`-element row of `x`, times `w[i] + offset` when a weight is given.
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, offset: f32, eps: f32, dim: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(dim) {
        let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for (i, &v) in row.iter().enumerate() {
            let g = w.map_or(1.0, |w| w[i] as f64 + offset as f64);
            out.push(v as f64 * inv * g);
        }
    }
    out
}

/// RoPE with the angle rounded to f32 as the op specifies (`pos as f32 * inv_freq`), and
/// cos/sin and the rotation in f64. Magnitude: `|a cos| + |b sin|` per output.
pub fn rope(
    x: &[f32],
    positions: &[u32],
    inv_freq: &[f32],
    n_heads: usize,
    d: usize,
    style: RopeStyle,
) -> (Vec<f64>, Vec<f64>) {
    let half = d / 2;
    let mut out = vec![0.0; x.len()];
    let mut mag = vec![0.0; x.len()];
    for (t, &pos) in positions.iter().enumerate() {
        for h in 0..n_heads {
            let base = (t * n_heads + h) * d;
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = (pos as f32 * f) as f64;
                let (s, c) = angle.sin_cos();
                let (ia, ib) = match style {
                    RopeStyle::Neox => (base + i, base + i + half),
                    RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
                };
                let (a, b) = (x[ia] as f64, x[ib] as f64);
                out[ia] = a * c - b * s;
                out[ib] = b * c + a * s;
                let m = (a * c).abs() + (b * s).abs() + (b * c).abs() + (a * s).abs();
                mag[ia] = m;
                mag[ib] = m;
            }
        }
    }
    (out, mag)
}

/// `x [T, k] * w[n, k]^T`; magnitude `sum |x_i w_i|`.
pub fn matmul(x: &[f32], w: &[f32], k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(w.len(), n * k, "reference matmul: weight shape");
    let mut out = Vec::new();
    let mut mag = Vec::new();
    for xr in x.chunks(k) {
        for wr in w.chunks(k) {
            let (mut s, mut m) = (0.0, 0.0);
            for (&a, &b) in xr.iter().zip(wr) {
                s += a as f64 * b as f64;
                m += (a as f64 * b as f64).abs();
            }
            out.push(s);
            mag.push(m);
        }
    }
    (out, mag)
}

/// The tanh approximation of GELU, in f64.
pub fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// `x * sigmoid(x)`, in f64.
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `act(x)` by the definition.
pub fn activation(act: crate::Activation, x: f64) -> f64 {
    match act {
        crate::Activation::GeluTanh => gelu_tanh(x),
        crate::Activation::Silu => silu(x),
        crate::Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// Attention by the definition: masked scores, softmax, weighted sum of values.
/// Magnitude per output element: `sum_s p_s |v_s| * (1 + max_s sum_i |scale q_i k_si|)`,
/// since an error in a score moves its weight in proportion to the score's own size.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    q_pos: &[u32],
    k_pos: &[u32],
    p: &AttentionParams,
) -> (Vec<f64>, Vec<f64>) {
    let d = p.head_dim;
    let group = p.n_heads / p.n_kv_heads;
    let mut out = vec![0.0; q.len()];
    let mut mag = vec![0.0; q.len()];
    for (t, &qp) in q_pos.iter().enumerate() {
        for h in 0..p.n_heads {
            let kvh = h / group;
            let qrow = &q[(t * p.n_heads + h) * d..][..d];
            let mut scores = Vec::new();
            let mut score_mag: f64 = 0.0;
            for (s, &kp) in k_pos.iter().enumerate() {
                let visible = (!p.causal || kp <= qp)
                    && p.window.is_none_or(|w| (qp as i64 - kp as i64) < w as i64);
                if !visible {
                    continue;
                }
                let krow = &k[(s * p.n_kv_heads + kvh) * d..][..d];
                let mut dot = 0.0;
                let mut m = 0.0;
                for i in 0..d {
                    dot += qrow[i] as f64 * krow[i] as f64;
                    m += (qrow[i] as f64 * krow[i] as f64).abs();
                }
                let mut sc = dot * p.scale as f64;
                if let Some(cap) = p.softcap {
                    sc = cap as f64 * (sc / cap as f64).tanh();
                }
                score_mag = score_mag.max(m * p.scale.abs() as f64);
                scores.push((s, sc));
            }
            if scores.is_empty() {
                continue;
            }
            let max = scores.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|x| (x.1 - max).exp()).sum();
            let base = (t * p.n_heads + h) * d;
            for &(s, sc) in &scores {
                let pr = (sc - max).exp() / z;
                let vrow = &v[(s * p.n_kv_heads + kvh) * d..][..d];
                for i in 0..d {
                    out[base + i] += pr * vrow[i] as f64;
                    mag[base + i] += pr * (vrow[i] as f64).abs() * (1.0 + score_mag);
                }
            }
        }
    }
    (out, mag)
}
