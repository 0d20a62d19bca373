//! Gemma-4's audio tower, on the host in f32: log-mel frames -> soft tokens in the text
//! model's width, as transformers 5.17's `Gemma4AudioModel` and `embed_audio` compute them.
//! This is the CPU reference a device version is to be tested against.
//!
//! 1. subsampling: two 3x3 stride-2 convolutions over (time, mel bin), each followed by a
//!    LayerNorm over its channels and a ReLU; the (bin, channel) grid of each frame is then
//!    projected to the conformer's width (4x fewer frames);
//! 2. conformer layers: a half-weighted feed-forward block, chunked local self-attention
//!    with relative positions (queries in blocks of `chunk_size`; a query sees itself and
//!    `context_left - 2` frames before it; logits soft-capped), a light convolution (GLU,
//!    causal depthwise convolution, RMSNorm, SiLU), a second feed-forward block and an
//!    RMSNorm, with activations clamped to `gradient_clipping` around each block;
//! 3. an output projection (with bias), then the embedder: a scale-free RMSNorm and a
//!    projection to the text width.

use std::path::Path;

use strata_config::AudioConfig;
use strata_kernels::cpu::silu;
use strata_weights::{WeightSource, Weights};

use crate::error::{ModelError, Result};
use crate::host_ops::{gemm_bt, rms_norm, HostLinear};

pub(crate) struct FeedForward {
    pub(crate) pre_norm: Vec<f32>,
    pub(crate) post_norm: Vec<f32>,
    pub(crate) up: HostLinear,
    pub(crate) down: HostLinear,
}

pub(crate) struct Attention {
    pub(crate) q: HostLinear,
    pub(crate) k: HostLinear,
    pub(crate) v: HostLinear,
    pub(crate) post: HostLinear,
    /// `[hidden, hidden]`: the relative position table's projection to keys.
    pub(crate) relative_k: Vec<f32>,
    /// `[head_dim]`: softplus of it scales the queries per dimension.
    pub(crate) per_dim_scale: Vec<f32>,
}

pub(crate) struct LightConv {
    pub(crate) pre_norm: Vec<f32>,
    pub(crate) start: HostLinear,
    pub(crate) end: HostLinear,
    /// `[hidden, kernel]`: one causal filter per channel.
    pub(crate) depthwise: Vec<f32>,
    pub(crate) conv_norm: Vec<f32>,
}

pub(crate) struct Layer {
    pub(crate) ff1: FeedForward,
    pub(crate) ff2: FeedForward,
    pub(crate) attn: Attention,
    pub(crate) lconv: LightConv,
    pub(crate) norm_pre_attn: Vec<f32>,
    pub(crate) norm_post_attn: Vec<f32>,
    pub(crate) norm_out: Vec<f32>,
}

/// One clip's outputs.
#[derive(Clone, Debug)]
pub struct EncodedAudio {
    /// The tower's output, `[tokens, output_dims]`.
    pub tower: Vec<f32>,
    /// The soft tokens, `[tokens, text hidden]`.
    pub soft_tokens: Vec<f32>,
    /// Soft tokens: the frames over 4 (two stride-2 convolutions).
    pub tokens: usize,
}

/// Gemma-4's audio tower and its embedder, loaded from a multimodal checkpoint.
pub struct AudioTower {
    cfg: AudioConfig,
    /// `[c0, 1, 3, 3]` and `[c1, c0, 3, 3]`, with their LayerNorm weights.
    conv: [(Vec<f32>, Vec<f32>); 2],
    input_proj: Vec<f32>,
    layers: Vec<Layer>,
    out_w: Vec<f32>,
    out_b: Vec<f32>,
    embed: Vec<f32>,
    /// `[positions, hidden]`: the sinusoidal table of relative distances, farthest first.
    rel_pos: Vec<f32>,
}

const TOWER: &str = "model.audio_tower.";

impl AudioTower {
    /// The tower of the checkpoint at `dir`; `None` when its config has no `audio_config`.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let Some(cfg) = AudioConfig::load(dir)? else {
            return Ok(None);
        };
        let weights = Weights::open(dir)?;
        Self::from_weights(cfg, &weights).map(Some)
    }

    /// The tower from `weights` (HF names, `model.audio_tower.` and `model.embed_audio.`).
    pub fn from_weights(cfg: AudioConfig, weights: &Weights) -> Result<Self> {
        let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            Ok(weights.require(name, shape)?.to_f32_vec()?)
        };
        let h = cfg.hidden_size;
        let [c0, c1] = cfg.subsampling_channels;
        let clippable = |prefix: &str, rows, cols| {
            HostLinear::load_clippable(weights, prefix, rows, cols, cfg.clipped_linears)
        };
        let ff = |p: &str| -> Result<FeedForward> {
            Ok(FeedForward {
                pre_norm: get(&format!("{p}.pre_layer_norm.weight"), &[h])?,
                post_norm: get(&format!("{p}.post_layer_norm.weight"), &[h])?,
                up: clippable(&format!("{p}.ffw_layer_1"), 4 * h, h)?,
                down: clippable(&format!("{p}.ffw_layer_2"), h, 4 * h)?,
            })
        };
        let d = h / cfg.num_heads;
        let layers = (0..cfg.num_layers)
            .map(|l| {
                let p = format!("{TOWER}layers.{l}.");
                let a = format!("{p}self_attn");
                let c = format!("{p}lconv1d");
                Ok(Layer {
                    ff1: ff(&format!("{p}feed_forward1"))?,
                    ff2: ff(&format!("{p}feed_forward2"))?,
                    attn: Attention {
                        q: clippable(&format!("{a}.q_proj"), h, h)?,
                        k: clippable(&format!("{a}.k_proj"), h, h)?,
                        v: clippable(&format!("{a}.v_proj"), h, h)?,
                        post: clippable(&format!("{a}.post"), h, h)?,
                        relative_k: get(&format!("{a}.relative_k_proj.weight"), &[h, h])?,
                        per_dim_scale: get(&format!("{a}.per_dim_scale"), &[d])?,
                    },
                    lconv: LightConv {
                        pre_norm: get(&format!("{c}.pre_layer_norm.weight"), &[h])?,
                        start: clippable(&format!("{c}.linear_start"), 2 * h, h)?,
                        end: clippable(&format!("{c}.linear_end"), h, h)?,
                        depthwise: get(
                            &format!("{c}.depthwise_conv1d.weight"),
                            &[h, 1, cfg.conv_kernel_size],
                        )?,
                        conv_norm: get(&format!("{c}.conv_norm.weight"), &[h])?,
                    },
                    norm_pre_attn: get(&format!("{p}norm_pre_attn.weight"), &[h])?,
                    norm_post_attn: get(&format!("{p}norm_post_attn.weight"), &[h])?,
                    norm_out: get(&format!("{p}norm_out.weight"), &[h])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let s = format!("{TOWER}subsample_conv_projection.");
        let conv = [
            (
                get(&format!("{s}layer0.conv.weight"), &[c0, 1, 3, 3])?,
                get(&format!("{s}layer0.norm.weight"), &[c0])?,
            ),
            (
                get(&format!("{s}layer1.conv.weight"), &[c1, c0, 3, 3])?,
                get(&format!("{s}layer1.norm.weight"), &[c1])?,
            ),
        ];
        let rel_pos = relative_positions(cfg.context_size(), h);
        Ok(Self {
            input_proj: get(&format!("{s}input_proj_linear.weight"), &[h, c0 / 4 * c1])?,
            conv,
            layers,
            out_w: get(&format!("{TOWER}output_proj.weight"), &[cfg.output_dims, h])?,
            out_b: get(&format!("{TOWER}output_proj.bias"), &[cfg.output_dims])?,
            embed: get(
                "model.embed_audio.embedding_projection.weight",
                &[cfg.text_hidden_size, cfg.output_dims],
            )?,
            rel_pos,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AudioConfig {
        &self.cfg
    }

    /// Encodes one clip: `features [frames, bins]` row-major, every frame valid, `bins` the
    /// first subsampling convolution's channel count (the feature extractor's mel bins).
    pub fn encode(&self, features: &[f32], bins: usize) -> Result<EncodedAudio> {
        let c = &self.cfg;
        let (flat, frames) = self.subsample(features, bins)?;
        let mut h = gemm_bt(&flat, &self.input_proj, c.hidden_size, flat.len() / frames)?;
        // 2. Conformer layers.
        for layer in &self.layers {
            h = self.layer(layer, h, frames)?;
        }
        // 3. Output projection and embedder.
        let mut tower = gemm_bt(&h, &self.out_w, c.output_dims, c.hidden_size)?;
        for row in tower.chunks_exact_mut(c.output_dims) {
            row.iter_mut().zip(&self.out_b).for_each(|(v, b)| *v += b);
        }
        let normed = rms_norm(&tower, c.output_dims, None, c.rms_norm_eps);
        let soft_tokens = gemm_bt(&normed, &self.embed, c.text_hidden_size, c.output_dims)?;
        Ok(EncodedAudio {
            tower,
            soft_tokens,
            tokens: frames,
        })
    }

    /// The subsampling convolutions of `features [frames, bins]`: `[frames', width]` rows
    /// (each frame's (bin, channel) grid, bins outer) for the input projection, and
    /// `frames'` (a quarter of the frames).
    pub(crate) fn subsample(&self, features: &[f32], bins: usize) -> Result<(Vec<f32>, usize)> {
        let c = &self.cfg;
        let [c0, c1] = c.subsampling_channels;
        if bins != c0 || features.is_empty() || !features.len().is_multiple_of(bins) {
            return Err(ModelError::Invalid(format!(
                "audio features of {} values in frames of {bins} bins; the tower takes frames of {c0}",
                features.len()
            )));
        }
        let frames = features.len() / bins;
        let eps = c.rms_norm_eps;
        // 1. Subsampling.
        let (x, t1, f1) = conv_block(features, 1, frames, bins, &self.conv[0], c0, eps as f32)?;
        let (x, t2, f2) = conv_block(&x, c0, t1, f1, &self.conv[1], c1, eps as f32)?;
        let width = f2 * c1;
        if width != c0 / 4 * c1 {
            return Err(ModelError::Invalid(format!(
                "{bins} bins subsample to {f2} x {c1}, not the projection's {}",
                c0 / 4 * c1
            )));
        }
        // [c1, t2, f2] -> [t2, f2 * c1] (bins outer, channels inner).
        let mut flat = vec![0.0f32; t2 * width];
        for ch in 0..c1 {
            for t in 0..t2 {
                for f in 0..f2 {
                    flat[t * width + f * c1 + ch] = x[(ch * t2 + t) * f2 + f];
                }
            }
        }
        Ok((flat, t2))
    }

    /// The conformer layers.
    pub(crate) fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// `[hidden, width]`: the input projection after subsampling.
    pub(crate) fn input_proj(&self) -> &[f32] {
        &self.input_proj
    }

    /// The output projection `[output_dims, hidden]` and its bias.
    pub(crate) fn output_proj(&self) -> (&[f32], &[f32]) {
        (&self.out_w, &self.out_b)
    }

    /// `[text hidden, output_dims]`: the embedder's projection.
    pub(crate) fn embedder(&self) -> &[f32] {
        &self.embed
    }

    /// `[positions, hidden]`: the relative-position table.
    pub(crate) fn relative_positions(&self) -> &[f32] {
        &self.rel_pos
    }

    fn clip(&self, x: &mut [f32]) {
        let g = self.cfg.gradient_clipping.min(f32::MAX as f64) as f32;
        x.iter_mut().for_each(|v| *v = v.clamp(-g, g));
    }

    fn feed_forward(&self, ff: &FeedForward, x: Vec<f32>) -> Result<Vec<f32>> {
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps);
        let mut y = x.clone();
        self.clip(&mut y);
        let y = rms_norm(&y, h, Some(&ff.pre_norm), eps);
        let mut y = ff.up.apply(&y)?;
        y.iter_mut().for_each(|v| *v = silu(*v));
        let mut y = ff.down.apply(&y)?;
        self.clip(&mut y);
        let y = rms_norm(&y, h, Some(&ff.post_norm), eps);
        let w = self.cfg.residual_weight as f32;
        Ok(y.iter().zip(&x).map(|(a, r)| a * w + r).collect())
    }

    fn layer(&self, l: &Layer, x: Vec<f32>, frames: usize) -> Result<Vec<f32>> {
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps);
        let x = self.feed_forward(&l.ff1, x)?;
        let mut a = x.clone();
        self.clip(&mut a);
        let a = rms_norm(&a, h, Some(&l.norm_pre_attn), eps);
        let mut a = self.attention(&l.attn, &a, frames)?;
        self.clip(&mut a);
        let a = rms_norm(&a, h, Some(&l.norm_post_attn), eps);
        let x: Vec<f32> = a.iter().zip(&x).map(|(a, r)| a + r).collect();
        let x = self.light_conv(&l.lconv, x, frames)?;
        let mut x = self.feed_forward(&l.ff2, x)?;
        self.clip(&mut x);
        Ok(rms_norm(&x, h, Some(&l.norm_out), eps))
    }

    fn light_conv(&self, lc: &LightConv, x: Vec<f32>, frames: usize) -> Result<Vec<f32>> {
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps);
        let k = self.cfg.conv_kernel_size;
        let y = rms_norm(&x, h, Some(&lc.pre_norm), eps);
        let y = lc.start.apply(&y)?;
        // GLU: the first half gated by the sigmoid of the second.
        let glu: Vec<f32> = y
            .chunks_exact(2 * h)
            .flat_map(|r| {
                let (a, g) = r.split_at(h);
                a.iter()
                    .zip(g)
                    .map(|(a, g)| a * (1.0 / (1.0 + (-g).exp())))
                    .collect::<Vec<_>>()
            })
            .collect();
        // Causal depthwise convolution: frame t reads frames t - k + 1 ..= t.
        let mut conv = vec![0.0f32; frames * h];
        let p = strata_kernels::DepthwiseConv {
            channels: h,
            kernel: k,
        };
        strata_kernels::cpu::depthwise_conv1d_causal_rows(&glu, &lc.depthwise, p, &mut conv);
        self.clip(&mut conv);
        let mut y = rms_norm(&conv, h, Some(&lc.conv_norm), eps);
        y.iter_mut().for_each(|v| *v = silu(*v));
        let y = lc.end.apply(&y)?;
        Ok(y.iter().zip(&x).map(|(a, r)| a + r).collect())
    }

    /// Chunked local attention with relative positions, as transformers' blocked form
    /// computes it (its relative shift included): `strata_kernels::cpu::chunked_attention_rows`
    /// on the scaled queries and keys.
    fn attention(&self, at: &Attention, x: &[f32], frames: usize) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let (h, heads) = (c.hidden_size, c.num_heads);
        let d = h / heads;
        let (q_scale, k_scale) = attention_scales(d);
        let mut q = at.q.apply(x)?;
        let per_dim: Vec<f32> = at.per_dim_scale.iter().map(|&s| softplus(s)).collect();
        for row in q.chunks_exact_mut(d) {
            row.iter_mut()
                .zip(&per_dim)
                .for_each(|(v, s)| *v = *v * q_scale * s);
        }
        let mut k = at.k.apply(x)?;
        k.iter_mut().for_each(|v| *v *= k_scale);
        let v = at.v.apply(x)?;
        let rel_k = gemm_bt(&self.rel_pos, &at.relative_k, h, h)?;
        let mut out = vec![0.0f32; frames * h];
        strata_kernels::cpu::chunked_attention_rows(
            &q,
            &k,
            &v,
            &rel_k,
            attention_params(c),
            &mut out,
        );
        at.post.apply(&out)
    }
}

/// The query scale (`d^-1/2 / ln 2`, before the per-dimension softplus) and the key
/// scale (`ln(1 + e) / ln 2`) of the audio attention.
pub(crate) fn attention_scales(d: usize) -> (f32, f32) {
    (
        ((d as f64).powf(-0.5) / std::f64::consts::LN_2) as f32,
        ((1.0 + std::f64::consts::E).ln() / std::f64::consts::LN_2) as f32,
    )
}

/// `ln(1 + e^s)`, as torch's softplus (the identity past 20).
pub(crate) fn softplus(s: f32) -> f32 {
    if s > 20.0 {
        s
    } else {
        s.exp().ln_1p()
    }
}

/// The chunked attention's shape for `c`.
pub(crate) fn attention_params(c: &AudioConfig) -> strata_kernels::ChunkedAttentionParams {
    strata_kernels::ChunkedAttentionParams {
        n_heads: c.num_heads,
        head_dim: c.hidden_size / c.num_heads,
        chunk: c.chunk_size,
        left: c.context_left,
        right: c.context_right,
        logit_cap: c.logit_cap as f32,
        invalid_logit: c.invalid_logit as f32,
    }
}

/// One subsampling block: a 3x3 stride-2 convolution (padding 1, no bias) of `x [cin,
/// frames, bins]` to `cout` channels, a LayerNorm over the channels (weight, no bias), ReLU.
/// Returns `[cout, frames', bins']`.
fn conv_block(
    x: &[f32],
    cin: usize,
    frames: usize,
    bins: usize,
    (w, norm): &(Vec<f32>, Vec<f32>),
    cout: usize,
    eps: f32,
) -> Result<(Vec<f32>, usize, usize)> {
    let (t_out, f_out) = ((frames - 1) / 2 + 1, (bins - 1) / 2 + 1);
    // im2col: one row per output cell, (channel, tap row, tap column) as the weight's.
    let taps = cin * 9;
    let mut cols = vec![0.0f32; t_out * f_out * taps];
    for t in 0..t_out {
        for f in 0..f_out {
            let row = &mut cols[(t * f_out + f) * taps..(t * f_out + f + 1) * taps];
            for ch in 0..cin {
                for kt in 0..3 {
                    let st = (2 * t + kt) as isize - 1;
                    if st < 0 || st as usize >= frames {
                        continue;
                    }
                    for kf in 0..3 {
                        let sf = (2 * f + kf) as isize - 1;
                        if sf < 0 || sf as usize >= bins {
                            continue;
                        }
                        row[(ch * 3 + kt) * 3 + kf] =
                            x[(ch * frames + st as usize) * bins + sf as usize];
                    }
                }
            }
        }
    }
    let y = gemm_bt(&cols, w, cout, taps)?; // [cells, cout]
    let mut out = vec![0.0f32; cout * t_out * f_out];
    for (cell, v) in y.chunks_exact(cout).enumerate() {
        let mean = v.iter().sum::<f32>() / cout as f32;
        let var = v.iter().map(|a| (a - mean) * (a - mean)).sum::<f32>() / cout as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (o, (&a, &g)) in v.iter().zip(norm).enumerate() {
            out[o * t_out * f_out + cell] = ((a - mean) * inv * g).max(0.0);
        }
    }
    Ok((out, t_out, f_out))
}

/// The sinusoidal table of relative distances `ctx / 2` down to 0: each row the sines,
/// then the cosines, of the distance at `hidden / 2` timescales from 1 to 10,000.
fn relative_positions(ctx: usize, hidden: usize) -> Vec<f32> {
    let half = hidden / 2;
    let incr = (10_000.0f64).ln() / (half.saturating_sub(1).max(1)) as f64;
    let inv: Vec<f32> = (0..half)
        .map(|i| (i as f32 * -(incr as f32)).exp())
        .collect();
    let mut table = Vec::with_capacity((ctx / 2 + 1) * hidden);
    for dist in (0..=ctx / 2).rev() {
        let scaled: Vec<f32> = inv.iter().map(|&s| dist as f32 * s).collect();
        table.extend(scaled.iter().map(|v| v.sin()));
        table.extend(scaled.iter().map(|v| v.cos()));
    }
    table
}
