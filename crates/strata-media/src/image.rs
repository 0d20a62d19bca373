//! Images as Gemma-4's vision tower reads them, as transformers 5.17's
//! `Gemma4ImageProcessorPil` makes them:
//!
//! 1. decoded to RGB (an alpha channel is dropped, as Pillow's `convert("RGB")` does);
//! 2. resized, aspect ratio kept, to the largest size whose sides are multiples of
//!    `pooling * patch` pixels within `max_soft_tokens * pooling^2` patches, with Pillow's
//!    bicubic filter in its 8-bit fixed-point arithmetic (so the bytes are Pillow's);
//! 3. scaled to [0, 1], cut into `patch x patch` patches (rows of pixels, RGB interleaved),
//!    row after row of patches, each with its (x, y), padded with (-1, -1) to the budget.

use crate::MediaError;

/// The processor's settings (Gemma-4's: patches of 16, pooling 3, 280 soft tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImagePatcher {
    /// Side of a patch in pixels.
    pub patch_size: usize,
    /// Patches pooled along each axis into one soft token.
    pub pooling: usize,
    /// Soft tokens at most.
    pub max_soft_tokens: usize,
}

/// One image's patches.
#[derive(Clone, Debug, PartialEq)]
pub struct Patches {
    /// `[max_patches, 3 * patch^2]` values in [0, 1]; padding rows are zeros.
    pub pixels: Vec<f32>,
    /// `[max_patches]` (x, y) of each patch; (-1, -1) for padding.
    pub positions: Vec<[i64; 2]>,
    /// The soft tokens the image becomes.
    pub soft_tokens: usize,
}

impl ImagePatcher {
    /// Gemma-4's settings.
    pub fn gemma4() -> Self {
        Self {
            patch_size: 16,
            pooling: 3,
            max_soft_tokens: 280,
        }
    }

    /// The most patches an image becomes.
    pub fn max_patches(&self) -> usize {
        self.max_soft_tokens * self.pooling * self.pooling
    }

    /// The size (height, width) an image of `height x width` pixels is resized to.
    pub fn target_size(&self, height: usize, width: usize) -> Result<(usize, usize), MediaError> {
        let (p, k) = (self.patch_size, self.pooling);
        let target_px = (self.max_patches() * p * p) as f64;
        let factor = (target_px / (height * width) as f64).sqrt();
        let side = k * p;
        let mut th = ((factor * height as f64) / side as f64).floor() as usize * side;
        let mut tw = ((factor * width as f64) / side as f64).floor() as usize * side;
        if th == 0 && tw == 0 {
            return Err(MediaError::Invalid(format!(
                "a {height}x{width} image resizes to nothing"
            )));
        }
        let max_side = (self.max_patches() / (k * k)) * side;
        if th == 0 {
            th = side;
            tw = ((width / height) * side).min(max_side);
        } else if tw == 0 {
            tw = side;
            th = ((height / width) * side).min(max_side);
        }
        if (th * tw) as f64 > target_px {
            return Err(MediaError::Invalid(format!(
                "a {height}x{width} image would need more than {} patches",
                self.max_patches()
            )));
        }
        Ok((th, tw))
    }

    /// Patches of an RGB image (`height x width x 3` bytes).
    pub fn patches(&self, rgb: &[u8], height: usize, width: usize) -> Result<Patches, MediaError> {
        if rgb.len() != height * width * 3 || height == 0 || width == 0 {
            return Err(MediaError::Invalid(format!(
                "{} bytes for a {height}x{width} RGB image",
                rgb.len()
            )));
        }
        let (th, tw) = self.target_size(height, width)?;
        let resized = if (th, tw) == (height, width) {
            rgb.to_vec()
        } else {
            resize_bicubic(rgb, height, width, th, tw)
        };
        let p = self.patch_size;
        let (ph, pw) = (th / p, tw / p);
        let max = self.max_patches();
        let row = 3 * p * p;
        let mut pixels = vec![0.0f32; max * row];
        let mut positions = vec![[-1i64, -1]; max];
        let scale = 1.0f64 / 255.0;
        for py in 0..ph {
            for px in 0..pw {
                let at = py * pw + px;
                positions[at] = [px as i64, py as i64];
                let out = &mut pixels[at * row..(at + 1) * row];
                for y in 0..p {
                    for x in 0..p {
                        let src = ((py * p + y) * tw + px * p + x) * 3;
                        for c in 0..3 {
                            out[(y * p + x) * 3 + c] = (resized[src + c] as f64 * scale) as f32;
                        }
                    }
                }
            }
        }
        Ok(Patches {
            pixels,
            positions,
            soft_tokens: ph * pw / (self.pooling * self.pooling),
        })
    }

    /// Decodes a PNG, JPEG or WebP file's bytes, then makes its patches. JPEG decoders may
    /// differ from Pillow's libjpeg by a unit in a few pixels; PNG and WebP lossless are
    /// exact.
    pub fn decode(&self, bytes: &[u8]) -> Result<Patches, MediaError> {
        let mut reader = image::ImageReader::new(std::io::Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| MediaError::Invalid(format!("undecodable image: {e}")))?;
        // A small file can claim a huge canvas: the decoder stops before allocating one.
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(MAX_SIDE);
        limits.max_image_height = Some(MAX_SIDE);
        limits.max_alloc = Some(MAX_DECODED_BYTES);
        reader.limits(limits);
        let img = reader
            .decode()
            .map_err(|e| MediaError::Invalid(format!("undecodable image: {e}")))?;
        let rgb = img.to_rgb8();
        let (w, h) = rgb.dimensions();
        self.patches(rgb.as_raw(), h as usize, w as usize)
    }
}

/// The widest or tallest image decoded, in pixels.
pub const MAX_SIDE: u32 = 16_384;
/// The most memory one decode may take.
pub const MAX_DECODED_BYTES: u64 = 512 << 20;

/// Pillow's bicubic kernel (a = -0.5).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Pillow's fixed-point precision for 8-bit images.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Per output pixel: the first input pixel and the fixed-point weights, as Pillow's
/// `precompute_coeffs` and `normalize_coeffs_8bpc`.
fn coefficients(in_size: usize, out_size: usize) -> Vec<(usize, Vec<i32>)> {
    let scale = in_size as f64 / out_size as f64;
    let filter_scale = scale.max(1.0);
    let support = 2.0 * filter_scale;
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filter_scale;
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let w: Vec<f64> = (xmin..xmax)
                .map(|x| bicubic((x as f64 - center + 0.5) * ss))
                .collect();
            let total: f64 = w.iter().sum();
            let fixed = w
                .iter()
                .map(|&k| {
                    let k = if total != 0.0 { k / total } else { k };
                    let v = k * (1u32 << PRECISION_BITS) as f64;
                    if v < 0.0 {
                        (v - 0.5) as i32
                    } else {
                        (v + 0.5) as i32
                    }
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Pillow's `resize((w, h), BICUBIC)` of an RGB image: the horizontal pass, then the
/// vertical one, each rounding to bytes.
fn resize_bicubic(rgb: &[u8], h: usize, w: usize, th: usize, tw: usize) -> Vec<u8> {
    let half = 1i32 << (PRECISION_BITS - 1);
    let mut wide = rgb.to_vec();
    if tw != w {
        let cs = coefficients(w, tw);
        wide = vec![0u8; h * tw * 3];
        for y in 0..h {
            for (x, (first, k)) in cs.iter().enumerate() {
                for c in 0..3 {
                    let mut acc = half;
                    for (i, &kk) in k.iter().enumerate() {
                        acc += rgb[(y * w + first + i) * 3 + c] as i32 * kk;
                    }
                    wide[(y * tw + x) * 3 + c] = clip8(acc);
                }
            }
        }
    }
    if th == h {
        return wide;
    }
    let cs = coefficients(h, th);
    let mut out = vec![0u8; th * tw * 3];
    for (y, (first, k)) in cs.iter().enumerate() {
        for x in 0..tw {
            for c in 0..3 {
                let mut acc = half;
                for (i, &kk) in k.iter().enumerate() {
                    acc += wide[((first + i) * tw + x) * 3 + c] as i32 * kk;
                }
                out[(y * tw + x) * 3 + c] = clip8(acc);
            }
        }
    }
    out
}
