//! The last check of every parsed configuration: sizes that must be positive and values
//! that must be finite. A file that passes the parsers with a zero head size or a NaN norm
//! epsilon would otherwise load and generate garbage.

use crate::{ConfigError, ModelConfig};

/// Refuses `config` when a size is zero or a value is not finite (or not positive where
/// it must be), naming the field, and the layer where one is involved.
pub(crate) fn validate(config: ModelConfig) -> Result<ModelConfig, ConfigError> {
    let c = &config;
    let sizes = [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("num_attention_heads", c.num_attention_heads),
        ("num_hidden_layers", c.layers.len()),
        ("max_position_embeddings", c.max_position_embeddings),
    ];
    for (field, v) in sizes {
        if v == 0 {
            return Err(ConfigError::invalid(field, "must be positive"));
        }
    }
    positive("rms_norm_eps", c.rms_norm_eps)?;
    positive("attention_scale", c.attention_scale)?;
    if let Some(v) = c.final_logit_softcapping {
        positive("final_logit_softcapping", v)?;
    }
    if let Some(v) = c.attn_logit_softcapping {
        positive("attn_logit_softcapping", v)?;
    }
    if let Some(p) = &c.per_layer_input {
        if p.hidden_size == 0 || p.vocab_size == 0 {
            return Err(ConfigError::invalid(
                "hidden_size_per_layer_input",
                "per-layer input sizes must be positive",
            ));
        }
    }
    for (i, l) in c.layers.iter().enumerate() {
        let at = |field: &str| format!("{field} (layer {i})");
        if l.head_dim == 0 {
            return Err(ConfigError::invalid(at("head_dim"), "must be positive"));
        }
        if l.num_kv_heads == 0 {
            return Err(ConfigError::invalid(
                at("num_key_value_heads"),
                "must be positive",
            ));
        }
        if l.intermediate_size == 0 {
            return Err(ConfigError::invalid(
                at("intermediate_size"),
                "must be positive",
            ));
        }
        if l.window == Some(0) {
            return Err(ConfigError::invalid(
                at("sliding_window"),
                "must be positive",
            ));
        }
        positive(&at("rope_theta"), l.rope.theta)?;
        let f = l.rope.partial_rotary_factor;
        if !(f > 0.0 && f <= 1.0) {
            return Err(ConfigError::invalid(
                at("partial_rotary_factor"),
                format!("{f} is not in (0, 1]"),
            ));
        }
    }
    Ok(config)
}

fn positive(field: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            field,
            format!("{v} must be finite and positive"),
        ))
    }
}
