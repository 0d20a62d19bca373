//! GGUF metadata -> `ModelConfig`.
//!
//! GGUF stores weights in the engine's final conventions (norm weights already `1 + w` for
//! Gemma-3), so the config records `SourceFormat::Gguf` and no norm offset.

use strata_gguf::{GgmlType, GgufFile, Value};

use crate::kv::assign_kv_sharing;
use crate::{
    Activation, Architecture, AttentionType, ConfigError, LayerConfig, ModelConfig, PerLayerInput,
    RopeConfig, RopeKind, RopeStyle, SourceFormat,
};

/// Typed metadata access under the architecture's key prefix; errors name the key.
struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl<'a> Meta<'a> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        self.file.get(&self.key(k))
    }

    fn usize_opt(&self, k: &str) -> Result<Option<usize>, ConfigError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                ConfigError::invalid(
                    self.key(k),
                    format!("expected an integer, found {}", v.type_name()),
                )
            }),
        }
    }

    fn usize_req(&self, k: &str) -> Result<usize, ConfigError> {
        match self.usize_opt(k)? {
            Some(0) => Err(ConfigError::invalid(self.key(k), "must be positive")),
            Some(v) => Ok(v),
            None => Err(ConfigError::Missing(self.key(k))),
        }
    }

    fn f64_opt(&self, k: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                ConfigError::invalid(
                    self.key(k),
                    format!("expected a number, found {}", v.type_name()),
                )
            }),
        }
    }

    /// A per-layer integer stored either once or as an array of `n`.
    fn per_layer(
        &self,
        k: &str,
        n: usize,
        default: Option<usize>,
    ) -> Result<Vec<usize>, ConfigError> {
        match self.get(k) {
            Some(Value::Array(a)) => {
                if a.items.len() != n {
                    return Err(ConfigError::invalid(
                        self.key(k),
                        format!("has {} entries for {n} layers", a.items.len()),
                    ));
                }
                a.items
                    .iter()
                    .map(|v| v.as_u64().map(|x| x as usize).filter(|&x| x > 0))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| ConfigError::invalid(self.key(k), "expected positive integers"))
            }
            Some(_) => Ok(vec![self.usize_req(k)?; n]),
            None => match default {
                Some(d) => Ok(vec![d; n]),
                None => Err(ConfigError::Missing(self.key(k))),
            },
        }
    }
}

/// The architecture of a Gemma-4 assistant (MTP drafter) GGUF.
pub(crate) const ASSISTANT_ARCH: &str = "gemma4-assistant";

pub(crate) fn parse(file: &GgufFile) -> Result<ModelConfig, ConfigError> {
    let arch_name = file
        .architecture()
        .ok_or_else(|| ConfigError::Missing("general.architecture".into()))?;
    if arch_name == ASSISTANT_ARCH {
        return Err(ConfigError::unsupported(
            "general.architecture",
            "gemma4-assistant is a draft model: serve its Gemma-4 target and pass it as --draft",
        ));
    }
    let config = parse_as(file, arch_name, false)?;
    crate::gguf_tensors::check(file, arch_name, &config)?;
    Ok(config)
}

/// A `gemma4-assistant` GGUF's decoder, parsed as a Gemma-4 text model whose layers own no
/// K/V of their own (each reads the target's, bound later): every layer must be listed as
/// shared (`attention.shared_kv_layers`), or none. Returns it with the assistant's own
/// fields.
pub(crate) fn parse_assistant_decoder(
    file: &GgufFile,
) -> Result<(ModelConfig, AssistantMeta), ConfigError> {
    let arch_name = file
        .architecture()
        .ok_or_else(|| ConfigError::Missing("general.architecture".into()))?;
    if arch_name != ASSISTANT_ARCH {
        return Err(ConfigError::unsupported(
            "general.architecture",
            format!("{arch_name:?} as a draft model; Strata drafts with gemma4-assistant"),
        ));
    }
    let m = Meta {
        file,
        arch: arch_name,
    };
    let n = m.usize_req("block_count")?;
    match m.usize_opt("attention.shared_kv_layers")?.unwrap_or(0) {
        0 => {}
        s if s == n => {}
        s => {
            return Err(ConfigError::unsupported(
                m.key("attention.shared_kv_layers"),
                format!(
                    "{s} of {n} layers shared: every layer of a draft model reads the target's K/V"
                ),
            ))
        }
    }
    if m.usize_opt("embedding_length_per_layer_input")?
        .unwrap_or(0)
        != 0
    {
        return Err(ConfigError::unsupported(
            m.key("embedding_length_per_layer_input"),
            "per-layer inputs in a draft model (must be 0)",
        ));
    }
    let decoder = parse_as(file, arch_name, true)?;
    crate::gguf_tensors::check(file, arch_name, &decoder)?;
    let meta = AssistantMeta {
        backbone_hidden_size: m.usize_req("embedding_length_out")?,
        sliding_window: m.usize_req("attention.sliding_window")?,
    };
    Ok((decoder, meta))
}

/// The assistant's own GGUF fields.
pub(crate) struct AssistantMeta {
    /// `embedding_length_out`: the target's hidden size.
    pub backbone_hidden_size: usize,
    /// `attention.sliding_window`.
    pub sliding_window: usize,
}

/// The model under `arch_name`'s keys. An `assistant` is a Gemma-4 decoder whose layers are
/// all KV-shared in the file; it is parsed with none shared (`bind` points them at the
/// target).
fn parse_as(file: &GgufFile, arch_name: &str, assistant: bool) -> Result<ModelConfig, ConfigError> {
    let arch = match (assistant, arch_name) {
        (true, _) | (false, "gemma4") => Architecture::Gemma4,
        (false, "gemma3") => Architecture::Gemma3,
        (false, "llama") => Architecture::Llama,
        (false, "qwen3") => Architecture::Qwen3,
        (false, other) => {
            return Err(ConfigError::unsupported(
                "general.architecture",
                format!("{other:?}; Strata serves gemma4, gemma3, llama and qwen3"),
            ))
        }
    };
    let m = Meta {
        file,
        arch: arch_name,
    };
    if m.get("expert_count").and_then(Value::as_u64).unwrap_or(0) > 0 {
        return Err(ConfigError::unsupported(
            m.key("expert_count"),
            "mixture-of-experts blocks",
        ));
    }
    let n = m.usize_req("block_count")?;
    let hidden = m.usize_req("embedding_length")?;
    let heads = m.usize_req("attention.head_count")?;
    let kv_heads = m.per_layer("attention.head_count_kv", n, Some(heads))?;
    let widths = m.per_layer("feed_forward_length", n, None)?;
    let key_len = m
        .usize_opt("attention.key_length")?
        .unwrap_or(hidden / heads);
    let eps = m
        .f64_opt("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-6);
    let theta = m.f64_opt("rope.freq_base")?.unwrap_or(1e4);
    let vocab = match m.usize_opt("vocab_size")? {
        Some(v) => v,
        None => file
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .map(<[Value]>::len)
            .ok_or_else(|| {
                ConfigError::Missing(format!("{arch_name}.vocab_size or tokenizer.ggml.tokens"))
            })?,
    };
    for (l, &kv) in kv_heads.iter().enumerate() {
        if kv == 0 || heads % kv != 0 {
            return Err(ConfigError::invalid(
                m.key("attention.head_count_kv"),
                format!("layer {l}: {kv} KV heads do not divide {heads} heads"),
            ));
        }
    }
    let window = m.usize_opt("attention.sliding_window")?;
    let types = layer_types(&m, arch, n)?;
    if types.contains(&AttentionType::Sliding) && window.is_none() {
        return Err(ConfigError::Missing(m.key("attention.sliding_window")));
    }
    let scaling = rope_scaling(&m)?;
    let style = if arch == Architecture::Llama {
        RopeStyle::Interleaved
    } else {
        RopeStyle::Neox
    };
    let mut full_rope = RopeConfig {
        style,
        ..RopeConfig::new(theta, scaling)
    };
    let swa_theta = m.f64_opt("rope.freq_base_swa")?.unwrap_or(1e4);
    let sliding_rope = RopeConfig {
        style,
        ..RopeConfig::new(swa_theta, RopeKind::Default)
    };
    let mut swa_dim = key_len;
    if arch == Architecture::Gemma4 {
        swa_dim = m.usize_opt("attention.key_length_swa")?.unwrap_or(256);
        full_rope.kind = RopeKind::Proportional;
        full_rope.partial_rotary_factor = gemma4_rotary_fraction(&m, key_len)?;
    } else if let Some(rot) = m.usize_opt("rope.dimension_count")? {
        if rot == 0 || rot > key_len || rot % 2 != 0 {
            return Err(ConfigError::invalid(
                m.key("rope.dimension_count"),
                format!("{rot} for head dim {key_len}"),
            ));
        }
        full_rope.partial_rotary_factor = rot as f64 / key_len as f64;
    }
    let mut layers: Vec<LayerConfig> = (0..n)
        .map(|l| {
            let full = types[l] == AttentionType::Full;
            LayerConfig {
                attention: types[l],
                head_dim: if full { key_len } else { swa_dim },
                num_kv_heads: kv_heads[l],
                window: if full { None } else { window },
                rope: if full || arch != Architecture::Gemma4 && arch != Architecture::Gemma3 {
                    full_rope
                } else {
                    sliding_rope
                },
                intermediate_size: widths[l],
                kv_source: None,
            }
        })
        .collect();
    let shared = match assistant {
        true => 0,
        false => m.usize_opt("attention.shared_kv_layers")?.unwrap_or(0),
    };
    // GGUF already lists the doubled widths of KV-shared layers in feed_forward_length.
    assign_kv_sharing(
        &mut layers,
        shared,
        false,
        &m.key("attention.shared_kv_layers"),
    )?;
    let gemma = matches!(arch, Architecture::Gemma4 | Architecture::Gemma3);
    let attention_scale = match arch {
        Architecture::Gemma4 => 1.0,
        // Gemma-3 27B scales by hidden/heads (query_pre_attn_scalar 168); the others by head dim.
        Architecture::Gemma3 if n == 62 => ((hidden / heads) as f64).powf(-0.5),
        _ => (key_len as f64).powf(-0.5),
    };
    let ple = m
        .usize_opt("embedding_length_per_layer_input")?
        .unwrap_or(0);
    let token_id = |k: &str| file.get(k).and_then(Value::as_u64).map(|v| v as u32);
    let mut eos: Vec<u32> = [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ]
    .iter()
    .filter_map(|k| token_id(k))
    .collect();
    eos.dedup();
    Ok(ModelConfig {
        architecture: arch,
        source_format: SourceFormat::Gguf,
        vocab_size: vocab,
        hidden_size: hidden,
        num_attention_heads: heads,
        layers,
        rms_norm_eps: eps,
        activation: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        max_position_embeddings: m.usize_opt("context_length")?.unwrap_or(4096),
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        attention_scale,
        final_logit_softcapping: m.f64_opt("final_logit_softcapping")?,
        attn_logit_softcapping: m.f64_opt("attn_logit_softcapping")?,
        norm_weight_offset: 0.0,
        scale_embeddings: gemma,
        qk_norm: arch != Architecture::Llama,
        v_norm: arch == Architecture::Gemma4,
        sandwich_norms: gemma,
        layer_scalar: arch == Architecture::Gemma4,
        per_layer_input: (ple > 0).then_some(PerLayerInput {
            hidden_size: ple,
            vocab_size: vocab,
        }),
        num_kv_shared_layers: shared,
        bos_token_id: token_id("tokenizer.ggml.bos_token_id"),
        eos_token_ids: eos,
        pad_token_id: token_id("tokenizer.ggml.padding_token_id"),
        placeholder_ids: Vec::new(),
        dtype: None,
    })
}

fn layer_types(m: &Meta, arch: Architecture, n: usize) -> Result<Vec<AttentionType>, ConfigError> {
    let from_pattern = |p: usize| {
        (0..n)
            .map(|i| {
                if (i + 1) % p == 0 {
                    AttentionType::Full
                } else {
                    AttentionType::Sliding
                }
            })
            .collect()
    };
    match m.get("attention.sliding_window_pattern") {
        // One bool per layer, true = sliding.
        Some(Value::Array(a)) => {
            if a.items.len() != n {
                return Err(ConfigError::invalid(
                    m.key("attention.sliding_window_pattern"),
                    format!("has {} entries for {n} layers", a.items.len()),
                ));
            }
            a.items
                .iter()
                .map(|v| match v.as_bool() {
                    Some(true) => Ok(AttentionType::Sliding),
                    Some(false) => Ok(AttentionType::Full),
                    None => Err(ConfigError::invalid(
                        m.key("attention.sliding_window_pattern"),
                        "expected bools",
                    )),
                })
                .collect()
        }
        Some(v) => match v.as_u64() {
            Some(p) if p > 0 => Ok(from_pattern(p as usize)),
            _ => Err(ConfigError::invalid(
                m.key("attention.sliding_window_pattern"),
                "expected a period or bools",
            )),
        },
        // llama.cpp assumes Gemma-3's five sliding layers to one full layer.
        None if arch == Architecture::Gemma3 => Ok(from_pattern(6)),
        None if arch == Architecture::Gemma4 => Err(ConfigError::Missing(
            m.key("attention.sliding_window_pattern"),
        )),
        None => Ok(vec![AttentionType::Full; n]),
    }
}

fn rope_scaling(m: &Meta) -> Result<RopeKind, ConfigError> {
    let ty = m
        .get("rope.scaling.type")
        .and_then(Value::as_str)
        .unwrap_or("none");
    match ty {
        "none" => Ok(RopeKind::Default),
        "linear" => {
            let factor = m.f64_opt("rope.scaling.factor")?.unwrap_or(1.0);
            Ok(if factor == 1.0 {
                RopeKind::Default
            } else {
                RopeKind::Linear { factor }
            })
        }
        other => Err(ConfigError::unsupported(
            m.key("rope.scaling.type"),
            format!("RoPE scaling {other:?}"),
        )),
    }
}

/// Gemma-4 GGUF emulates proportional RoPE with a `rope_freqs` tensor: 1.0 for the pairs that
/// rotate, 1e30 for the rest. The count of rotating pairs gives the partial factor.
fn gemma4_rotary_fraction(m: &Meta, head_dim: usize) -> Result<f64, ConfigError> {
    let file = m.file;
    let Some(t) = file.tensor("rope_freqs.weight") else {
        return Ok(0.25);
    };
    if t.ggml_type != GgmlType::F32 {
        return Err(ConfigError::invalid(
            "rope_freqs.weight",
            format!("expected F32 values, found {}", t.ggml_type),
        ));
    }
    if t.elements() as usize != head_dim / 2 {
        // One value a rotation pair of a full-attention head.
        return Err(ConfigError::invalid(
            m.key("attention.key_length"),
            format!(
                "says {head_dim}, but rope_freqs.weight has {} values (half the head dim)",
                t.elements()
            ),
        ));
    }
    let rotating = file
        .tensor_data(t)
        .chunks_exact(4)
        .take_while(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) < 1e20)
        .count();
    Ok(2.0 * rotating as f64 / head_dim as f64)
}
