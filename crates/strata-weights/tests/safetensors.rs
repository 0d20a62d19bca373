//! Safetensors single files, sharded checkpoints, and HF-name lookups through ModelWeights.

use std::path::Path;

use half::{bf16, f16};
use strata_weights::{
    inspect, write_safetensors, GgmlType, ModelWeights, NameMap, SafetensorsModel, WeightSource,
    Weights, WeightsError,
};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect()
}
fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect()
}

fn write(path: &Path, tensors: &[(&str, &str, &[usize], &[u8])]) {
    std::fs::write(path, write_safetensors(tensors)).unwrap();
}

#[test]
fn single_file_all_dtypes_zero_copy() {
    let dir = tempfile::tempdir().unwrap();
    let w = [1.0f32, -2.0, 0.5, 3.0, 4.0, -0.25];
    let (a, b, c) = (f32_bytes(&w), bf16_bytes(&w), f16_bytes(&w));
    let path = dir.path().join("model.safetensors");
    write(
        &path,
        &[
            ("a.f32", "F32", &[2, 3], &a),
            ("b.bf16", "BF16", &[3, 2], &b),
            ("c.f16", "F16", &[6], &c),
        ],
    );

    let m = SafetensorsModel::open(&path).unwrap();
    assert_eq!(m.names(), ["a.f32", "b.bf16", "c.f16"]);
    let a = m.get("a.f32").unwrap();
    assert_eq!((a.ty, a.shape.clone()), (GgmlType::F32, vec![2, 3]));
    // Zero-copy: the f32 slice points into the map, not into a copy.
    let direct = a
        .as_f32()
        .expect("8-byte padded header keeps f32 data aligned");
    assert_eq!(direct, w);
    assert_eq!(direct.as_ptr() as *const u8, a.bytes.as_ptr());
    assert_eq!(
        m.get("b.bf16").unwrap().as_bf16().unwrap()[1],
        bf16::from_f32(-2.0)
    );
    assert_eq!(m.get("b.bf16").unwrap().to_f32_vec().unwrap(), w);
    assert_eq!(m.get("c.f16").unwrap().to_f32_vec().unwrap(), w);
    assert_eq!(
        m.get("a.f32")
            .unwrap()
            .dot_row(1, &[1.0, 1.0, 1.0])
            .unwrap(),
        6.75
    );

    // require: missing and mis-shaped tensors name the tensor and both shapes.
    let err = m.require("a.f32", &[3, 2]).unwrap_err().to_string();
    assert!(
        err.contains("a.f32") && err.contains("[2, 3]") && err.contains("[3, 2]"),
        "{err}"
    );
    let err = m.require("nope", &[4]).unwrap_err();
    assert!(matches!(err, WeightsError::Missing { .. }));
    assert!(err.to_string().contains("nope") && err.to_string().contains("[4]"));

    // Directory opening and the inspect summary.
    let s = inspect(dir.path()).unwrap();
    assert_eq!(
        (s.format, s.tensor_count, s.parameters),
        ("safetensors", 3, 18)
    );
    assert_eq!(s.types.get("BF16"), Some(&1));
    assert_eq!(s.types.get("F32"), Some(&1));
}

#[test]
fn sharded_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let one = f32_bytes(&[1.0, 2.0]);
    let two = bf16_bytes(&[3.0, 4.0, 5.0, 6.0]);
    write(
        &dir.path().join("model-00001-of-00002.safetensors"),
        &[("model.embed_tokens.weight", "F32", &[1, 2], &one)],
    );
    write(
        &dir.path().join("model-00002-of-00002.safetensors"),
        &[
            ("model.norm.weight", "BF16", &[4], &two),
            ("u8", "U8", &[2], &[1, 2]),
        ],
    );
    let index = r#"{"metadata": {"total_size": 14}, "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00002-of-00002.safetensors"}}"#;
    std::fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();

    let w = Weights::open(dir.path()).unwrap();
    assert_eq!(w.format(), "safetensors");
    assert_eq!(
        w.get("model.norm.weight").unwrap().to_f32_vec().unwrap(),
        [3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(w.get("model.embed_tokens.weight").unwrap().shape, [1, 2]);
    // U8 is listed and counted but not served as a tensor view.
    assert!(w.get("u8").is_none());
    let s = inspect(dir.path()).unwrap();
    assert_eq!((s.tensor_count, s.parameters), (3, 8));
    assert_eq!(s.types.get("U8"), Some(&1));

    // An index that points at the wrong shard, or outside the directory, is refused.
    let wrong = index.replace(
        "model-00001-of-00002.safetensors\",\n        \"model.norm",
        "model-00002-of-00002.safetensors\",\n        \"model.norm",
    );
    assert_ne!(wrong, index);
    std::fs::write(dir.path().join("model.safetensors.index.json"), &wrong).unwrap();
    let err = SafetensorsModel::open_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.embed_tokens.weight"), "{err}");
    let escape = r#"{"weight_map": {"x": "../etc/passwd"}}"#;
    std::fs::write(dir.path().join("model.safetensors.index.json"), escape).unwrap();
    assert!(SafetensorsModel::open_dir(dir.path())
        .unwrap_err()
        .to_string()
        .contains("plain file name"));
    let missing = r#"{"weight_map": {"gone": "model-00001-of-00002.safetensors"}}"#;
    std::fs::write(dir.path().join("model.safetensors.index.json"), missing).unwrap();
    assert!(SafetensorsModel::open_dir(dir.path())
        .unwrap_err()
        .to_string()
        .contains("gone"));
}

#[test]
fn duplicate_tensor_across_shards_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let one = f32_bytes(&[1.0]);
    write(
        &dir.path().join("a.safetensors"),
        &[("t", "F32", &[1], &one)],
    );
    write(
        &dir.path().join("b.safetensors"),
        &[("t", "F32", &[1], &one)],
    );
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"t": "a.safetensors", "u": "b.safetensors"}}"#,
    )
    .unwrap();
    let err = SafetensorsModel::open_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"t\"") && err.contains("also in"), "{err}");
}

/// A tiny Gemma-4 multimodal-style checkpoint: `model.language_model.` prefix, a vision
/// tower, no lm_head (tied), and stale k_proj on the KV-shared layer 1.
#[test]
fn model_weights_by_hf_name() {
    let dir = tempfile::tempdir().unwrap();
    let h = 4;
    let emb = bf16_bytes(&[0.5; 8 * 4]);
    let q = bf16_bytes(&[1.0; 8 * 4]);
    let k = bf16_bytes(&[2.0; 4 * 4]);
    let norm = bf16_bytes(&[1.0; 4]);
    let p = "model.language_model.";
    let names: Vec<String> = [
        "embed_tokens.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.1.self_attn.q_proj.weight",
        "layers.1.self_attn.k_proj.weight",
        "norm.weight",
    ]
    .iter()
    .map(|n| format!("{p}{n}"))
    .collect();
    write(
        &dir.path().join("model.safetensors"),
        &[
            (&names[0], "BF16", &[8, h], &emb),
            (&names[1], "BF16", &[8, h], &q),
            (&names[2], "BF16", &[4, h], &k),
            (&names[3], "BF16", &[8, h], &q),
            (&names[4], "BF16", &[4, h], &k),
            (&names[5], "BF16", &[h], &norm),
            ("model.vision_tower.patch.weight", "BF16", &[4], &norm),
        ],
    );
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "gemma4", "text_config": {"model_type": "gemma4_text"}}"#,
    )
    .unwrap();

    let m = ModelWeights::open(dir.path(), None, Some(1)).unwrap();
    assert_eq!(m.names().arch().name(), "gemma4");
    assert!(m
        .require("layers.0.self_attn.k_proj.weight", &[4, h])
        .is_ok());
    assert!(
        m.get("model.layers.0.self_attn.q_proj.weight").is_some(),
        "any prefix resolves"
    );
    // Layer 1 shares KV: its stored k_proj is ignored, and requiring it fails.
    assert!(m.get("layers.1.self_attn.k_proj.weight").is_none());
    assert!(m
        .require("layers.1.self_attn.k_proj.weight", &[4, h])
        .is_err());
    assert!(m.get("model.vision_tower.patch.weight").is_none());
    // Tied embeddings.
    assert!(m.is_tied());
    let head = m.lm_head(&[8, h]).unwrap();
    assert_eq!(head.name, "model.language_model.embed_tokens.weight");
    let err = m.lm_head(&[9, h]).unwrap_err().to_string();
    assert!(err.contains("[9, 4]") && err.contains("[8, 4]"), "{err}");
    let err = m
        .require("layers.0.mlp.up_proj.weight", &[16, h])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layers.0.mlp.up_proj.weight") && err.contains("[16, 4]"),
        "{err}"
    );

    // An explicit arch overrides config.json, and unknown ones are refused.
    assert!(ModelWeights::open(dir.path(), Some("mamba"), None).is_err());
    let direct = ModelWeights::new(
        Weights::open(dir.path()).unwrap(),
        NameMap::new("gemma4", None).unwrap(),
    );
    assert!(
        direct.get("layers.1.self_attn.k_proj.weight").is_some(),
        "not stale without sharing"
    );
}

#[test]
fn overlapping_tensors_are_refused_naming_both() {
    let data = f32_bytes(&[1.0; 4]);
    let good = write_safetensors(&[("a", "F32", &[4], &data), ("b", "F32", &[4], &data)]);
    assert!(SafetensorsModel::from_vec("good", good.clone()).is_ok());
    // Point "b" at bytes 8..24, which "a" (0..16) holds in part; the header keeps its length.
    let text = String::from_utf8_lossy(&good).into_owned();
    let bad = text.replacen("[16,32]", "[8, 24]", 1);
    assert_ne!(bad, text, "the header spells b's offsets as [16,32]");
    let err = SafetensorsModel::from_vec("bad", bad.into_bytes())
        .expect_err("overlapping tensors are refused")
        .to_string();
    assert!(
        err.contains("overlap") && err.contains("\"a\"") && err.contains("\"b\""),
        "{err}"
    );
}
