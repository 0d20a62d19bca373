//! KV cache formats: what the user asks for (`--kv-cache-dtype`) and what is stored.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};
use strata_config::ModelConfig;

use crate::KvError;

/// The `--kv-cache-dtype` choice. `Auto` follows the model's dtype.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvCacheDtype {
    /// Store what the model computes in ([`ModelDtype`]).
    #[default]
    Auto,
    /// bfloat16 values, no scales.
    Bf16,
    /// IEEE f16 values, no scales.
    F16,
    /// f32 values, no scales.
    F32,
    /// OCP e4m3 values, one f32 scale per token and KV head (for K and for V).
    Fp8PerTokenHead,
    /// Symmetric int8 values, one f32 scale per token and KV head (for K and for V).
    Int8PerTokenHead,
}

impl KvCacheDtype {
    /// Every choice; `FromStr` accepts their [`name`](Self::name)s.
    pub const ALL: [KvCacheDtype; 6] = [
        KvCacheDtype::Auto,
        KvCacheDtype::Bf16,
        KvCacheDtype::F16,
        KvCacheDtype::F32,
        KvCacheDtype::Fp8PerTokenHead,
        KvCacheDtype::Int8PerTokenHead,
    ];

    /// The canonical spelling, as accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::F16 => "f16",
            KvCacheDtype::F32 => "f32",
            KvCacheDtype::Fp8PerTokenHead => "fp8_per_token_head",
            KvCacheDtype::Int8PerTokenHead => "int8_per_token_head",
        }
    }

    /// The stored format once `Auto` is resolved against the model's dtype.
    pub fn resolve(self, model_dtype: ModelDtype) -> KvFormat {
        match self {
            KvCacheDtype::Auto => match model_dtype {
                ModelDtype::Bf16 => KvFormat::Bf16,
                ModelDtype::F16 => KvFormat::F16,
                ModelDtype::F32 => KvFormat::F32,
            },
            KvCacheDtype::Bf16 => KvFormat::Bf16,
            KvCacheDtype::F16 => KvFormat::F16,
            KvCacheDtype::F32 => KvFormat::F32,
            KvCacheDtype::Fp8PerTokenHead => KvFormat::Fp8E4m3PerTokenHead,
            KvCacheDtype::Int8PerTokenHead => KvFormat::Int8PerTokenHead,
        }
    }
}

impl FromStr for KvCacheDtype {
    type Err = KvError;

    fn from_str(s: &str) -> Result<Self, KvError> {
        let lower = s.trim().to_ascii_lowercase();
        KvCacheDtype::ALL
            .into_iter()
            .find(|d| d.name() == lower)
            .ok_or_else(|| KvError::UnknownKvCacheDtype(s.to_string()))
    }
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for KvCacheDtype {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The dtype the model computes in; it decides what `auto` stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelDtype {
    /// bfloat16.
    #[default]
    Bf16,
    /// IEEE f16.
    F16,
    /// f32.
    F32,
}

impl ModelDtype {
    /// The dtype a checkpoint declares (`torch_dtype` / `dtype`); bf16 when it declares none,
    /// which is what Gemma, Llama and Qwen3 checkpoints ship in.
    pub fn from_config(cfg: &ModelConfig) -> Result<Self, KvError> {
        cfg.dtype
            .as_deref()
            .map_or(Ok(ModelDtype::Bf16), str::parse)
    }
}

impl FromStr for ModelDtype {
    type Err = KvError;

    fn from_str(s: &str) -> Result<Self, KvError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bfloat16" | "bf16" => Ok(ModelDtype::Bf16),
            "float16" | "f16" | "half" | "fp16" => Ok(ModelDtype::F16),
            "float32" | "f32" | "float" | "fp32" => Ok(ModelDtype::F32),
            _ => Err(KvError::UnknownModelDtype(s.to_string())),
        }
    }
}

/// What one K or V element is stored as, and whether a per-(token, head) scale sits beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvFormat {
    /// bfloat16, 2 bytes.
    Bf16,
    /// IEEE f16, 2 bytes.
    F16,
    /// f32, 4 bytes.
    F32,
    /// OCP FP8 e4m3, 1 byte, with an f32 scale per token and KV head.
    Fp8E4m3PerTokenHead,
    /// Symmetric int8, 1 byte, with an f32 scale per token and KV head.
    Int8PerTokenHead,
}

impl KvFormat {
    /// Bytes of one stored K or V element.
    pub fn element_bytes(self) -> usize {
        match self {
            KvFormat::F32 => 4,
            KvFormat::Bf16 | KvFormat::F16 => 2,
            KvFormat::Fp8E4m3PerTokenHead | KvFormat::Int8PerTokenHead => 1,
        }
    }

    /// Bytes of the scale kept per token and KV head, for K and again for V (0: no scales).
    pub fn scale_bytes(self) -> usize {
        if self.has_scales() {
            std::mem::size_of::<f32>()
        } else {
            0
        }
    }

    /// Whether an f32 scale per token and KV head sits beside the values.
    pub fn has_scales(self) -> bool {
        matches!(
            self,
            KvFormat::Fp8E4m3PerTokenHead | KvFormat::Int8PerTokenHead
        )
    }

    /// The `--kv-cache-dtype` that names this format.
    pub fn cache_dtype(self) -> KvCacheDtype {
        match self {
            KvFormat::Bf16 => KvCacheDtype::Bf16,
            KvFormat::F16 => KvCacheDtype::F16,
            KvFormat::F32 => KvCacheDtype::F32,
            KvFormat::Fp8E4m3PerTokenHead => KvCacheDtype::Fp8PerTokenHead,
            KvFormat::Int8PerTokenHead => KvCacheDtype::Int8PerTokenHead,
        }
    }
}

impl fmt::Display for KvFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.cache_dtype().name())
    }
}
