//! GGUF metadata written in the test, read back as a ModelConfig.

use strata_config::{AttentionType, ModelConfig, RopeKind, RopeStyle, SourceFormat};
use strata_gguf::{writer::GgufWriter, GgmlType, GgufFile, Value};

fn u32s(v: &[u32]) -> Vec<Value> {
    v.iter().map(|&x| Value::U32(x)).collect()
}

fn parse(w: &GgufWriter) -> Result<ModelConfig, String> {
    let f = GgufFile::from_vec(w.to_bytes()).map_err(|e| e.to_string())?;
    ModelConfig::from_gguf(&f).map_err(|e| e.to_string())
}

fn gemma4_e2b() -> GgufWriter {
    let mut w = GgufWriter::new();
    let pattern: Vec<Value> = (0..35).map(|i| Value::Bool(i % 5 != 4)).collect();
    let ffn: Vec<u32> = (0..35).map(|i| if i < 15 { 6144 } else { 12288 }).collect();
    let mut freqs = vec![1.0f32; 64];
    freqs.extend(std::iter::repeat_n(1e30f32, 192));
    w.str("general.architecture", "gemma4")
        .u32("gemma4.block_count", 35)
        .u32("gemma4.context_length", 131072)
        .u32("gemma4.embedding_length", 1536)
        .array("gemma4.feed_forward_length", u32s(&ffn))
        .u32("gemma4.attention.head_count", 8)
        .u32("gemma4.attention.head_count_kv", 1)
        .u32("gemma4.attention.key_length", 512)
        .u32("gemma4.attention.value_length", 512)
        .u32("gemma4.attention.key_length_swa", 256)
        .u32("gemma4.attention.value_length_swa", 256)
        .u32("gemma4.attention.sliding_window", 512)
        .array("gemma4.attention.sliding_window_pattern", pattern)
        .u32("gemma4.attention.shared_kv_layers", 20)
        .f32("gemma4.attention.layer_norm_rms_epsilon", 1e-6)
        .u32("gemma4.embedding_length_per_layer_input", 256)
        .f32("gemma4.rope.freq_base", 1e6)
        .f32("gemma4.rope.freq_base_swa", 1e4)
        .f32("gemma4.final_logit_softcapping", 30.0)
        .u32("tokenizer.ggml.bos_token_id", 2)
        .u32("tokenizer.ggml.eos_token_id", 1)
        .u32("gemma4.vocab_size", 262144)
        .tensor(
            "rope_freqs.weight",
            &[256],
            GgmlType::F32,
            freqs.iter().flat_map(|f| f.to_le_bytes()).collect(),
        );
    w
}

#[test]
fn gemma4_e2b_from_gguf() {
    let c = parse(&gemma4_e2b()).unwrap();
    assert_eq!(c.source_format, SourceFormat::Gguf);
    assert_eq!(c.num_layers(), 35);
    let g = c.kv_group_specs();
    assert_eq!(g[0].layer_ids, vec![4, 9, 14]);
    assert_eq!(g[1].layer_ids.len(), 12);
    assert_eq!(c.kv_shared_layers()[0], (15, 13));
    assert_eq!(c.kv_shared_layers()[4], (19, 14));
    assert_eq!(c.layers[4].head_dim, 512);
    assert_eq!(c.layers[3].head_dim, 256);
    assert_eq!(c.layers[20].intermediate_size, 12288);
    assert_eq!(c.layers[4].rope.kind, RopeKind::Proportional);
    assert_eq!(c.layers[4].rope.partial_rotary_factor, 0.25);
    assert_eq!(c.layers[0].rope.theta, 1e4);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.per_layer_input.unwrap().hidden_size, 256);
}

#[test]
fn gemma3_270m_from_gguf_assumes_pattern_six() {
    let mut w = GgufWriter::new();
    w.str("general.architecture", "gemma3")
        .u32("gemma3.block_count", 18)
        .u32("gemma3.context_length", 32768)
        .u32("gemma3.embedding_length", 640)
        .u32("gemma3.feed_forward_length", 2048)
        .u32("gemma3.attention.head_count", 4)
        .u32("gemma3.attention.head_count_kv", 1)
        .u32("gemma3.attention.key_length", 256)
        .u32("gemma3.attention.value_length", 256)
        .u32("gemma3.attention.sliding_window", 512)
        .f32("gemma3.rope.freq_base", 1e6)
        .f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
        .array("tokenizer.ggml.tokens", vec![Value::String("a".into()); 7]);
    let c = parse(&w).unwrap();
    let full: Vec<usize> = (0..18)
        .filter(|&i| c.layers[i].attention == AttentionType::Full)
        .collect();
    assert_eq!(full, vec![5, 11, 17]);
    assert_eq!(c.vocab_size, 7);
    assert_eq!(c.attention_scale, 1.0 / 16.0);
    assert_eq!(c.norm_weight_offset, 0.0);
    assert_eq!(c.layers[0].rope.theta, 1e4);
    assert_eq!(c.layers[5].rope.theta, 1e6);
}

fn llama_like(arch: &str) -> GgufWriter {
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    w.str("general.architecture", arch)
        .u32(&k("block_count"), 30)
        .u32(&k("embedding_length"), 576)
        .u32(&k("feed_forward_length"), 1536)
        .u32(&k("attention.head_count"), 9)
        .u32(&k("attention.head_count_kv"), 3)
        .f32(&k("rope.freq_base"), 1e5)
        .u32(&k("rope.dimension_count"), 64)
        .u32(&k("vocab_size"), 49152)
        .tensor("output.weight", &[32], GgmlType::F32, vec![0; 128]);
    w
}

#[test]
fn llama_and_qwen3_from_gguf() {
    let c = parse(&llama_like("llama")).unwrap();
    assert_eq!(c.layers[0].head_dim, 64);
    assert_eq!(c.layers[0].rope.style, RopeStyle::Interleaved);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.kv_group_specs().len(), 1);
    let q = parse(&llama_like("qwen3")).unwrap();
    assert_eq!(q.layers[0].rope.style, RopeStyle::Neox);
    assert!(q.qk_norm);
}

#[test]
fn gguf_refusals_name_the_key() {
    let mut w = GgufWriter::new();
    w.str("general.architecture", "mamba");
    assert!(parse(&w).unwrap_err().contains("general.architecture"));
    let mut w = llama_like("llama");
    w.u32("llama.expert_count", 8);
    assert!(parse(&w).unwrap_err().contains("llama.expert_count"));
    let mut w = llama_like("llama");
    w.str("llama.rope.scaling.type", "yarn");
    assert!(parse(&w).unwrap_err().contains("llama.rope.scaling.type"));
    let mut w = gemma4_e2b();
    w.kv("gemma4.attention.shared_kv_layers", Value::U32(99));
    // Duplicate key: the container refuses the file.
    assert!(parse(&w).is_err());
    let mut w = GgufWriter::new();
    w.str("general.architecture", "llama");
    assert!(parse(&w).unwrap_err().contains("llama.block_count"));
}

/// Values that parse but cannot describe a model (NaN, zero, negative) are refused at load,
/// naming the field, instead of loading and generating garbage.
#[test]
fn nonsense_values_are_refused_naming_the_field() {
    let cases: [(&str, Value, &str); 5] = [
        (
            "attention.layer_norm_rms_epsilon",
            Value::F32(f32::NAN),
            "rms_norm_eps",
        ),
        (
            "attention.layer_norm_rms_epsilon",
            Value::F32(0.0),
            "rms_norm_eps",
        ),
        ("rope.freq_base", Value::F32(f32::NAN), "rope_theta"),
        ("rope.freq_base", Value::F32(-1.0), "rope_theta"),
        ("context_length", Value::U32(0), "max_position_embeddings"),
    ];
    for (key, value, field) in cases {
        let mut w = GgufWriter::new();
        let k = |s: &str| format!("llama.{s}");
        w.str("general.architecture", "llama")
            .u32(&k("block_count"), 2)
            .u32(&k("embedding_length"), 64)
            .u32(&k("feed_forward_length"), 128)
            .u32(&k("attention.head_count"), 4)
            .u32(&k("attention.head_count_kv"), 2)
            .u32(&k("vocab_size"), 100)
            .kv(&k(key), value.clone());
        if key != "rope.freq_base" {
            w.f32(&k("rope.freq_base"), 1e4);
        }
        let err = parse(&w).unwrap_err();
        assert!(err.contains(field), "{key} = {value:?}: {err}");
    }
}
