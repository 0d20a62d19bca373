//! A GGUF's metadata checked against its own tensor directory, so that a key that
//! contradicts the tensors is refused at load naming the key, rather than surfacing later as
//! a shape error about some tensor.

use strata_gguf::GgufFile;

use crate::{ConfigError, ModelConfig};

/// The checks, in ggml's dimension order (`[in, out]` for a matrix). A tensor that is absent
/// is not checked here: the weight loader names what it misses.
pub(crate) fn check(file: &GgufFile, arch: &str, c: &ModelConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("{arch}.{k}");
    let dims = |name: &str| file.tensor(name).map(|t| t.dims.clone());
    let want = |name: &str, axis: usize, value: usize, k: String| -> Result<(), ConfigError> {
        match dims(name) {
            Some(d) if d.get(axis).copied() != Some(value as u64) => Err(ConfigError::invalid(
                k,
                format!("says {value}, but {name} has dimensions {d:?}"),
            )),
            _ => Ok(()),
        }
    };
    want(
        "token_embd.weight",
        0,
        c.hidden_size,
        key("embedding_length"),
    )?;
    want(
        "token_embd.weight",
        1,
        c.vocab_size,
        "tokenizer.ggml.tokens (its count)".into(),
    )?;
    if let Some(ple) = &c.per_layer_input {
        want(
            "per_layer_token_embd.weight",
            0,
            ple.hidden_size * c.layers.len(),
            key("embedding_length_per_layer_input"),
        )?;
    }
    let swa = |full: bool, k: &str| {
        if full {
            key(k)
        } else {
            key(&format!("{k}_swa"))
        }
    };
    for (l, layer) in c.layers.iter().enumerate() {
        let full = layer.window.is_none();
        let t = |s: &str| format!("blk.{l}.{s}.weight");
        want(
            &t("attn_q"),
            1,
            c.num_attention_heads * layer.head_dim,
            format!(
                "{} / {}",
                key("attention.head_count"),
                swa(full, "attention.key_length")
            ),
        )?;
        if layer.kv_source.is_none() {
            want(
                &t("attn_k"),
                1,
                layer.num_kv_heads * layer.head_dim,
                key("attention.head_count_kv"),
            )?;
        }
        want(
            &t("ffn_gate"),
            1,
            layer.intermediate_size,
            key("feed_forward_length"),
        )?;
    }
    Ok(())
}
