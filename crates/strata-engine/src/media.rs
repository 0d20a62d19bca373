//! A prompt's images -> the soft-token rows the model reads at their placeholders.
//!
//! The chat template writes one placeholder (`image_token_id`) for each image. As
//! transformers' `Gemma4Processor` does, each becomes `boi`, as many placeholders as the
//! vision tower gives the image soft tokens, and `eoi`; the model reads the tower's rows at
//! those positions in place of the ids' embeddings (`Request::media`).

use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::Arc;

use strata_media::ImagePatcher;
use strata_model::VisionTower;
use strata_sched::MediaInput;

use crate::{EngineError, Result};

/// The vision tower of a multimodal checkpoint with its image processor's settings.
pub struct MediaEncoder {
    vision: VisionTower,
    patcher: ImagePatcher,
    /// Keys the content hashes: random per process, so that no client can make two images
    /// share a prefix-cache key on purpose.
    hasher: std::collections::hash_map::RandomState,
}

/// One encoded image: the rows its placeholders take.
#[derive(Clone, Debug)]
pub struct ImageRows {
    /// Soft tokens (rows).
    pub rows: usize,
    /// `rows x hidden` values, row after row.
    pub values: Arc<[f32]>,
    /// The hash of the file's bytes, which keys the rows in the prefix cache.
    pub hash: u64,
}

impl MediaEncoder {
    /// The tower of the checkpoint at `dir` (`None` when its config has no
    /// `vision_config`), with `max_soft_tokens` from its processor config when it has one.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let Some(vision) = VisionTower::load(dir)? else {
            return Ok(None);
        };
        let c = vision.config();
        let patcher = ImagePatcher {
            patch_size: c.patch_size,
            pooling: c.pooling_kernel_size,
            max_soft_tokens: max_soft_tokens(dir)?
                .unwrap_or(ImagePatcher::gemma4().max_soft_tokens),
        };
        Ok(Some(Self {
            vision,
            patcher,
            hasher: Default::default(),
        }))
    }

    /// The most soft tokens one image becomes.
    pub fn max_image_tokens(&self) -> usize {
        self.patcher.max_soft_tokens
    }

    /// The id the chat template writes for each image.
    pub fn image_token_id(&self) -> u32 {
        self.vision.config().image_token_id
    }

    /// Decodes a PNG, JPEG or WebP file and runs the tower on it (on the host, so that no
    /// decode step waits for it).
    pub fn encode_image(&self, bytes: &[u8]) -> Result<ImageRows> {
        let p = self
            .patcher
            .decode(bytes)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        // Padding patches change no real row (they are masked as keys and pooled into
        // nothing): the tower runs on the image's own patches only.
        let real = p.positions.iter().take_while(|q| q[0] >= 0).count();
        let width = 3 * self.patcher.patch_size * self.patcher.patch_size;
        let out = self
            .vision
            .encode(&p.pixels[..real * width], &p.positions[..real])?;
        let mut h = self.hasher.build_hasher();
        h.write(bytes);
        Ok(ImageRows {
            rows: out.tokens,
            values: out.soft_tokens.into(),
            hash: h.finish(),
        })
    }

    /// `prompt` with each placeholder the template wrote expanded to `boi`, the image's
    /// placeholders and `eoi`, and the rows for them. The template must have written one
    /// placeholder per image, in order.
    pub fn place(
        &self,
        prompt: &[u32],
        images: &[ImageRows],
    ) -> Result<(Vec<u32>, Vec<MediaInput>)> {
        let c = self.vision.config();
        let found = prompt.iter().filter(|&&t| t == c.image_token_id).count();
        if found != images.len() {
            return Err(EngineError::Invalid(format!(
                "the chat template wrote {found} image placeholders for {} images",
                images.len()
            )));
        }
        let extra: usize = images.iter().map(|i| i.rows + 1).sum();
        let mut ids = Vec::with_capacity(prompt.len() + extra);
        let mut media = Vec::with_capacity(images.len());
        let mut next = images.iter();
        for &t in prompt {
            if t != c.image_token_id {
                ids.push(t);
                continue;
            }
            let Some(img) = next.next() else { break };
            ids.push(c.boi_token_id);
            media.push(MediaInput {
                start: ids.len(),
                rows: img.rows,
                values: img.values.clone(),
                hash: img.hash,
            });
            ids.extend(std::iter::repeat_n(c.image_token_id, img.rows));
            ids.push(c.eoi_token_id);
        }
        Ok((ids, media))
    }
}

/// `max_soft_tokens` of the image processor: `processor_config.json`'s `image_processor`
/// (transformers 5) or `preprocessor_config.json`.
fn max_soft_tokens(dir: &Path) -> Result<Option<usize>> {
    let dir = if dir.is_file() {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    for (file, nested) in [
        ("processor_config.json", true),
        ("preprocessor_config.json", false),
    ] {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
            continue;
        };
        let bad = |why: String| EngineError::Invalid(format!("{file}: {why}"));
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let v = if nested { &v["image_processor"] } else { &v };
        match v.get("max_soft_tokens") {
            None => continue,
            Some(n) => match n.as_u64() {
                Some(n @ 1..=65_536) => return Ok(Some(n as usize)),
                _ => return Err(bad(format!("max_soft_tokens {n} is not a count"))),
            },
        }
    }
    Ok(None)
}
