//! Gemma-4's vision tower, on the host in f32: image patches -> soft tokens in the text
//! model's width, as transformers 5.17's `Gemma4VisionModel` and `embed_vision` compute them.
//! This is the CPU reference the device version is to be tested against.
//!
//! One image: its patches (`3 * patch^2` values in [0, 1] each, as the image processor lays
//! them out) with their (x, y) positions, (-1, -1) marking padding. Then:
//! 1. patch embedding: `input_proj(2 * (p - 0.5))` plus the x and y rows of the position
//!    table (none for padding);
//! 2. encoder layers: sandwich-normed bidirectional attention over the image's patches
//!    (padding masked as keys) with per-head q/k RMSNorm, a scale-free v norm, 2-D axial
//!    RoPE (x rotates the first half of each head, y the second, each in neox halves) and
//!    attention scale 1; then a gated gelu-tanh MLP;
//! 3. pooling: each `k x k` block of patches averaged by position (`k` the pooling kernel;
//!    padding contributes nothing), scaled by `sqrt(hidden)`, padding rows dropped, then
//!    standardized (`(h - std_bias) * std_scale`) when the config says so;
//! 4. the embedder: a scale-free RMSNorm, then a projection to the text width.

use std::path::Path;

use rayon::prelude::*;

use strata_config::VisionConfig;
use strata_kernels::cpu::gelu_tanh;
use strata_weights::{WeightSource, Weights};

use crate::error::{ModelError, Result};
use crate::host_ops::{gemm_bt, norm_in_place, rms_norm, HostLinear};

pub(crate) struct Layer {
    pub(crate) input_norm: Vec<f32>,
    pub(crate) post_attention_norm: Vec<f32>,
    pub(crate) pre_feedforward_norm: Vec<f32>,
    pub(crate) post_feedforward_norm: Vec<f32>,
    pub(crate) q: HostLinear,
    pub(crate) k: HostLinear,
    pub(crate) v: HostLinear,
    pub(crate) o: HostLinear,
    pub(crate) q_norm: Vec<f32>,
    pub(crate) k_norm: Vec<f32>,
    pub(crate) gate: HostLinear,
    pub(crate) up: HostLinear,
    pub(crate) down: HostLinear,
}

/// One image's outputs.
#[derive(Clone, Debug)]
pub struct EncodedImage {
    /// The encoder's last hidden state, `[patches, hidden]` (padding rows included).
    pub encoder: Vec<f32>,
    /// The tower's output after pooling and standardizing, `[tokens, hidden]`.
    pub vision: Vec<f32>,
    /// The soft tokens, `[tokens, text hidden]`.
    pub soft_tokens: Vec<f32>,
    /// Soft tokens: the image's (non-padding) patches over the pooling kernel's area.
    pub tokens: usize,
}

/// Gemma-4's vision tower and its embedder, loaded from a multimodal checkpoint.
pub struct VisionTower {
    cfg: VisionConfig,
    input_proj: HostLinear,
    /// `[2, position_embedding_size, hidden]`: x rows, then y rows.
    positions: Vec<f32>,
    layers: Vec<Layer>,
    /// `(std_bias, std_scale)` when the config standardizes.
    standardize: Option<(Vec<f32>, Vec<f32>)>,
    embed: HostLinear,
}

const TOWER: &str = "model.vision_tower.";

impl VisionTower {
    /// The tower of the checkpoint at `dir`; `None` when its config has no `vision_config`.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let Some(cfg) = VisionConfig::load(dir)? else {
            return Ok(None);
        };
        let weights = Weights::open(dir)?;
        Self::from_weights(cfg, &weights).map(Some)
    }

    /// The tower from `weights` (HF names, `model.vision_tower.` and `model.embed_vision.`).
    pub fn from_weights(cfg: VisionConfig, weights: &Weights) -> Result<Self> {
        let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            Ok(weights.require(name, shape)?.to_f32_vec()?)
        };
        let (h, inner, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let mat = |name: &str, rows, cols| HostLinear::load(weights, name, rows, cols);
        let linear = |prefix: &str, rows, cols| {
            HostLinear::load_clippable(weights, prefix, rows, cols, cfg.clipped_linears)
        };
        let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
        let layers = (0..cfg.num_layers)
            .map(|l| {
                let p = format!("{TOWER}encoder.layers.{l}.");
                let norm = |n: &str| get(&format!("{p}{n}.weight"), &[h]);
                Ok(Layer {
                    input_norm: norm("input_layernorm")?,
                    post_attention_norm: norm("post_attention_layernorm")?,
                    pre_feedforward_norm: norm("pre_feedforward_layernorm")?,
                    post_feedforward_norm: norm("post_feedforward_layernorm")?,
                    q: linear(&format!("{p}self_attn.q_proj"), qd, h)?,
                    k: linear(&format!("{p}self_attn.k_proj"), kvd, h)?,
                    v: linear(&format!("{p}self_attn.v_proj"), kvd, h)?,
                    o: linear(&format!("{p}self_attn.o_proj"), h, qd)?,
                    q_norm: get(&format!("{p}self_attn.q_norm.weight"), &[d])?,
                    k_norm: get(&format!("{p}self_attn.k_norm.weight"), &[d])?,
                    gate: linear(&format!("{p}mlp.gate_proj"), inner, h)?,
                    up: linear(&format!("{p}mlp.up_proj"), inner, h)?,
                    down: linear(&format!("{p}mlp.down_proj"), h, inner)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let patch = 3 * cfg.patch_size * cfg.patch_size;
        let standardize = if cfg.standardize {
            Some((
                get(&format!("{TOWER}std_bias"), &[h])?,
                get(&format!("{TOWER}std_scale"), &[h])?,
            ))
        } else {
            None
        };
        Ok(Self {
            input_proj: mat(
                &format!("{TOWER}patch_embedder.input_proj.weight"),
                h,
                patch,
            )?,
            positions: get(
                &format!("{TOWER}patch_embedder.position_embedding_table"),
                &[2, cfg.position_embedding_size, h],
            )?,
            layers,
            standardize,
            embed: mat(
                "model.embed_vision.embedding_projection.weight",
                cfg.text_hidden_size,
                h,
            )?,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    pub(crate) fn layers(&self) -> &[Layer] {
        &self.layers
    }

    pub(crate) fn input_proj(&self) -> &HostLinear {
        &self.input_proj
    }

    pub(crate) fn embedder(&self) -> &HostLinear {
        &self.embed
    }

    pub(crate) fn position_table(&self) -> &[f32] {
        &self.positions
    }

    pub(crate) fn standardization(&self) -> Option<(&[f32], &[f32])> {
        self.standardize
            .as_ref()
            .map(|(b, s)| (b.as_slice(), s.as_slice()))
    }

    /// Encodes one image: `pixels [patches, 3 * patch^2]`, `positions [patches]` as (x, y),
    /// (-1, -1) for padding. The patch count must be the pooling kernel's area times the
    /// soft tokens asked for (transformers' `output_length`), padding included.
    pub fn encode(&self, pixels: &[f32], positions: &[[i64; 2]]) -> Result<EncodedImage> {
        let c = &self.cfg;
        let (h, n) = (c.hidden_size, positions.len());
        check_pixels(c, pixels, n)?;
        let pad: Vec<bool> = positions.iter().map(|p| p[0] == -1 && p[1] == -1).collect();
        for (i, p) in positions.iter().enumerate() {
            let bad = |v: i64| v < -1 || v >= c.position_embedding_size as i64;
            if !pad[i] && (bad(p[0]) || bad(p[1]) || p[0] < 0 || p[1] < 0) {
                return Err(ModelError::Invalid(format!(
                    "patch {i} at ({}, {}) is outside the {} positions of an axis",
                    p[0], p[1], c.position_embedding_size
                )));
            }
        }
        // 1. Patch embedding.
        let scaled: Vec<f32> = pixels.iter().map(|&v| 2.0 * (v - 0.5)).collect();
        let mut x = self.input_proj.apply(&scaled)?;
        let table = c.position_embedding_size * h;
        for (i, row) in x.chunks_exact_mut(h).enumerate() {
            if pad[i] {
                continue;
            }
            let (px, py) = (positions[i][0] as usize, positions[i][1] as usize);
            let ex = &self.positions[px * h..(px + 1) * h];
            let ey = &self.positions[table + py * h..table + (py + 1) * h];
            for ((o, a), b) in row.iter_mut().zip(ex).zip(ey) {
                *o += a + b;
            }
        }
        // 2. Encoder layers.
        let rope = AxialRope::new(c.head_dim, c.rope_theta, positions);
        for layer in &self.layers {
            let normed = rms_norm(&x, h, Some(&layer.input_norm), c.rms_norm_eps);
            let attn = self.attention(layer, &normed, &rope, &pad)?;
            let attn = rms_norm(&attn, h, Some(&layer.post_attention_norm), c.rms_norm_eps);
            x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
            let normed = rms_norm(&x, h, Some(&layer.pre_feedforward_norm), c.rms_norm_eps);
            let gate = layer.gate.apply(&normed)?;
            let up = layer.up.apply(&normed)?;
            let act: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(&g, &u)| gelu_tanh(g) * u)
                .collect();
            let mlp = layer.down.apply(&act)?;
            let mlp = rms_norm(&mlp, h, Some(&layer.post_feedforward_norm), c.rms_norm_eps);
            x.iter_mut().zip(&mlp).for_each(|(a, b)| *a += b);
        }
        let encoder = x.clone();
        // 3. Pooling.
        let k = c.pooling_kernel_size;
        let out_len = n / (k * k);
        if out_len == 0 || out_len * k * k != n {
            return Err(ModelError::Invalid(format!(
                "{n} patches are not a whole number of {k}x{k} pooling blocks"
            )));
        }
        for (row, &p) in x.chunks_exact_mut(h).zip(&pad) {
            if p {
                row.fill(0.0);
            }
        }
        let (mut pooled, mut keep) = (x, vec![true; n]);
        if n != out_len {
            let mut sums = vec![0.0f32; out_len * h];
            keep = vec![false; out_len];
            for (i, idx) in pool_bins(positions, k)?.into_iter().enumerate() {
                keep[idx] = true;
                let src = &pooled[i * h..(i + 1) * h];
                for (o, v) in sums[idx * h..(idx + 1) * h].iter_mut().zip(src) {
                    *o += v / (k * k) as f32;
                }
            }
            pooled = sums;
        }
        let root = (h as f32).sqrt();
        let mut vision = Vec::new();
        for (row, &kept) in pooled.chunks_exact(h).zip(&keep) {
            if kept {
                vision.extend(row.iter().map(|v| v * root));
            }
        }
        if let Some((bias, scale)) = &self.standardize {
            for row in vision.chunks_exact_mut(h) {
                for ((v, b), s) in row.iter_mut().zip(bias).zip(scale) {
                    *v = (*v - b) * s;
                }
            }
        }
        // 4. The embedder.
        let normed = rms_norm(&vision, h, None, c.rms_norm_eps);
        let soft_tokens = self.embed.apply(&normed)?;
        Ok(EncodedImage {
            tokens: vision.len() / h,
            encoder,
            vision,
            soft_tokens,
        })
    }

    /// Bidirectional attention over the image's patches; padding is masked as keys.
    fn attention(&self, l: &Layer, x: &[f32], rope: &AxialRope, pad: &[bool]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let (d, heads, kv_heads) = (c.head_dim, c.num_heads, c.num_kv_heads);
        let n = pad.len();
        let mut q = l.q.apply(x)?;
        let mut k = l.k.apply(x)?;
        let mut v = l.v.apply(x)?;
        for (row, i) in q
            .chunks_exact_mut(d)
            .zip((0..n).flat_map(|i| (0..heads).map(move |_| i)))
        {
            norm_in_place(row, Some(&l.q_norm), c.rms_norm_eps);
            rope.apply(row, i);
        }
        for (row, i) in k
            .chunks_exact_mut(d)
            .zip((0..n).flat_map(|i| (0..kv_heads).map(move |_| i)))
        {
            norm_in_place(row, Some(&l.k_norm), c.rms_norm_eps);
            rope.apply(row, i);
        }
        for row in v.chunks_exact_mut(d) {
            norm_in_place(row, None, c.rms_norm_eps);
        }
        let group = heads / kv_heads;
        let mut out = vec![0.0f32; n * heads * d];
        // Per head, as two products (scale 1): scores = q k^T, padding keys masked,
        // softmax by rows, then p v (v transposed into the weight's place).
        let gather = |src: &[f32], stride_heads: usize, h: usize| -> Vec<f32> {
            src.chunks_exact(stride_heads * d)
                .flat_map(|row| row[h * d..(h + 1) * d].iter().copied())
                .collect()
        };
        for kh in 0..kv_heads {
            let kk = gather(&k, kv_heads, kh);
            let vh = gather(&v, kv_heads, kh);
            let mut vt = vec![0.0f32; d * n];
            for (j, row) in vh.chunks_exact(d).enumerate() {
                for (c, &val) in row.iter().enumerate() {
                    vt[c * n + j] = val;
                }
            }
            for hd in kh * group..(kh + 1) * group {
                let mut probs = gemm_bt(&gather(&q, heads, hd), &kk, n, d)?;
                probs.par_chunks_exact_mut(n).for_each(|row| {
                    let mut max = f32::NEG_INFINITY;
                    for (s, &masked) in row.iter_mut().zip(pad) {
                        if masked {
                            *s = f32::NEG_INFINITY;
                        }
                        max = max.max(*s);
                    }
                    let mut total = 0.0f32;
                    for s in row.iter_mut() {
                        *s = (*s - max).exp();
                        total += *s;
                    }
                    row.iter_mut().for_each(|s| *s /= total);
                });
                let oh = gemm_bt(&probs, &vt, d, n)?;
                for (dst, src) in out.chunks_exact_mut(heads * d).zip(oh.chunks_exact(d)) {
                    dst[hd * d..(hd + 1) * d].copy_from_slice(src);
                }
            }
        }
        l.o.apply(&out)
    }
}

/// That `pixels` holds `n` patches of the tower's size.
pub(crate) fn check_pixels(c: &VisionConfig, pixels: &[f32], n: usize) -> Result<()> {
    let patch = 3 * c.patch_size * c.patch_size;
    if pixels.len() != n * patch {
        return Err(ModelError::Invalid(format!(
            "an image of {n} patches needs {} pixel values, got {}",
            n * patch,
            pixels.len()
        )));
    }
    Ok(())
}

/// The soft token each patch pools into: `k x k` blocks of patches by position, numbered
/// row by row; patch order itself when `k` is 1. Padding (negative positions) counts as 0.
pub(crate) fn pool_bins(positions: &[[i64; 2]], k: usize) -> Result<Vec<usize>> {
    let n = positions.len();
    let out_len = n / (k * k);
    if k == 1 {
        return Ok((0..n).collect());
    }
    let clamped = |i: usize, a: usize| positions[i][a].max(0) as usize;
    let max_x = (0..n).map(|i| clamped(i, 0)).max().unwrap_or(0) + 1;
    (0..n)
        .map(|i| {
            let idx = clamped(i, 0) / k + (max_x / k) * (clamped(i, 1) / k);
            if idx >= out_len {
                return Err(ModelError::Invalid(format!(
                    "patch {i} pools into soft token {idx} of {out_len}: the positions do \
                     not tile the image"
                )));
            }
            Ok(idx)
        })
        .collect()
}

/// The axial RoPE's `head_dim / 4` frequencies, one set for each axis: as transformers,
/// f32 frequencies (and f32 angles).
pub(crate) fn axial_inv_freq(head_dim: usize, theta: f64) -> Vec<f32> {
    let spatial = (head_dim / 2) as f32;
    (0..head_dim / 4)
        .map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / spatial))
        .collect()
}

/// The axial RoPE's angles per patch: x turns the first half of a head, y the second; each
/// half rotates its own halves (neox) at `head_dim / 4` frequencies.
struct AxialRope {
    /// Per patch: cos and sin of `[x freqs, y freqs]`, `head_dim / 2` each.
    cos: Vec<f32>,
    sin: Vec<f32>,
    quarter: usize,
}

impl AxialRope {
    fn new(head_dim: usize, theta: f64, positions: &[[i64; 2]]) -> Self {
        let quarter = head_dim / 4;
        let inv = axial_inv_freq(head_dim, theta);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in positions {
            for &coord in p {
                for &f in &inv {
                    let a = coord as f32 * f;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        Self { cos, sin, quarter }
    }

    fn apply(&self, row: &mut [f32], patch: usize) {
        let q = self.quarter;
        for axis in 0..2 {
            let part = &mut row[axis * 2 * q..(axis + 1) * 2 * q];
            let at = (patch * 2 + axis) * q;
            for j in 0..q {
                let (c, s) = (self.cos[at + j], self.sin[at + j]);
                let (a, b) = (part[j], part[j + q]);
                part[j] = a * c - b * s;
                part[j + q] = b * c + a * s;
            }
        }
    }
}
