//! A prompt's images and audio clips -> the soft-token rows the model reads at their
//! placeholders.
//!
//! The chat template writes one placeholder for each item (`image_token_id`,
//! `audio_token_id`). As transformers' `Gemma4Processor` does, each becomes its opening id
//! (`boi`, `boa`), as many placeholders as the item's tower gives it soft tokens, and its
//! closing id (`eoi`, `eoa`); the model reads the tower's rows at those positions in place
//! of the ids' embeddings (`Request::media`).

use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::Arc;

use strata_media::{ImagePatcher, LogMel};
use strata_model::{AudioTower, VisionTower};
use strata_sched::MediaInput;

use crate::combine::Combiner;
use crate::{EngineError, Result};

/// The most images a vision tower pass takes (a request's own may exceed it: they run in
/// a pass of their own).
const IMAGES_A_PASS: usize = 16;

/// An image file decoded and cut into its real patches ([`MediaEncoder::decode_image`]),
/// ready for the tower.
pub struct DecodedImage {
    pixels: Vec<f32>,
    positions: Vec<[i64; 2]>,
    hash: u64,
}

/// An image's real patches and their (x, y) positions.
type Patches<'a> = (&'a [f32], &'a [[i64; 2]]);

/// A vision tower on a GPU: images' patches -> each image's (soft tokens, rows), in one pass.
type DeviceVision =
    Box<dyn Fn(&[Patches<'_>]) -> strata_model::Result<Vec<(usize, Vec<f32>)>> + Send + Sync>;

/// Where images are encoded.
enum ImageTower {
    /// The host tower, f32.
    Host(Box<VisionTower>),
    /// The tower on the model's GPU ([`MediaEncoder::vision_on_gpu`]), named by its device;
    /// the host copy is dropped.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Device(DeviceVision, String),
}

/// The vision side of a checkpoint: its config, its processor and its tower.
struct Vision {
    cfg: strata_config::VisionConfig,
    patcher: ImagePatcher,
    tower: ImageTower,
}

/// The towers of a multimodal checkpoint with their processors' settings.
pub struct MediaEncoder {
    vision: Option<Vision>,
    audio: Option<AudioEncoder>,
    /// Concurrent requests' images gathered into shared tower passes.
    images: Combiner<DecodedImage, MediaRows>,
    /// Keys the content hashes: random per process, so that no client can make two items
    /// share a prefix-cache key on purpose.
    hasher: std::collections::hash_map::RandomState,
}

/// An audio tower on a GPU: log-mel frames and their bins -> the encoded clip.
type DeviceAudio =
    Box<dyn Fn(&[f32], usize) -> strata_model::Result<strata_model::EncodedAudio> + Send + Sync>;

/// Where audio is encoded.
enum AudioTowerOn {
    /// The host tower, f32.
    Host(Box<AudioTower>),
    /// The tower on the model's GPU ([`MediaEncoder::audio_on_gpu`]), named by its device.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Device(DeviceAudio, String),
}

struct AudioEncoder {
    /// The placeholder ids (the tower's config, kept here wherever the tower runs).
    ids: (u32, u32, u32),
    tower: AudioTowerOn,
    mel: LogMel,
    /// Samples a second the feature extractor wants.
    rate: usize,
}

/// What a media item is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaKind {
    /// An image file.
    Image,
    /// An audio clip.
    Audio,
}

/// An audio file's container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AudioFormat {
    /// RIFF WAVE (integer or float samples).
    Wav,
    /// MPEG-1/2 Layer III.
    Mp3,
}

/// One encoded item: the rows its placeholders take.
#[derive(Clone, Debug)]
pub struct MediaRows {
    /// Image or audio.
    pub kind: MediaKind,
    /// Soft tokens (rows).
    pub rows: usize,
    /// `rows x hidden` values, row after row.
    pub values: Arc<[f32]>,
    /// The hash of the file's bytes, which keys the rows in the prefix cache.
    pub hash: u64,
}

/// The processor settings a checkpoint's `processor_config.json` (transformers 5) or
/// `preprocessor_config.json` gives.
#[derive(Default)]
struct ProcessorConfig {
    max_soft_tokens: Option<usize>,
    mel_bins: Option<usize>,
    sampling_rate: Option<usize>,
}

impl MediaEncoder {
    /// The towers of the checkpoint at `dir` (`None` when its config has neither a
    /// `vision_config` nor an `audio_config`).
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let vision_cfg = strata_config::VisionConfig::load(dir)?;
        let audio_cfg = strata_config::AudioConfig::load(dir)?;
        if vision_cfg.is_none() && audio_cfg.is_none() {
            return Ok(None);
        }
        // One open of the checkpoint serves both towers.
        let weights = strata_weights::Weights::open(dir).map_err(strata_model::ModelError::from)?;
        let vision = vision_cfg
            .map(|c| VisionTower::from_weights(c, &weights))
            .transpose()?;
        let audio = audio_cfg
            .map(|c| AudioTower::from_weights(c, &weights))
            .transpose()?;
        let p = processor_config(dir)?;
        let vision = vision.map(|v| {
            let cfg = v.config().clone();
            let patcher = ImagePatcher {
                patch_size: cfg.patch_size,
                pooling: cfg.pooling_kernel_size,
                max_soft_tokens: p
                    .max_soft_tokens
                    .unwrap_or(ImagePatcher::gemma4().max_soft_tokens),
            };
            Vision {
                cfg,
                patcher,
                tower: ImageTower::Host(Box::new(v)),
            }
        });
        let audio = match audio {
            None => None,
            Some(tower) => {
                let bins = p.mel_bins.unwrap_or(128);
                if bins != tower.config().subsampling_channels[0] {
                    return Err(EngineError::Invalid(format!(
                        "the feature extractor's {bins} mel bins are not the audio tower's {}",
                        tower.config().subsampling_channels[0]
                    )));
                }
                let rate = p.sampling_rate.unwrap_or(16_000);
                let mel = LogMel::new(rate, bins, 20.0, 10.0, 0.0, 8_000.0, 1e-3, 128);
                let c = tower.config();
                Some(AudioEncoder {
                    ids: (c.audio_token_id, c.boa_token_id, c.eoa_token_id),
                    tower: AudioTowerOn::Host(Box::new(tower)),
                    mel,
                    rate,
                })
            }
        };
        Ok(Some(Self {
            vision,
            audio,
            images: Combiner::new(IMAGES_A_PASS),
            hasher: Default::default(),
        }))
    }

    /// Moves the vision tower to GPU 0, on a CUDA stream of its own (so an image being
    /// encoded delays no decode step of the engine's stream), its products in bf16 (`bf16`)
    /// or f32; a request's images in one pass there. The host copy's memory is freed. A tower with
    /// clipped linears stays on the host (the device ops have no clamp).
    #[cfg(feature = "cuda")]
    pub fn vision_on_gpu(&mut self, bf16: bool) -> Result<()> {
        use strata_kernels::{cuda::CudaBackend, DType};
        use strata_model::DeviceVisionTower;
        let Some(Vision {
            tower: ImageTower::Host(tower),
            ..
        }) = &self.vision
        else {
            return Ok(());
        };
        if tower.config().clipped_linears {
            return Ok(());
        }
        let backend = CudaBackend::new(0)
            .map_err(|e| EngineError::Invalid(format!("the vision tower's CUDA stream: {e}")))?
            .with_bf16_gemm(bf16);
        let name = format!("cuda ({})", backend.device_name());
        let dtype = if bf16 { DType::BF16 } else { DType::F32 };
        let device = std::sync::Mutex::new(DeviceVisionTower::new(backend, tower, dtype)?);
        let encode: DeviceVision = Box::new(move |images| {
            let d = device.lock().unwrap_or_else(|p| p.into_inner());
            let out = d.encode_batch(images)?;
            Ok(out.into_iter().map(|o| (o.tokens, o.soft_tokens)).collect())
        });
        if let Some(v) = self.vision.as_mut() {
            v.tower = ImageTower::Device(encode, name);
        }
        Ok(())
    }

    /// Moves the audio tower to GPU 0, on a CUDA stream of its own (its subsampling
    /// convolutions stay on the host), its products in bf16 (`bf16`) or f32.
    #[cfg(feature = "cuda")]
    pub fn audio_on_gpu(&mut self, bf16: bool) -> Result<()> {
        use strata_kernels::{cuda::CudaBackend, DType};
        use strata_model::DeviceAudioTower;
        let Some(a) = self.audio.take() else {
            return Ok(());
        };
        let tower = match a.tower {
            AudioTowerOn::Host(t) => t,
            on_device => {
                self.audio = Some(AudioEncoder {
                    tower: on_device,
                    ..a
                });
                return Ok(());
            }
        };
        let backend = CudaBackend::new(0)
            .map_err(|e| EngineError::Invalid(format!("the audio tower's CUDA stream: {e}")))?
            .with_bf16_gemm(bf16);
        let name = format!("cuda ({})", backend.device_name());
        let dtype = if bf16 { DType::BF16 } else { DType::F32 };
        // The host tower moves into the device one, which keeps it for the subsampling.
        let device = std::sync::Mutex::new(DeviceAudioTower::new(backend, *tower, dtype)?);
        let encode: DeviceAudio = Box::new(move |features, bins| {
            let d = device.lock().unwrap_or_else(|p| p.into_inner());
            d.encode(features, bins)
        });
        self.audio = Some(AudioEncoder {
            tower: AudioTowerOn::Device(encode, name),
            ..a
        });
        Ok(())
    }

    /// Where audio is encoded: "host", or the GPU's name.
    pub fn audio_device(&self) -> &str {
        match self.audio.as_ref().map(|a| &a.tower) {
            Some(AudioTowerOn::Device(_, name)) => name,
            _ => "host",
        }
    }

    /// Where images are encoded: "host", or the GPU's name.
    pub fn image_device(&self) -> &str {
        match self.vision.as_ref().map(|v| &v.tower) {
            Some(ImageTower::Device(_, name)) => name,
            _ => "host",
        }
    }

    /// Whether the checkpoint has a vision tower.
    pub fn takes_images(&self) -> bool {
        self.vision.is_some()
    }

    /// Whether the checkpoint has an audio tower.
    pub fn takes_audio(&self) -> bool {
        self.audio.is_some()
    }

    fn hash(&self, bytes: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(bytes);
        h.finish()
    }

    /// Decodes a PNG, JPEG or WebP file and runs the vision tower on it: on the host, or
    /// on the GPU's tower of its own stream, so that no decode step waits for it.
    pub fn encode_image(&self, bytes: &[u8]) -> Result<MediaRows> {
        let image = self.decode_image(bytes)?;
        Ok(self.encode_decoded(vec![image])?.remove(0))
    }

    /// Decodes a PNG, JPEG or WebP file into the patches the tower takes (resized as the
    /// processor does); the file's content hash keys its rows in the prefix cache.
    pub fn decode_image(&self, bytes: &[u8]) -> Result<DecodedImage> {
        let Vision { patcher, .. } = self
            .vision
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("this model has no vision tower".into()))?;
        let p = patcher
            .decode(bytes)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        // Padding patches change no real row (they are masked as keys and pooled into
        // nothing): the tower runs on the image's own patches only.
        let real = p.positions.iter().take_while(|q| q[0] >= 0).count();
        let width = 3 * patcher.patch_size * patcher.patch_size;
        let (mut pixels, mut positions) = (p.pixels, p.positions);
        pixels.truncate(real * width);
        positions.truncate(real);
        Ok(DecodedImage {
            pixels,
            positions,
            hash: self.hash(bytes),
        })
    }

    /// Runs the tower on decoded images, in a pass it may share with other callers' images
    /// (up to 16 images; on a GPU one pass of the device tower, on the host one image
    /// after another).
    pub fn encode_decoded(&self, images: Vec<DecodedImage>) -> Result<Vec<MediaRows>> {
        let Vision { tower, .. } = self
            .vision
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("this model has no vision tower".into()))?;
        let pass = |images: &[DecodedImage]| -> Result<Vec<MediaRows>> {
            let patches: Vec<Patches<'_>> = images
                .iter()
                .map(|i| (i.pixels.as_slice(), i.positions.as_slice()))
                .collect();
            let encoded: Vec<(usize, Vec<f32>)> = match tower {
                ImageTower::Device(encode, _) => encode(&patches)?,
                ImageTower::Host(tower) => patches
                    .iter()
                    .map(|(pixels, positions)| {
                        let out = tower.encode(pixels, positions)?;
                        Ok((out.tokens, out.soft_tokens))
                    })
                    .collect::<Result<_>>()?,
            };
            Ok(encoded
                .into_iter()
                .zip(images)
                .map(|((rows, values), image)| MediaRows {
                    kind: MediaKind::Image,
                    rows,
                    values: values.into(),
                    hash: image.hash,
                })
                .collect())
        };
        self.images.run(images, &pass)
    }

    /// Vision tower passes run and the images they took, since the start.
    pub fn image_passes(&self) -> (u64, u64) {
        self.images.counts()
    }

    /// Decodes a WAV or MP3 file (refused past `max_seconds`), makes its log-mel features and runs
    /// the audio tower on its real frames (padding frames change no real row: the
    /// attention masks them and the convolutions see zeros either way).
    pub fn encode_audio(
        &self,
        bytes: &[u8],
        format: AudioFormat,
        max_seconds: f64,
    ) -> Result<MediaRows> {
        let a = self
            .audio
            .as_ref()
            .ok_or_else(|| EngineError::Invalid("this model has no audio tower".into()))?;
        let clip = match format {
            AudioFormat::Wav => strata_media::decode_wav(bytes, a.rate, max_seconds),
            AudioFormat::Mp3 => strata_media::decode_mp3(bytes, a.rate, max_seconds),
        }
        .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let f = a.mel.features(&clip);
        let real = f.mask.iter().take_while(|&&m| m).count();
        if real == 0 {
            return Err(EngineError::Invalid(
                "the audio clip is shorter than one feature frame".into(),
            ));
        }
        let features = &f.values[..real * f.bins];
        let out = match &a.tower {
            AudioTowerOn::Host(tower) => tower.encode(features, f.bins)?,
            AudioTowerOn::Device(encode, _) => encode(features, f.bins)?,
        };
        Ok(MediaRows {
            kind: MediaKind::Audio,
            rows: out.tokens,
            values: out.soft_tokens.into(),
            hash: self.hash(bytes),
        })
    }

    /// `prompt` with each placeholder the template wrote expanded to the item's opening id,
    /// its placeholders and its closing id, and the rows for them. The template must have
    /// written one placeholder per item, each kind in the items' order.
    pub fn place(
        &self,
        prompt: &[u32],
        items: &[MediaRows],
    ) -> Result<(Vec<u32>, Vec<MediaInput>)> {
        // (placeholder, open, close) of each kind the checkpoint has.
        let image = self.vision.as_ref().map(|v| {
            let c = &v.cfg;
            (c.image_token_id, c.boi_token_id, c.eoi_token_id)
        });
        let audio = self.audio.as_ref().map(|a| a.ids);
        let ids_of = |kind: MediaKind| match kind {
            MediaKind::Image => image,
            MediaKind::Audio => audio,
        };
        for kind in [MediaKind::Image, MediaKind::Audio] {
            let want = items.iter().filter(|i| i.kind == kind).count();
            let found =
                ids_of(kind).map_or(0, |(p, _, _)| prompt.iter().filter(|&&t| t == p).count());
            if found != want {
                return Err(EngineError::Invalid(format!(
                    "the chat template wrote {found} {kind:?} placeholders for {want} items"
                )));
            }
        }
        let extra: usize = items.iter().map(|i| i.rows + 1).sum();
        let mut ids = Vec::with_capacity(prompt.len() + extra);
        let mut media = Vec::with_capacity(items.len());
        let mut next_image = items.iter().filter(|i| i.kind == MediaKind::Image);
        let mut next_audio = items.iter().filter(|i| i.kind == MediaKind::Audio);
        for &t in prompt {
            let (item, (placeholder, open, close)) = match (image, audio) {
                (Some(i), _) if t == i.0 => (next_image.next(), i),
                (_, Some(a)) if t == a.0 => (next_audio.next(), a),
                _ => {
                    ids.push(t);
                    continue;
                }
            };
            let Some(item) = item else { break };
            ids.push(open);
            media.push(MediaInput {
                start: ids.len(),
                rows: item.rows,
                values: item.values.clone(),
                hash: item.hash,
            });
            ids.extend(std::iter::repeat_n(placeholder, item.rows));
            ids.push(close);
        }
        Ok((ids, media))
    }
}

/// The processor settings of `processor_config.json`'s `image_processor` and
/// `feature_extractor` (transformers 5), or of `preprocessor_config.json`.
fn processor_config(dir: &Path) -> Result<ProcessorConfig> {
    let dir = if dir.is_file() {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    let mut out = ProcessorConfig::default();
    for (file, nested) in [
        ("processor_config.json", true),
        ("preprocessor_config.json", false),
    ] {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
            continue;
        };
        let bad = |why: String| EngineError::Invalid(format!("{file}: {why}"));
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let (image, audio) = if nested {
            (&v["image_processor"], &v["feature_extractor"])
        } else {
            (&v, &v)
        };
        let count = |section: &serde_json::Value, key: &str| -> Result<Option<usize>> {
            match section.get(key) {
                None => Ok(None),
                Some(n) => match n.as_u64() {
                    Some(n @ 1..=1_000_000) => Ok(Some(n as usize)),
                    _ => Err(bad(format!("{key} {n} is not a count"))),
                },
            }
        };
        out.max_soft_tokens = out.max_soft_tokens.or(count(image, "max_soft_tokens")?);
        out.mel_bins = out.mel_bins.or(count(audio, "feature_size")?);
        out.sampling_rate = out.sampling_rate.or(count(audio, "sampling_rate")?);
    }
    Ok(out)
}
