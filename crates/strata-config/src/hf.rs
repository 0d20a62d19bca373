//! Hugging Face `config.json` -> `ModelConfig`.

use serde_json::{Map, Value};

use crate::kv::assign_kv_sharing;
use crate::{
    Activation, Architecture, AttentionType, ConfigError, LayerConfig, ModelConfig, PerLayerInput,
    RopeConfig, RopeKind, SourceFormat,
};

pub(crate) type Obj = Map<String, Value>;

/// Typed access to a JSON object whose errors name the field.
pub(crate) struct Fields<'a> {
    pub(crate) obj: &'a Obj,
    /// Path prefix for error messages (`text_config.` inside multimodal configs).
    pub(crate) prefix: &'a str,
}

impl<'a> Fields<'a> {
    pub(crate) fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The value, treating JSON null as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// The value as `pick` reads it; an error naming the field and what was `expected`
    /// when `pick` finds none.
    fn typed<T>(
        &self,
        key: &str,
        expected: &str,
        pick: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => pick(v).map(Some).ok_or_else(|| {
                ConfigError::invalid(self.name(key), format!("expected {expected}, found {v}"))
            }),
        }
    }

    pub(crate) fn usize_opt(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        self.typed(key, "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    pub(crate) fn usize_or(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        Ok(self.usize_opt(key)?.unwrap_or(default))
    }

    pub(crate) fn usize_req(&self, key: &str) -> Result<usize, ConfigError> {
        self.usize_opt(key)?
            .ok_or_else(|| ConfigError::Missing(self.name(key)))
    }

    pub(crate) fn positive(&self, key: &str, default: Option<usize>) -> Result<usize, ConfigError> {
        let v = match default {
            Some(d) => self.usize_or(key, d)?,
            None => self.usize_req(key)?,
        };
        if v == 0 {
            return Err(ConfigError::invalid(self.name(key), "must be positive"));
        }
        Ok(v)
    }

    pub(crate) fn f64_opt(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        self.typed(key, "a number", Value::as_f64)
    }

    pub(crate) fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        Ok(self.f64_opt(key)?.unwrap_or(default))
    }

    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        Ok(self
            .typed(key, "true or false", Value::as_bool)?
            .unwrap_or(default))
    }

    pub(crate) fn str_opt(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        self.typed(key, "a string", Value::as_str)
    }

    pub(crate) fn obj_opt(&self, key: &str) -> Result<Option<&'a Obj>, ConfigError> {
        self.typed(key, "an object", Value::as_object)
    }

    /// Token ids given as one integer or a list.
    fn ids(&self, key: &str) -> Result<Vec<u32>, ConfigError> {
        let bad = |v: &Value| {
            ConfigError::invalid(self.name(key), format!("expected token id(s), found {v}"))
        };
        let one = |v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(v))
        };
        match self.get(key) {
            None => Ok(vec![]),
            Some(Value::Array(items)) => items.iter().map(one).collect(),
            Some(v) => Ok(vec![one(v)?]),
        }
    }
}

/// Parses a `config.json` document.
/// The document's top-level object.
/// A multimodal config's tower section (`prefix` `vision_config.` or `audio_config.`) as
/// fields named under it, with the text model's width its soft tokens take; `None` when the
/// config has no such tower.
pub(crate) fn tower_section<'a>(
    root: &'a Obj,
    prefix: &'static str,
) -> Result<Option<(Fields<'a>, usize)>, ConfigError> {
    let key = prefix.trim_end_matches('.');
    let top = Fields {
        obj: root,
        prefix: "",
    };
    let Some(section) = top.obj_opt(key)? else {
        return Ok(None);
    };
    let tc = top
        .obj_opt("text_config")?
        .ok_or_else(|| ConfigError::Missing("text_config".into()))?;
    let text_hidden_size = Fields {
        obj: tc,
        prefix: "text_config.",
    }
    .positive("hidden_size", None)?;
    Ok(Some((
        Fields {
            obj: section,
            prefix,
        },
        text_hidden_size,
    )))
}

/// A top-level token id of a multimodal config (`default` when absent).
pub(crate) fn token_id(top: &Fields, key: &str, default: usize) -> Result<u32, ConfigError> {
    let id = top.usize_or(key, default)?;
    u32::try_from(id)
        .map_err(|_| ConfigError::invalid(top.name(key), format!("{id} is no token id")))
}

pub(crate) fn root_object(text: &str) -> Result<Obj, ConfigError> {
    match serde_json::from_str(text)? {
        Value::Object(root) => Ok(root),
        _ => Err(ConfigError::invalid(
            "(root)",
            "config.json must be a JSON object",
        )),
    }
}

/// Refuses a `quantization_config` Strata cannot serve, naming its method: only
/// bitsandbytes 4-bit (NF4 or FP4, with or without double quantization) is dequantized at
/// load (`strata_weights::bnb`).
fn check_quantization(root: &Obj) -> Result<(), ConfigError> {
    let Some(q) = root.get("quantization_config") else {
        return Ok(());
    };
    let field = "quantization_config.quant_method";
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("(none)");
    let flag = |k: &str| q.get(k).and_then(Value::as_bool) == Some(true);
    match method {
        "bitsandbytes" if flag("load_in_4bit") || flag("_load_in_4bit") => {
            match q.get("bnb_4bit_quant_type").and_then(Value::as_str) {
                None | Some("nf4" | "fp4") => Ok(()),
                Some(other) => Err(ConfigError::unsupported(
                    "quantization_config.bnb_4bit_quant_type",
                    format!("bitsandbytes 4-bit type {other:?}"),
                )),
            }
        }
        "bitsandbytes" => Err(ConfigError::unsupported(
            field,
            "bitsandbytes 8-bit (LLM.int8) weights",
        )),
        other => Err(ConfigError::unsupported(
            field,
            format!("weights quantized with {other:?}"),
        )),
    }
}

pub(crate) fn parse(text: &str) -> Result<ModelConfig, ConfigError> {
    let root = root_object(text)?;
    check_quantization(&root)?;
    let top = Fields {
        obj: &root,
        prefix: "",
    };
    let model_type = top
        .str_opt("model_type")?
        .ok_or_else(|| ConfigError::Missing("model_type".into()))?;
    // Multimodal wrappers keep the text model under `text_config`.
    let (tc, prefix) = match top.obj_opt("text_config")? {
        Some(tc) => (tc, "text_config."),
        None => (&root, ""),
    };
    let f = Fields { obj: tc, prefix };
    let arch = match model_type {
        "gemma4" | "gemma4_text" => Architecture::Gemma4,
        "gemma3" | "gemma3_text" => Architecture::Gemma3,
        "llama" => Architecture::Llama,
        "qwen3" => Architecture::Qwen3,
        other => {
            return Err(ConfigError::unsupported(
                "model_type",
                format!("{other:?}; Strata serves gemma4, gemma4_text, gemma3, gemma3_text, llama and qwen3"),
            ))
        }
    };
    let mut cfg = match arch {
        Architecture::Gemma4 => gemma4(&f)?,
        Architecture::Gemma3 => gemma3(&f)?,
        Architecture::Llama | Architecture::Qwen3 => llama_like(&f, arch)?,
    };
    // A multimodal Gemma-4 checkpoint (text_config inside): its placeholder ids embed as
    // pad, as `Gemma4Model` embeds them.
    if arch == Architecture::Gemma4 && !std::ptr::eq(f.obj, top.obj) {
        for key in ["image_token_id", "audio_token_id", "video_token_id"] {
            cfg.placeholder_ids.extend(top.ids(key)?);
        }
        cfg.placeholder_ids
            .retain(|&id| (id as usize) < cfg.vocab_size);
    }
    // Token ids and dtype may sit at either level in multimodal configs.
    for fields in [&f, &top] {
        if cfg.bos_token_id.is_none() {
            cfg.bos_token_id = fields.ids("bos_token_id")?.first().copied();
        }
        if cfg.eos_token_ids.is_empty() {
            cfg.eos_token_ids = fields.ids("eos_token_id")?;
        }
        if cfg.pad_token_id.is_none() {
            cfg.pad_token_id = fields.ids("pad_token_id")?.first().copied();
        }
        if cfg.dtype.is_none() {
            cfg.dtype = fields
                .str_opt("dtype")?
                .or(fields.str_opt("torch_dtype")?)
                .map(str::to_string);
        }
    }
    Ok(cfg)
}

fn activation(f: &Fields, key: &str, default: &str) -> Result<Activation, ConfigError> {
    match f.str_opt(key)?.unwrap_or(default) {
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Ok(Activation::GeluTanh),
        "silu" | "swish" => Ok(Activation::Silu),
        other => Err(ConfigError::unsupported(
            f.name(key),
            format!("activation {other:?}"),
        )),
    }
}

/// `layer_types` when given explicitly; checks its length and spelling.
fn explicit_layer_types(f: &Fields, n: usize) -> Result<Option<Vec<AttentionType>>, ConfigError> {
    let Some(v) = f.get("layer_types") else {
        return Ok(None);
    };
    let field = f.name("layer_types");
    let Value::Array(items) = v else {
        return Err(ConfigError::invalid(field, "expected a list"));
    };
    if items.len() != n {
        return Err(ConfigError::invalid(
            field,
            format!(
                "has {} entries for {n} layers (num_hidden_layers)",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            Some("full_attention") => Ok(AttentionType::Full),
            Some("sliding_attention") => Ok(AttentionType::Sliding),
            _ => Err(ConfigError::unsupported(
                format!("{field}[{i}]"),
                format!("attention type {t}"),
            )),
        })
        .map(|r| r.map(Some))
        .collect::<Result<Option<Vec<_>>, _>>()
}

/// Parses one RoPE parameter object (`rope_parameters[type]`, `rope_parameters` or
/// `rope_scaling`); `theta` fills in when the object has no `rope_theta`.
fn rope_from(
    obj: Option<&Obj>,
    field: &str,
    theta: f64,
    default_kind: &str,
) -> Result<RopeConfig, ConfigError> {
    let empty = Obj::new();
    let f = Fields {
        obj: obj.unwrap_or(&empty),
        prefix: "",
    };
    let named = |k: &str| format!("{field}.{k}");
    let num = |k: &str| -> Result<Option<f64>, ConfigError> {
        f.f64_opt(k)
            .map_err(|_| ConfigError::invalid(named(k), "expected a number"))
    };
    let theta = num("rope_theta")?.unwrap_or(theta);
    let kind_name = f
        .str_opt("rope_type")?
        .or(f.str_opt("type")?)
        .unwrap_or(default_kind);
    let factor = num("factor")?;
    let kind = match kind_name {
        "default" => RopeKind::Default,
        "proportional" => {
            if factor.is_some_and(|x| x != 1.0) {
                return Err(ConfigError::unsupported(
                    named("factor"),
                    "proportional RoPE with a factor",
                ));
            }
            RopeKind::Proportional
        }
        "linear" => RopeKind::Linear {
            factor: factor.ok_or_else(|| ConfigError::Missing(named("factor")))?,
        },
        "llama3" => RopeKind::Llama3 {
            factor: factor.ok_or_else(|| ConfigError::Missing(named("factor")))?,
            low_freq_factor: num("low_freq_factor")?
                .ok_or_else(|| ConfigError::Missing(named("low_freq_factor")))?,
            high_freq_factor: num("high_freq_factor")?
                .ok_or_else(|| ConfigError::Missing(named("high_freq_factor")))?,
            original_max_position_embeddings: num("original_max_position_embeddings")?
                .ok_or_else(|| ConfigError::Missing(named("original_max_position_embeddings")))?,
        },
        other => {
            return Err(ConfigError::unsupported(
                named("rope_type"),
                format!("RoPE type {other:?}"),
            ))
        }
    };
    if !(theta.is_finite() && theta > 1.0) {
        return Err(ConfigError::invalid(
            named("rope_theta"),
            format!("{theta} is not a usable base"),
        ));
    }
    let mut rope = RopeConfig::new(theta, kind);
    if let Some(p) = num("partial_rotary_factor")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ConfigError::invalid(
                named("partial_rotary_factor"),
                format!("{p} is outside (0, 1]"),
            ));
        }
        rope.partial_rotary_factor = p;
    }
    Ok(rope)
}

/// RoPE per attention type: `rope_parameters` keyed by layer type (transformers 5), a flat
/// `rope_parameters`, or the legacy `rope_theta` + `rope_scaling` (+ `rope_local_base_freq`).
fn ropes(
    f: &Fields,
    full_default: (f64, &str),
    sliding_theta_key: Option<&str>,
    sliding_default: (f64, &str),
) -> Result<(RopeConfig, RopeConfig), ConfigError> {
    let field = f.name("rope_parameters");
    if let Some(rp) = f.obj_opt("rope_parameters")? {
        let per_type = |k: &str| rp.get(k).and_then(Value::as_object);
        if per_type("full_attention").is_some() || per_type("sliding_attention").is_some() {
            let full = rope_from(
                per_type("full_attention"),
                &format!("{field}.full_attention"),
                full_default.0,
                full_default.1,
            )?;
            let sliding = rope_from(
                per_type("sliding_attention"),
                &format!("{field}.sliding_attention"),
                sliding_default.0,
                sliding_default.1,
            )?;
            return Ok((full, sliding));
        }
        let one = rope_from(Some(rp), &field, full_default.0, full_default.1)?;
        return Ok((one, one));
    }
    let theta = f.f64_or("rope_theta", full_default.0)?;
    let full = rope_from(
        f.obj_opt("rope_scaling")?,
        &f.name("rope_scaling"),
        theta,
        full_default.1,
    )?;
    let sliding = match sliding_theta_key {
        Some(k) => rope_from(
            None,
            &f.name(k),
            f.f64_or(k, sliding_default.0)?,
            sliding_default.1,
        )?,
        None => full,
    };
    Ok((full, sliding))
}

/// Per-layer MLP widths: one integer for all layers, or a list.
fn mlp_widths(f: &Fields, n: usize, default: Option<usize>) -> Result<Vec<usize>, ConfigError> {
    let field = f.name("intermediate_size");
    match f.get("intermediate_size") {
        Some(Value::Array(items)) if items.len() == n => items
            .iter()
            .map(|v| v.as_u64().map(|x| x as usize).filter(|&x| x > 0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ConfigError::invalid(field, "expected positive integers")),
        Some(Value::Array(items)) => Err(ConfigError::invalid(
            field,
            format!("has {} entries for {n} layers", items.len()),
        )),
        _ => Ok(vec![f.positive("intermediate_size", default)?; n]),
    }
}

struct Common {
    n: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    vocab: usize,
}

fn common(f: &Fields, vocab_default: Option<usize>) -> Result<Common, ConfigError> {
    let n = f.positive("num_hidden_layers", None)?;
    let hidden = f.positive("hidden_size", None)?;
    let heads = f.positive("num_attention_heads", None)?;
    let kv_heads = f.positive("num_key_value_heads", Some(heads))?;
    if heads % kv_heads != 0 {
        return Err(ConfigError::invalid(
            f.name("num_key_value_heads"),
            format!("{kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    let vocab = f.positive("vocab_size", vocab_default)?;
    Ok(Common {
        n,
        hidden,
        heads,
        kv_heads,
        vocab,
    })
}

fn refuse_true(f: &Fields, key: &str, what: &str) -> Result<(), ConfigError> {
    if f.bool_or(key, false)? {
        return Err(ConfigError::unsupported(f.name(key), what));
    }
    Ok(())
}

pub(crate) fn gemma4(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let c = common(f, Some(262144))?;
    refuse_true(f, "enable_moe_block", "mixture-of-experts blocks")?;
    refuse_true(f, "attention_k_eq_v", "attention with K = V on full layers")?;
    refuse_true(f, "attention_bias", "biases in attention projections")?;
    match f.get("use_bidirectional_attention") {
        None | Some(Value::Bool(false)) => {}
        Some(v) => {
            return Err(ConfigError::unsupported(
                f.name("use_bidirectional_attention"),
                format!("bidirectional attention ({v})"),
            ))
        }
    }
    let mut types = explicit_layer_types(f, c.n)?.unwrap_or_else(|| {
        (0..c.n)
            .map(|i| {
                if (i + 1) % 6 == 0 {
                    AttentionType::Full
                } else {
                    AttentionType::Sliding
                }
            })
            .collect()
    });
    // transformers forces the last layer to full attention.
    types[c.n - 1] = AttentionType::Full;
    let head_dim = f.positive("head_dim", Some(256))?;
    let global_head_dim = f.positive("global_head_dim", Some(512))?;
    let window = f.positive("sliding_window", Some(512))?;
    let (full_rope, sliding_rope) = ropes(
        f,
        (1e6, "proportional"),
        Some("rope_local_base_freq"),
        (1e4, "default"),
    )?;
    let mut full_rope = full_rope;
    if f.obj_opt("rope_parameters")?.is_none() {
        // Legacy field layout: Gemma-4's full layers are proportional with factor 0.25.
        full_rope.partial_rotary_factor = 0.25;
    }
    let per_layer = f.obj_opt("per_layer_config")?;
    let widths = mlp_widths(f, c.n, Some(9216))?;
    let mut layers = Vec::with_capacity(c.n);
    for (i, &ty) in types.iter().enumerate() {
        let full = ty == AttentionType::Full;
        let mut d = if full && per_layer.is_none() {
            global_head_dim
        } else {
            head_dim
        };
        let mut nkv = c.kv_heads;
        let mut width = widths[i];
        if let Some(overrides) = per_layer.and_then(|p| layer_override(p, i)) {
            let path = format!("{}per_layer_config.{i}", f.prefix);
            for (k, v) in overrides {
                let val = v
                    .as_u64()
                    .map(|x| x as usize)
                    .filter(|&x| x > 0)
                    .ok_or_else(|| {
                        ConfigError::invalid(format!("{path}.{k}"), "expected a positive integer")
                    })?;
                match k.as_str() {
                    "head_dim" => d = val,
                    "num_key_value_heads" => nkv = val,
                    "intermediate_size" => width = val,
                    _ => {
                        return Err(ConfigError::unsupported(
                            format!("{path}.{k}"),
                            "per-layer override",
                        ))
                    }
                }
            }
        }
        if c.heads % nkv != 0 {
            return Err(ConfigError::invalid(
                format!("layer {i} num_key_value_heads"),
                format!("{nkv} does not divide {} attention heads", c.heads),
            ));
        }
        layers.push(LayerConfig {
            attention: ty,
            head_dim: d,
            num_kv_heads: nkv,
            window: (!full).then_some(window),
            rope: if full { full_rope } else { sliding_rope },
            intermediate_size: width,
            kv_source: None,
        });
    }
    let shared = f.usize_or("num_kv_shared_layers", 0)?;
    let double = f.bool_or("use_double_wide_mlp", false)?;
    assign_kv_sharing(&mut layers, shared, double, &f.name("num_kv_shared_layers"))?;
    let ple_hidden = f.usize_or("hidden_size_per_layer_input", 256)?;
    let ple_vocab = f.usize_or("vocab_size_per_layer_input", c.vocab)?;
    Ok(ModelConfig {
        architecture: Architecture::Gemma4,
        source_format: SourceFormat::HuggingFace,
        vocab_size: c.vocab,
        hidden_size: c.hidden,
        num_attention_heads: c.heads,
        layers,
        rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
        activation: activation(f, "hidden_activation", "gelu_pytorch_tanh")?,
        max_position_embeddings: f.positive("max_position_embeddings", Some(131072))?,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", true)?,
        attention_scale: 1.0,
        final_logit_softcapping: f.f64_opt("final_logit_softcapping")?,
        attn_logit_softcapping: None,
        norm_weight_offset: 0.0,
        scale_embeddings: true,
        qk_norm: true,
        v_norm: true,
        sandwich_norms: true,
        layer_scalar: true,
        per_layer_input: (ple_hidden > 0).then_some(PerLayerInput {
            hidden_size: ple_hidden,
            vocab_size: ple_vocab,
        }),
        num_kv_shared_layers: shared,
        bos_token_id: None,
        eos_token_ids: vec![],
        pad_token_id: None,
        placeholder_ids: Vec::new(),
        dtype: None,
    })
}

/// The `per_layer_config` entry of layer `i`; keys are layer indices, possibly zero-padded.
fn layer_override(p: &Obj, i: usize) -> Option<&Obj> {
    p.iter()
        .find(|(k, _)| {
            k.trim_start_matches('0').parse::<usize>().ok().unwrap_or(0) == i && !k.is_empty()
        })
        .and_then(|(_, v)| v.as_object())
}

fn gemma3(f: &Fields) -> Result<ModelConfig, ConfigError> {
    let c = common(f, Some(262208))?;
    refuse_true(f, "attention_bias", "biases in attention projections")?;
    refuse_true(f, "use_bidirectional_attention", "bidirectional attention")?;
    let types = match explicit_layer_types(f, c.n)? {
        Some(t) => t,
        None => {
            let pattern = f.positive("sliding_window_pattern", Some(6))?;
            (0..c.n)
                .map(|i| {
                    if (i + 1) % pattern == 0 {
                        AttentionType::Full
                    } else {
                        AttentionType::Sliding
                    }
                })
                .collect()
        }
    };
    let head_dim = f.positive("head_dim", Some(256))?;
    let window = f.positive("sliding_window", Some(4096))?;
    let (full_rope, sliding_rope) = ropes(
        f,
        (1e6, "default"),
        Some("rope_local_base_freq"),
        (1e4, "default"),
    )?;
    let widths = mlp_widths(f, c.n, Some(9216))?;
    let layers = types
        .iter()
        .zip(widths)
        .map(|(&ty, width)| {
            let full = ty == AttentionType::Full;
            LayerConfig {
                attention: ty,
                head_dim,
                num_kv_heads: c.kv_heads,
                window: (!full).then_some(window),
                rope: if full { full_rope } else { sliding_rope },
                intermediate_size: width,
                kv_source: None,
            }
        })
        .collect();
    let scalar = f.f64_or("query_pre_attn_scalar", 256.0)?;
    if scalar <= 0.0 {
        return Err(ConfigError::invalid(
            f.name("query_pre_attn_scalar"),
            "must be positive",
        ));
    }
    Ok(ModelConfig {
        architecture: Architecture::Gemma3,
        source_format: SourceFormat::HuggingFace,
        vocab_size: c.vocab,
        hidden_size: c.hidden,
        num_attention_heads: c.heads,
        layers,
        rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
        activation: activation(f, "hidden_activation", "gelu_pytorch_tanh")?,
        max_position_embeddings: f.positive("max_position_embeddings", Some(131072))?,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", true)?,
        attention_scale: scalar.powf(-0.5),
        final_logit_softcapping: f.f64_opt("final_logit_softcapping")?,
        attn_logit_softcapping: f.f64_opt("attn_logit_softcapping")?,
        norm_weight_offset: 1.0,
        scale_embeddings: true,
        qk_norm: true,
        v_norm: false,
        sandwich_norms: true,
        layer_scalar: false,
        per_layer_input: None,
        num_kv_shared_layers: 0,
        bos_token_id: None,
        eos_token_ids: vec![],
        pad_token_id: None,
        placeholder_ids: Vec::new(),
        dtype: None,
    })
}

fn llama_like(f: &Fields, arch: Architecture) -> Result<ModelConfig, ConfigError> {
    let c = common(f, None)?;
    refuse_true(f, "attention_bias", "biases in attention projections")?;
    refuse_true(f, "mlp_bias", "biases in MLP projections")?;
    let qwen = arch == Architecture::Qwen3;
    let head_dim = match f.usize_opt("head_dim")? {
        Some(d) if d > 0 => d,
        _ if c.hidden % c.heads == 0 => c.hidden / c.heads,
        _ => {
            return Err(ConfigError::invalid(
                f.name("hidden_size"),
                "not divisible by num_attention_heads",
            ))
        }
    };
    let use_swa = f.bool_or("use_sliding_window", false)?;
    let types = match explicit_layer_types(f, c.n)? {
        Some(t) => t,
        None if qwen && use_swa => {
            let from = f.usize_or("max_window_layers", c.n)?;
            (0..c.n)
                .map(|i| {
                    if i >= from {
                        AttentionType::Sliding
                    } else {
                        AttentionType::Full
                    }
                })
                .collect()
        }
        None => vec![AttentionType::Full; c.n],
    };
    let window = if types.contains(&AttentionType::Sliding) {
        Some(f.positive("sliding_window", None)?)
    } else {
        None
    };
    let (rope, _) = ropes(
        f,
        (if qwen { 1e6 } else { 1e4 }, "default"),
        None,
        (1e4, "default"),
    )?;
    let widths = mlp_widths(f, c.n, None)?;
    let layers = types
        .iter()
        .zip(widths)
        .map(|(&ty, width)| LayerConfig {
            attention: ty,
            head_dim,
            num_kv_heads: c.kv_heads,
            window: if ty == AttentionType::Sliding {
                window
            } else {
                None
            },
            rope,
            intermediate_size: width,
            kv_source: None,
        })
        .collect();
    Ok(ModelConfig {
        architecture: arch,
        source_format: SourceFormat::HuggingFace,
        vocab_size: c.vocab,
        hidden_size: c.hidden,
        num_attention_heads: c.heads,
        layers,
        rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
        activation: activation(f, "hidden_act", "silu")?,
        max_position_embeddings: f.positive(
            "max_position_embeddings",
            Some(if qwen { 32768 } else { 2048 }),
        )?,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention_scale: (head_dim as f64).powf(-0.5),
        final_logit_softcapping: None,
        attn_logit_softcapping: None,
        norm_weight_offset: 0.0,
        scale_embeddings: false,
        qk_norm: qwen,
        v_norm: false,
        sandwich_norms: false,
        layer_scalar: false,
        per_layer_input: None,
        num_kv_shared_layers: 0,
        bos_token_id: None,
        eos_token_ids: vec![],
        pad_token_id: None,
        placeholder_ids: Vec::new(),
        dtype: None,
    })
}
