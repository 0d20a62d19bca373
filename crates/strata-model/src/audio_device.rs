//! Gemma-4's audio tower on a [`Backend`]: the conformer of [`AudioTower::encode`] (the
//! host f32 reference it is tested against) as the backend's ops, so that on a GPU a clip
//! is a few hundred launches rather than seconds of host products.
//!
//! The subsampling convolutions stay on the host (a few MFLOP a second of audio); from the
//! input projection on, every step is an op: products (with their clamps where the config
//! clips its linears), `rms_norm`, `clamp` for the gradient clipping, `activation` (SiLU),
//! `act_mul` with `Sigmoid` for the light convolution's GLU, `depthwise_conv1d_causal` and
//! `chunked_attention`. The attention's query and key scales are applied after their
//! products (a clipped linear clamps its output first); the relative-position keys are
//! computed once, at construction.

use strata_config::AudioConfig;
use strata_kernels::{
    Activation, Backend, ChunkedAttentionParams, DType, DepthwiseConv, DeviceBuffer, StridedCopy,
};

use crate::audio::{attention_params, attention_scales, softplus, AudioTower, EncodedAudio};
use crate::device_ops::{copy, rms_norm, Matrix};
use crate::error::Result;
use crate::host_ops::{gemm_bt, HostLinear};

/// A product's weight on the backend, with its clamps.
struct Linear<B: Backend> {
    m: Matrix<B>,
    clamps: Option<[f32; 4]>,
}

struct FeedForward<B: Backend> {
    pre_norm: B::Buffer,
    post_norm: B::Buffer,
    up: Linear<B>,
    down: Linear<B>,
}

struct Layer<B: Backend> {
    ff1: FeedForward<B>,
    ff2: FeedForward<B>,
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    post: Linear<B>,
    /// `q_scale * softplus(per_dim_scale)`, one a head dimension.
    q_dim_scale: Vec<f32>,
    /// `[positions, hidden]`: the relative-position table's keys.
    rel_k: B::Buffer,
    lconv_pre_norm: B::Buffer,
    lconv_start: Linear<B>,
    lconv_end: Linear<B>,
    depthwise: B::Buffer,
    conv_norm: B::Buffer,
    norm_pre_attn: B::Buffer,
    norm_post_attn: B::Buffer,
    norm_out: B::Buffer,
}

/// The audio tower and its embedder with their weights on a backend (the subsampling
/// convolutions run on the host tower kept beside them).
pub struct DeviceAudioTower<B: Backend> {
    backend: B,
    host: AudioTower,
    input_proj: Linear<B>,
    layers: Vec<Layer<B>>,
    out: Linear<B>,
    out_bias: Vec<f32>,
    embed: Linear<B>,
    k_scale: f32,
}

impl<B: Backend> DeviceAudioTower<B> {
    /// `tower`'s weights on `backend`, the products' matrices in `weight_dtype` (bf16 on a
    /// GPU; f32 reproduces the host tower to rounding). The host tower is kept for the
    /// subsampling convolutions.
    pub fn new(backend: B, tower: AudioTower, weight_dtype: DType) -> Result<Self> {
        let cfg = tower.config().clone();
        let b = &backend;
        let vec = |v: &[f32]| -> Result<B::Buffer> { Ok(b.upload_f32_as(v, DType::F32)?) };
        let mat = |w: &[f32], rows: usize, cols: usize, clamps| -> Result<Linear<B>> {
            Ok(Linear {
                m: Matrix::upload(b, w, rows, cols, weight_dtype)?,
                clamps,
            })
        };
        let lin = |l: &HostLinear| {
            let (w, rows, cols) = l.matrix();
            mat(w, rows, cols, l.clamps())
        };
        let h = cfg.hidden_size;
        let d = h / cfg.num_heads;
        let (q_scale, k_scale) = attention_scales(d);
        let ff = |f: &crate::audio::FeedForward| -> Result<FeedForward<B>> {
            Ok(FeedForward {
                pre_norm: vec(&f.pre_norm)?,
                post_norm: vec(&f.post_norm)?,
                up: lin(&f.up)?,
                down: lin(&f.down)?,
            })
        };
        let layers = tower
            .layers()
            .iter()
            .map(|l| {
                let rel_k = gemm_bt(tower.relative_positions(), &l.attn.relative_k, h, h)?;
                Ok(Layer {
                    ff1: ff(&l.ff1)?,
                    ff2: ff(&l.ff2)?,
                    q: lin(&l.attn.q)?,
                    k: lin(&l.attn.k)?,
                    v: lin(&l.attn.v)?,
                    post: lin(&l.attn.post)?,
                    q_dim_scale: l
                        .attn
                        .per_dim_scale
                        .iter()
                        .map(|&s| q_scale * softplus(s))
                        .collect(),
                    rel_k: vec(&rel_k)?,
                    lconv_pre_norm: vec(&l.lconv.pre_norm)?,
                    lconv_start: lin(&l.lconv.start)?,
                    lconv_end: lin(&l.lconv.end)?,
                    depthwise: vec(&l.lconv.depthwise)?,
                    conv_norm: vec(&l.lconv.conv_norm)?,
                    norm_pre_attn: vec(&l.norm_pre_attn)?,
                    norm_post_attn: vec(&l.norm_post_attn)?,
                    norm_out: vec(&l.norm_out)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let width = tower.input_proj().len() / h;
        let (out_w, out_b) = tower.output_proj();
        Ok(Self {
            input_proj: mat(tower.input_proj(), h, width, None)?,
            out: mat(out_w, cfg.output_dims, h, None)?,
            out_bias: out_b.to_vec(),
            embed: mat(
                tower.embedder(),
                cfg.text_hidden_size,
                cfg.output_dims,
                None,
            )?,
            layers,
            k_scale,
            host: tower,
            backend,
        })
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The configuration.
    pub fn config(&self) -> &AudioConfig {
        self.host.config()
    }

    /// Encodes one clip, as [`AudioTower::encode`] does.
    pub fn encode(&self, features: &[f32], bins: usize) -> Result<EncodedAudio> {
        let (b, c) = (&self.backend, self.host.config());
        let (flat, frames) = self.host.subsample(features, bins)?;
        let mut x = self.product(
            &b.upload_f32_as(&flat, DType::F32)?,
            &self.input_proj,
            frames,
        )?;
        for l in &self.layers {
            x = self.layer(l, x, frames)?;
        }
        let mut tower = self.product(&x, &self.out, frames)?;
        b.add(
            &mut tower,
            &b.upload_f32_as(&self.out_bias.repeat(frames), DType::F32)?,
        )?;
        let normed = self.norm(&tower, None, c.output_dims)?;
        let soft = self.product(&normed, &self.embed, frames)?;
        Ok(EncodedAudio {
            tower: b.download(&tower)?,
            soft_tokens: b.download(&soft)?,
            tokens: frames,
        })
    }

    fn layer(&self, l: &Layer<B>, x: B::Buffer, frames: usize) -> Result<B::Buffer> {
        let (b, c) = (&self.backend, self.host.config());
        let h = c.hidden_size;
        let mut x = self.feed_forward(&l.ff1, x, frames)?;
        let mut a = copy(b, &x)?;
        self.clip(&mut a)?;
        let a = self.norm(&a, Some(&l.norm_pre_attn), h)?;
        let mut a = self.attention(l, &a, frames)?;
        self.clip(&mut a)?;
        let a = self.norm(&a, Some(&l.norm_post_attn), h)?;
        b.add(&mut x, &a)?;
        let x = self.light_conv(l, x, frames)?;
        let mut x = self.feed_forward(&l.ff2, x, frames)?;
        self.clip(&mut x)?;
        self.norm(&x, Some(&l.norm_out), h)
    }

    fn feed_forward(&self, ff: &FeedForward<B>, x: B::Buffer, frames: usize) -> Result<B::Buffer> {
        let (b, c) = (&self.backend, self.host.config());
        let h = c.hidden_size;
        let mut y = copy(b, &x)?;
        self.clip(&mut y)?;
        let y = self.norm(&y, Some(&ff.pre_norm), h)?;
        let up = self.product(&y, &ff.up, frames)?;
        let mut act = b.scratch(up.len(), DType::F32)?;
        b.activation(Activation::Silu, &up, &mut act)?;
        let mut y = self.product(&act, &ff.down, frames)?;
        self.clip(&mut y)?;
        let mut y = self.norm(&y, Some(&ff.post_norm), h)?;
        b.scale(&mut y, c.residual_weight as f32)?;
        b.add(&mut y, &x)?;
        Ok(y)
    }

    fn light_conv(&self, l: &Layer<B>, x: B::Buffer, frames: usize) -> Result<B::Buffer> {
        let (b, c) = (&self.backend, self.host.config());
        let h = c.hidden_size;
        let y = self.norm(&x, Some(&l.lconv_pre_norm), h)?;
        let y = self.product(&y, &l.lconv_start, frames)?;
        // GLU: the first half of each row gated by the sigmoid of the second.
        let half = |first: usize| -> Result<B::Buffer> {
            let mut out = b.scratch(frames * h, DType::F32)?;
            let copy = StridedCopy {
                rows: frames,
                cols: h,
                src_offset: first,
                src_stride: 2 * h,
                dst_offset: 0,
                dst_stride: h,
            };
            b.copy_strided(&y, &mut out, copy)?;
            Ok(out)
        };
        let (a, g) = (half(0)?, half(h)?);
        let mut glu = b.scratch(frames * h, DType::F32)?;
        b.act_mul(Activation::Sigmoid, &g, &a, &mut glu)?;
        let mut conv = b.scratch(frames * h, DType::F32)?;
        let p = DepthwiseConv {
            channels: h,
            kernel: c.conv_kernel_size,
        };
        b.depthwise_conv1d_causal(&glu, &l.depthwise, p, &mut conv)?;
        self.clip(&mut conv)?;
        let y = self.norm(&conv, Some(&l.conv_norm), h)?;
        let mut act = b.scratch(y.len(), DType::F32)?;
        b.activation(Activation::Silu, &y, &mut act)?;
        let mut y = self.product(&act, &l.lconv_end, frames)?;
        b.add(&mut y, &x)?;
        Ok(y)
    }

    fn attention(&self, l: &Layer<B>, x: &B::Buffer, frames: usize) -> Result<B::Buffer> {
        let (b, c) = (&self.backend, self.host.config());
        let mut q = self.product(x, &l.q, frames)?;
        let per_row = l.q_dim_scale.repeat(c.num_heads * frames);
        b.mul(&mut q, &b.upload_f32_as(&per_row, DType::F32)?)?;
        let mut k = self.product(x, &l.k, frames)?;
        b.scale(&mut k, self.k_scale)?;
        let v = self.product(x, &l.v, frames)?;
        let mut out = b.scratch(q.len(), DType::F32)?;
        let p: ChunkedAttentionParams = attention_params(c);
        b.chunked_attention(&q, &k, &v, &l.rel_k, p, &mut out)?;
        self.product(&out, &l.post, frames)
    }

    /// `x W^T` with the linear's clamps on its input (a copy) and its output.
    fn product(&self, x: &B::Buffer, w: &Linear<B>, rows: usize) -> Result<B::Buffer> {
        let b = &self.backend;
        let Some([imin, imax, omin, omax]) = w.clamps else {
            return w.m.apply(b, x, rows);
        };
        let mut xc = copy(b, x)?;
        b.clamp(&mut xc, imin, imax)?;
        let mut out = w.m.apply(b, &xc, rows)?;
        b.clamp(&mut out, omin, omax)?;
        Ok(out)
    }

    /// The gradient clipping: activations clamped to `±gradient_clipping` (as f32).
    fn clip(&self, x: &mut B::Buffer) -> Result<()> {
        let g = self.host.config().gradient_clipping.min(f32::MAX as f64) as f32;
        Ok(self.backend.clamp(x, -g, g)?)
    }

    fn norm(&self, x: &B::Buffer, w: Option<&B::Buffer>, dim: usize) -> Result<B::Buffer> {
        let eps = self.host.config().rms_norm_eps as f32;
        rms_norm(&self.backend, x, w, dim, eps)
    }
}

/// The device tower against transformers' tower outputs and soft tokens for the tiny
/// fixture's two clips (`tests/fixtures/tiny/gemma4-tiny-audio`, its
/// `reference.safetensors`). One body for every backend: the CPU test below and the GPU
/// test (`cuda_upload`) call it. Returns the worst max abs differences (tower, soft tokens)
/// and the lowest cosine of the soft tokens.
#[cfg(test)]
pub(crate) fn check_against_transformers<B: Backend>(
    backend: B,
    fixture: &std::path::Path,
    weight_dtype: DType,
) -> (f32, f32, f64) {
    let tower = AudioTower::load(fixture).unwrap().expect("an audio tower");
    let bins = tower.config().subsampling_channels[0];
    let device = DeviceAudioTower::new(backend, tower, weight_dtype).unwrap();
    let r = crate::reference_file::Reference::load(fixture);
    let f32s = |name: &str| r.f32s(name);
    let cosine = crate::reference_file::cosine;
    let diff = |a: &[f32], b: &[f32]| -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    };
    let (mut dt, mut ds, mut cos) = (0.0f32, 0.0f32, 1.0f64);
    for i in 0..2 {
        let out = device
            .encode(&f32s(&format!("features_{i}")), bins)
            .unwrap();
        let want = f32s(&format!("soft_{i}"));
        let (t, s, c) = (
            diff(&out.tower, &f32s(&format!("tower_{i}"))),
            diff(&out.soft_tokens, &want),
            cosine(&out.soft_tokens, &want),
        );
        eprintln!(
            "clip {i} ({}, {weight_dtype:?} weights): {} soft tokens, tower off by {t:.2e}, \
             soft tokens by {s:.2e}, cosine {c:.6}",
            device.backend().name(),
            out.tokens
        );
        (dt, ds, cos) = (dt.max(t), ds.max(s), cos.min(c));
    }
    (dt, ds, cos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_kernels::cpu::CpuBackend;

    fn fixture() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny/gemma4-tiny-audio")
    }

    #[test]
    fn audio_tower_on_the_cpu_backend_matches_transformers() {
        let (t, s, _) = check_against_transformers(CpuBackend::new(), &fixture(), DType::F32);
        assert!(t < 1e-4 && s < 1e-4, "tower {t}, soft tokens {s}");
    }
}
