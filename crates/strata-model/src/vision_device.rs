//! Gemma-4's vision tower on a [`Backend`]: the same maths as [`VisionTower::encode`] (the
//! host f32 reference it is tested against), as the backend's ops, so that on a GPU an
//! image is a few dozen launches rather than seconds of host products.
//!
//! How each step maps onto the ops:
//! - the patch embedding is one product; the two position rows a patch adds are summed on
//!   the host (a table lookup) and added on the device;
//! - the 2-D axial RoPE is the ordinary `rope` over half-heads: a head of `d` values is two
//!   halves of `d / 2` (x turns the first, y the second, each in neox pairs), so `q [n,
//!   heads, d]` is rotated as `[n * heads * 2, 1, d / 2]` with the x and y coordinates
//!   alternating as the rows' positions;
//! - attention is the backend's bidirectional `attention` (`causal: false`, scale 1) over
//!   the image's own patches: padding patches are never sent (they change no real row);
//! - pooling is `k^2` row gathers (`embedding` with the encoder output as the table), one
//!   per member of each `k x k` block, summed, with `sqrt(hidden) / k^2` folded into the
//!   gathers' scale.
//!
//! Clipped linears (`use_clipped_linears`) clamp each product's input and output; the
//! backends have no clamp op, so such a tower stays on the host
//! ([`DeviceVisionTower::new`] refuses it).

use strata_config::VisionConfig;
use strata_kernels::{
    Activation, AttentionParams, Backend, DType, DeviceBuffer, RopeParams, RopeStyle,
};

use crate::device_ops::{contiguous, rms_norm, Matrix};
use crate::error::{ModelError, Result};
use crate::host_ops::HostLinear;
#[cfg(test)]
use crate::reference_file::{cosine, Reference};
use crate::vision::{axial_inv_freq, check_pixels, pool_bins, VisionTower};

struct Layer<B: Backend> {
    input_norm: B::Buffer,
    post_attention_norm: B::Buffer,
    pre_feedforward_norm: B::Buffer,
    post_feedforward_norm: B::Buffer,
    q: Matrix<B>,
    k: Matrix<B>,
    v: Matrix<B>,
    o: Matrix<B>,
    q_norm: B::Buffer,
    k_norm: B::Buffer,
    gate: Matrix<B>,
    up: Matrix<B>,
    down: Matrix<B>,
}

/// The vision tower and its embedder with their weights on a backend.
pub struct DeviceVisionTower<B: Backend> {
    backend: B,
    cfg: VisionConfig,
    input_proj: Matrix<B>,
    /// `[2, position_embedding_size, hidden]` on the host: the rows a patch adds are
    /// looked up and summed there.
    positions: Vec<f32>,
    layers: Vec<Layer<B>>,
    /// `(-std_bias, std_scale)`, when the config standardizes.
    standardize: Option<(Vec<f32>, Vec<f32>)>,
    embed: Matrix<B>,
    /// The axial RoPE's `head_dim / 4` frequencies.
    inv_freq: B::Buffer,
}

/// One image's soft tokens, `[tokens, text hidden]`.
#[derive(Clone, Debug)]
pub struct DeviceImage {
    /// Soft tokens (rows).
    pub tokens: usize,
    /// The rows, row after row.
    pub soft_tokens: Vec<f32>,
}

impl<B: Backend> DeviceVisionTower<B> {
    /// `tower`'s weights on `backend`, the products' matrices in `weight_dtype` (bf16 on a
    /// GPU; f32 reproduces the host tower to rounding).
    pub fn new(backend: B, tower: &VisionTower, weight_dtype: DType) -> Result<Self> {
        let cfg = tower.config().clone();
        if cfg.clipped_linears {
            return Err(ModelError::Invalid(
                "a vision tower with clipped linears runs on the host only".into(),
            ));
        }
        let b = &backend;
        let mat = |l: &HostLinear| -> Result<Matrix<B>> {
            let (w, rows, cols) = l.matrix();
            Matrix::upload(b, w, rows, cols, weight_dtype)
        };
        let vec = |v: &[f32]| -> Result<B::Buffer> { Ok(b.upload_f32_as(v, DType::F32)?) };
        let layers = tower
            .layers()
            .iter()
            .map(|l| {
                Ok(Layer {
                    input_norm: vec(&l.input_norm)?,
                    post_attention_norm: vec(&l.post_attention_norm)?,
                    pre_feedforward_norm: vec(&l.pre_feedforward_norm)?,
                    post_feedforward_norm: vec(&l.post_feedforward_norm)?,
                    q: mat(&l.q)?,
                    k: mat(&l.k)?,
                    v: mat(&l.v)?,
                    o: mat(&l.o)?,
                    q_norm: vec(&l.q_norm)?,
                    k_norm: vec(&l.k_norm)?,
                    gate: mat(&l.gate)?,
                    up: mat(&l.up)?,
                    down: mat(&l.down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (input_proj, embed) = (mat(tower.input_proj())?, mat(tower.embedder())?);
        let inv_freq = vec(&axial_inv_freq(cfg.head_dim, cfg.rope_theta))?;
        let standardize = tower
            .standardization()
            .map(|(bias, scale)| (bias.iter().map(|v| -v).collect(), scale.to_vec()));
        Ok(Self {
            positions: tower.position_table().to_vec(),
            backend,
            cfg,
            input_proj,
            layers,
            standardize,
            embed,
            inv_freq,
        })
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Encodes one image's real patches (`pixels [patches, 3 * patch^2]`, `positions`
    /// as (x, y), no padding), which must tile whole `k x k` pooling blocks.
    pub fn encode(&self, pixels: &[f32], positions: &[[i64; 2]]) -> Result<DeviceImage> {
        let mut out = self.encode_batch(&[(pixels, positions)])?;
        Ok(out.remove(0))
    }

    /// Encodes several images in one pass: their patches side by side through every
    /// product, norm and rotation, attention within each image (a call an image over its
    /// rows), pooling and the embedder over all their soft tokens at once. Each image as
    /// [`DeviceVisionTower::encode`] takes it; the result, image by image, is what it gives
    /// to rounding (a product's rows do not see each other).
    pub fn encode_batch(&self, images: &[(&[f32], &[[i64; 2]])]) -> Result<Vec<DeviceImage>> {
        let (b, c) = (&self.backend, &self.cfg);
        let h = c.hidden_size;
        if images.is_empty() {
            return Ok(Vec::new());
        }
        // Each image's patch span and its soft tokens' k^2 members (global patch indices).
        let k = c.pooling_kernel_size;
        let mut spans = Vec::with_capacity(images.len());
        let mut members: Vec<Vec<u32>> = Vec::new();
        let mut start = 0;
        for (i, &(pixels, positions)) in images.iter().enumerate() {
            let at = |e: ModelError| match images.len() {
                1 => e,
                _ => ModelError::Invalid(format!("image {i}: {e}")),
            };
            for m in self.pooling_members(pixels, positions).map_err(at)? {
                members.push(m.into_iter().map(|p| p + start as u32).collect());
            }
            spans.push(start..start + positions.len());
            start += positions.len();
        }
        let n = start;
        let positions: Vec<[i64; 2]> = images.iter().flat_map(|i| i.1.iter().copied()).collect();

        // 1. Patch embedding, plus each patch's x and y rows of the position table.
        let scaled: Vec<f32> = images
            .iter()
            .flat_map(|i| i.0.iter().map(|&v| 2.0 * (v - 0.5)))
            .collect();
        let mut x = self.product(&b.upload_f32_as(&scaled, DType::F32)?, &self.input_proj, n)?;
        let axis = c.position_embedding_size;
        let mut rows = vec![0.0f32; n * h];
        for (row, p) in rows.chunks_exact_mut(h).zip(&positions) {
            let ex = &self.positions[p[0] as usize * h..][..h];
            let ey = &self.positions[(axis + p[1] as usize) * h..][..h];
            for ((o, a), e) in row.iter_mut().zip(ex).zip(ey) {
                *o = a + e;
            }
        }
        b.add(&mut x, &b.upload_f32_as(&rows, DType::F32)?)?;

        // 2. Encoder layers.
        let d = c.head_dim;
        let halves = |heads: usize| -> Vec<u32> {
            positions
                .iter()
                .flat_map(|p| (0..heads).flat_map(move |_| [p[0] as u32, p[1] as u32]))
                .collect()
        };
        let (q_pos, k_pos) = (halves(c.num_heads), halves(c.num_kv_heads));
        let attn = AttentionParams {
            n_heads: c.num_heads,
            n_kv_heads: c.num_kv_heads,
            head_dim: d,
            scale: 1.0,
            window: None,
            causal: false,
            softcap: None,
        };
        let eps = c.rms_norm_eps as f32;
        let norm = |x: &B::Buffer, w: Option<&B::Buffer>, dim: usize| rms_norm(b, x, w, dim, eps);
        let half_rope = RopeParams {
            n_heads: 1,
            head_dim: d / 2,
            style: RopeStyle::Neox,
        };
        for l in &self.layers {
            let normed = norm(&x, Some(&l.input_norm), h)?;
            let q = self.product(&normed, &l.q, n)?;
            let k = self.product(&normed, &l.k, n)?;
            let v = self.product(&normed, &l.v, n)?;
            let mut q = norm(&q, Some(&l.q_norm), d)?;
            let mut k = norm(&k, Some(&l.k_norm), d)?;
            let v = norm(&v, None, d)?;
            b.rope(&mut q, &q_pos, &self.inv_freq, half_rope)?;
            b.rope(&mut k, &k_pos, &self.inv_freq, half_rope)?;
            let a = self.attention(&q, &k, &v, &spans, attn)?;
            let o = self.product(&a, &l.o, n)?;
            b.add(&mut x, &norm(&o, Some(&l.post_attention_norm), h)?)?;
            let normed = norm(&x, Some(&l.pre_feedforward_norm), h)?;
            let gate = self.product(&normed, &l.gate, n)?;
            let up = self.product(&normed, &l.up, n)?;
            let mut act = b.scratch(gate.len(), DType::F32)?;
            b.act_mul(Activation::GeluTanh, &gate, &up, &mut act)?;
            let mlp = self.product(&act, &l.down, n)?;
            b.add(&mut x, &norm(&mlp, Some(&l.post_feedforward_norm), h)?)?;
        }

        // 3. Pooling: the sum of k^2 gathers, each scaled by sqrt(hidden) / k^2.
        let tokens = members.len();
        let scale = (h as f32).sqrt() / (k * k) as f32;
        let mut pooled = b.zeros(tokens * h, DType::F32)?;
        let mut part = b.scratch(tokens * h, DType::F32)?;
        for j in 0..k * k {
            let ids: Vec<u32> = members.iter().map(|m| m[j]).collect();
            b.embedding(&ids, &x, h, scale, &mut part)?;
            b.add(&mut pooled, &part)?;
        }
        if let Some((neg_bias, std_scale)) = &self.standardize {
            let repeat = |v: &[f32]| -> Vec<f32> { v.repeat(tokens) };
            b.add(
                &mut pooled,
                &b.upload_f32_as(&repeat(neg_bias), DType::F32)?,
            )?;
            b.mul(
                &mut pooled,
                &b.upload_f32_as(&repeat(std_scale), DType::F32)?,
            )?;
        }

        // 4. The embedder: a scale-free norm, then the projection to the text width.
        let normed = norm(&pooled, None, h)?;
        let soft = b.download(&self.product(&normed, &self.embed, tokens)?)?;
        let width = self.embed.shape.out_features;
        let mut out = Vec::with_capacity(images.len());
        let mut first = 0;
        for span in &spans {
            let t = span.len() / (k * k);
            out.push(DeviceImage {
                tokens: t,
                soft_tokens: soft[first * width..(first + t) * width].to_vec(),
            });
            first += t;
        }
        Ok(out)
    }

    /// Checks one image's patches and gives each of its soft tokens' `k^2` patches, in
    /// patch order (indices within the image); every pooling block must be whole.
    fn pooling_members(&self, pixels: &[f32], positions: &[[i64; 2]]) -> Result<Vec<Vec<u32>>> {
        let c = &self.cfg;
        let n = positions.len();
        check_pixels(c, pixels, n)?;
        let axis = c.position_embedding_size;
        if let Some((i, p)) = positions
            .iter()
            .enumerate()
            .find(|(_, p)| p.iter().any(|&v| v < 0 || v >= axis as i64))
        {
            return Err(ModelError::Invalid(format!(
                "patch {i} at ({}, {}) is outside the {axis} positions of an axis",
                p[0], p[1]
            )));
        }
        let k = c.pooling_kernel_size;
        let bins = pool_bins(positions, k)?;
        let mut members = vec![Vec::with_capacity(k * k); n / (k * k)];
        for (i, &bin) in bins.iter().enumerate() {
            members[bin].push(i as u32);
        }
        if let Some(t) = members.iter().position(|m| m.len() != k * k) {
            return Err(ModelError::Invalid(format!(
                "soft token {t} pools {} patches, not {}: the patches do not tile the image",
                members[t].len(),
                k * k
            )));
        }
        Ok(members)
    }

    /// Bidirectional attention within each image's rows (`spans`): one call over all rows
    /// for a single image; otherwise each image's q, k and v rows copied out, attended, and
    /// their output copied back into place.
    fn attention(
        &self,
        q: &B::Buffer,
        k: &B::Buffer,
        v: &B::Buffer,
        spans: &[std::ops::Range<usize>],
        attn: AttentionParams,
    ) -> Result<B::Buffer> {
        let b = &self.backend;
        let (qw, kw) = (
            attn.n_heads * attn.head_dim,
            attn.n_kv_heads * attn.head_dim,
        );
        let mut a = b.scratch(q.len(), DType::F32)?;
        if spans.len() == 1 {
            let order: Vec<u32> = (0..spans[0].len() as u32).collect();
            b.attention(q, k, v, &order, &order, attn, &mut a)?;
            return Ok(a);
        }
        let rows =
            |src: &B::Buffer, span: &std::ops::Range<usize>, w: usize| -> Result<B::Buffer> {
                let mut dst = b.scratch(span.len() * w, DType::F32)?;
                b.copy_strided(src, &mut dst, contiguous(span.len(), w, span.start * w, 0))?;
                Ok(dst)
            };
        for span in spans {
            let (qi, ki, vi) = (rows(q, span, qw)?, rows(k, span, kw)?, rows(v, span, kw)?);
            let order: Vec<u32> = (0..span.len() as u32).collect();
            let mut ai = b.scratch(qi.len(), DType::F32)?;
            b.attention(&qi, &ki, &vi, &order, &order, attn, &mut ai)?;
            b.copy_strided(&ai, &mut a, contiguous(span.len(), qw, 0, span.start * qw))?;
        }
        Ok(a)
    }

    fn product(&self, x: &B::Buffer, w: &Matrix<B>, rows: usize) -> Result<B::Buffer> {
        w.apply(&self.backend, x, rows)
    }
}

/// Image `i`'s real patches in a transformers reference: pixels and (x, y) positions,
/// padding left out; `None` past the last image.
#[cfg(test)]
fn reference_image(
    r: &Reference,
    i: usize,
    patch_values: usize,
) -> Option<(Vec<f32>, Vec<[i64; 2]>)> {
    let positions: Vec<[i64; 2]> = r
        .bytes(&format!("position_ids_{i}"))?
        .chunks_exact(16)
        .map(|c| {
            let v = |b: &[u8]| i64::from_le_bytes(b.try_into().unwrap());
            [v(&c[..8]), v(&c[8..])]
        })
        .take_while(|p| p[0] >= 0)
        .collect();
    let mut pixels = r.f32s(&format!("pixel_values_{i}"));
    pixels.truncate(positions.len() * patch_values);
    Some((pixels, positions))
}

/// The device tower against transformers' soft tokens for the tiny fixture's two images
/// (`tests/fixtures/tiny/gemma4-tiny-vision`, its `reference.safetensors`), each run on
/// its real patches only. One body for every backend: the CPU test below and the GPU test
/// (`cuda_upload`) call it. Returns the worst (max abs difference / largest value,
/// cosine) over both images.
#[cfg(test)]
pub(crate) fn check_against_transformers<B: Backend>(
    backend: B,
    fixture: &std::path::Path,
    weight_dtype: DType,
) -> (f32, f64) {
    let tower = VisionTower::load(fixture).unwrap().expect("a vision tower");
    let device = DeviceVisionTower::new(backend, &tower, weight_dtype).unwrap();
    let r = Reference::load(fixture);
    let width = 3 * tower.config().patch_size.pow(2);
    let images: Vec<_> = (0..2)
        .map(|i| reference_image(&r, i, width).expect("two images"))
        .collect();
    // Each image alone, then both in one pass.
    let alone: Vec<DeviceImage> = images
        .iter()
        .map(|(p, q)| device.encode(p, q).unwrap())
        .collect();
    let both = device
        .encode_batch(&[(&images[0].0, &images[0].1), (&images[1].0, &images[1].1)])
        .unwrap();
    let (mut worst, mut min_cos) = (0.0f32, 1.0f64);
    for (how, got) in [("alone", &alone), ("in one pass", &both)] {
        for (i, (got, want_tokens)) in got.iter().zip([12, 6]).enumerate() {
            assert_eq!(got.tokens, want_tokens, "image {i} {how}");
            let want = r.f32s(&format!("soft_tokens_{i}"));
            assert_eq!(got.soft_tokens.len(), want.len(), "image {i} {how}");
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let diff = got
                .soft_tokens
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            let cos = cosine(&got.soft_tokens, &want);
            eprintln!(
                "image {i} {how} ({}, {weight_dtype:?} weights): soft tokens max abs diff \
                 {diff:.2e} (largest value {scale:.2}), cosine {cos:.6}",
                device.backend().name()
            );
            worst = worst.max(diff / scale.max(1.0));
            min_cos = min_cos.min(cos);
        }
    }
    (worst, min_cos)
}

/// One image of [`check_real_shape`]: patches, soft tokens, cosine to transformers f32,
/// cosine to transformers bf16, ms an image.
#[cfg(test)]
pub(crate) type RealShapeRow = (usize, usize, f64, f64, f64);

/// The device tower at a real shape (`STRATA_VISION_REAL_SHAPE`: a directory written by
/// scripts/reference/vision_real_shape.py) against transformers' soft tokens: per image,
/// the patches, the soft tokens, the cosine to transformers in f32 and to transformers in
/// bf16, and the median of 5 encodes in ms (after one to warm up); then a row for every
/// image in one pass ([`DeviceVisionTower::encode_batch`]: totals, the lowest cosines, ms a
/// pass). `None` when the variable is unset.
#[cfg(test)]
pub(crate) fn check_real_shape<B: Backend>(
    backend: B,
    weight_dtype: DType,
) -> Option<Vec<RealShapeRow>> {
    let dir = std::path::PathBuf::from(std::env::var_os("STRATA_VISION_REAL_SHAPE")?);
    let tower = VisionTower::load(&dir).unwrap().expect("a vision tower");
    let device = DeviceVisionTower::new(backend, &tower, weight_dtype).unwrap();
    let r = Reference::load(&dir);
    let width = 3 * tower.config().patch_size.pow(2);
    let mut out = Vec::new();
    for i in 0.. {
        let Some((pixels, positions)) = reference_image(&r, i, width) else {
            break;
        };
        let got = device.encode(&pixels, &positions).unwrap();
        let mut times: Vec<f64> = (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                device.encode(&pixels, &positions).unwrap();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let (f32_ref, bf16_ref) = (
            r.f32s(&format!("soft_f32_{i}")),
            r.f32s(&format!("soft_bf16_{i}")),
        );
        assert_eq!(got.soft_tokens.len(), f32_ref.len(), "image {i}");
        let row = (
            positions.len(),
            got.tokens,
            cosine(&got.soft_tokens, &f32_ref),
            cosine(&got.soft_tokens, &bf16_ref),
            times[2],
        );
        eprintln!(
            "real shape, image {i} ({}, {weight_dtype:?} weights): {} patches -> {} soft \
             tokens, cosine {:.6} to transformers f32, {:.6} to transformers bf16 \
             (transformers bf16 to f32: {:.6}), {:.2} ms an image",
            device.backend().name(),
            row.0,
            row.1,
            row.2,
            row.3,
            cosine(&bf16_ref, &f32_ref),
            row.4
        );
        out.push(row);
    }
    // Every image in one pass: a last row of the totals, the lowest cosines, ms a pass.
    let images: Vec<_> = (0..out.len())
        .map(|i| reference_image(&r, i, width).unwrap())
        .collect();
    let batch: Vec<(&[f32], &[[i64; 2]])> = images
        .iter()
        .map(|(p, q)| (p.as_slice(), q.as_slice()))
        .collect();
    let got = device.encode_batch(&batch).unwrap();
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            device.encode_batch(&batch).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let (mut cos32, mut cos16) = (1.0f64, 1.0f64);
    for (i, g) in got.iter().enumerate() {
        cos32 = cos32.min(cosine(&g.soft_tokens, &r.f32s(&format!("soft_f32_{i}"))));
        cos16 = cos16.min(cosine(&g.soft_tokens, &r.f32s(&format!("soft_bf16_{i}"))));
    }
    let alone: f64 = out.iter().map(|row| row.4).sum();
    eprintln!(
        "real shape, all {} images in one pass: {:.2} ms (one at a time: {alone:.2} ms), lowest \
         cosine {cos32:.6} to transformers f32",
        got.len(),
        times[2]
    );
    out.push((
        batch.iter().map(|b| b.1.len()).sum(),
        got.iter().map(|g| g.tokens).sum(),
        cos32,
        cos16,
        times[2],
    ));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_kernels::cpu::CpuBackend;

    fn fixture() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny/gemma4-tiny-vision")
    }

    #[test]
    fn vision_tower_on_the_cpu_backend_matches_transformers() {
        let (rel, cos) = check_against_transformers(CpuBackend::new(), &fixture(), DType::F32);
        assert!(rel < 1e-5, "relative error {rel}");
        assert!(cos > 0.999_999, "cosine {cos}");
    }

    /// Only with `STRATA_VISION_REAL_SHAPE` set (the directory is made with transformers).
    #[test]
    fn vision_tower_at_the_real_shape_on_the_cpu_backend() {
        let Some(rows) = check_real_shape(CpuBackend::new(), DType::F32) else {
            eprintln!("STRATA_VISION_REAL_SHAPE is not set: skipped");
            return;
        };
        for (_, _, cos, _, _) in rows {
            assert!(cos > 0.99999, "cosine {cos}");
        }
    }

    #[test]
    fn images_that_do_not_fit_the_device_tower_are_refused() {
        let tower = VisionTower::load(&fixture()).unwrap().unwrap();
        let device = DeviceVisionTower::new(CpuBackend::new(), &tower, DType::F32).unwrap();
        let patch = 3 * tower.config().patch_size.pow(2);
        // Six patches are not a whole number of 2x2 pooling blocks.
        let pos: Vec<[i64; 2]> = (0..6).map(|i| [i % 3, i / 3]).collect();
        let err = device.encode(&vec![0.5; 6 * patch], &pos).unwrap_err();
        assert!(err.to_string().contains("tile"), "{err}");
        // A position past the table, and a padding position.
        for bad in [[0, 100_000], [-1, -1]] {
            let mut pos: Vec<[i64; 2]> = (0..4).map(|i| [i % 2, i / 2]).collect();
            pos[3] = bad;
            let err = device.encode(&vec![0.5; 4 * patch], &pos).unwrap_err();
            assert!(err.to_string().contains("outside"), "{err}");
        }
        // Pixels that do not match the patch count.
        let pos: Vec<[i64; 2]> = (0..4).map(|i| [i % 2, i / 2]).collect();
        assert!(device.encode(&[0.5; 7], &pos).is_err());
        // In a batch, the refusal names the image.
        let good = vec![0.5; 4 * patch];
        let err = device
            .encode_batch(&[(&good, &pos), (&[0.5; 7], &pos)])
            .unwrap_err();
        assert!(err.to_string().starts_with("image 1:"), "{err}");
    }
}
