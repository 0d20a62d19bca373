//! bitsandbytes 4-bit checkpoints saved by transformers (`scripts/reference/make_bnb_fixtures.py`):
//! the matrices dequantize bit for bit as bitsandbytes' own `dequantize_4bit` does, for NF4
//! with double quantization, FP4 without, and a bf16 state.

use std::path::{Path, PathBuf};

use strata_weights::{ModelWeights, SafetensorsModel, WeightSource};

fn dir(variant: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny/bnb")
        .join(variant)
}

#[test]
fn matrices_dequantize_as_bitsandbytes_does() {
    for variant in [
        "llama-tiny-nf4-dq",
        "llama-tiny-fp4",
        "gemma4-tiny-nf4-dq-bf16",
    ] {
        let w = ModelWeights::open(dir(variant), None, None).unwrap();
        let reference = SafetensorsModel::open(dir(variant).join("reference.safetensors")).unwrap();
        let mut checked = 0;
        for name in reference.names() {
            let Some(module) = name.strip_prefix("dequantized.") else {
                continue;
            };
            let want = reference.get(name).unwrap().to_f32_vec().unwrap();
            let hf = format!("model.{module}.weight");
            let q = w
                .bnb4(&hf)
                .unwrap_or_else(|| panic!("{variant}: {module} is missing"));
            assert!(w.get(&hf).is_none(), "{variant}: no dense view of {module}");
            // Decoded in two spans that split a block, as a product reads rows.
            let mut got = vec![0f32; q.rows() * q.cols()];
            let cut = got.len() / 2 + 5;
            q.decode(0, &mut got[..cut]);
            q.decode(cut, &mut got[cut..]);
            assert_eq!(
                q.shape,
                reference.get(name).unwrap().shape,
                "{variant} {module}"
            );
            // The whole matrix as the state's dtype, as a dense upload takes it.
            let dense = strata_weights::TensorView {
                name: "decoded",
                shape: q.shape.clone(),
                ty: q.ty,
                bytes: &q.to_decoded().bytes,
            };
            assert_eq!(dense.to_f32_vec().unwrap(), got, "{variant} {module}");
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{variant} {module}: {differ} values differ");
            checked += 1;
        }
        assert_eq!(checked, 3, "{variant}");
    }
}

#[test]
fn malformed_states_are_errors_naming_the_tensor() {
    let src = SafetensorsModel::open(dir("llama-tiny-fp4").join("model.safetensors")).unwrap();
    let state = "model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__fp4";
    // The state's JSON cut short, then a shape that does not match the codes.
    let original = src.raw_bytes(state).unwrap().to_vec();
    let text = String::from_utf8(original.clone()).unwrap();
    let wrong_shape = text.replace("[64, 64]", "[64, 65]").into_bytes();
    for bad in [original[..original.len() / 2].to_vec(), wrong_shape] {
        let mut tensors: Vec<(String, String, Vec<usize>, Vec<u8>)> = Vec::new();
        for n in src.names() {
            let bytes = if n == state {
                bad.clone()
            } else {
                src.raw_bytes(n).unwrap().to_vec()
            };
            let shape = if n == state {
                vec![bytes.len()]
            } else {
                src.shape(n).unwrap().to_vec()
            };
            tensors.push((
                n.to_string(),
                src.dtype(n).unwrap().to_string(),
                shape,
                bytes,
            ));
        }
        let entries: Vec<(&str, &str, &[usize], &[u8])> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.as_slice(), b.as_slice()))
            .collect();
        let file = strata_weights::write_safetensors(&entries);
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("model.safetensors"), file).unwrap();
        std::fs::copy(
            dir("llama-tiny-fp4").join("config.json"),
            tmp.path().join("config.json"),
        )
        .unwrap();
        let e = ModelWeights::open(tmp.path(), None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("q_proj") && e.contains("bitsandbytes"), "{e}");
    }
}

/// A matrix rebuilt from a read one's parts (`Bnb4::new`, as a device upload takes them)
/// decodes to the same values; parts that disagree in size are errors.
#[test]
fn matrices_rebuild_from_their_parts() {
    let w = ModelWeights::open(dir("llama-tiny-fp4"), None, None).unwrap();
    let q = w.bnb4("model.layers.0.mlp.down_proj.weight").unwrap();
    let parts = |codes: Vec<u8>, absmax: Vec<f32>| {
        strata_weights::bnb::Bnb4::new(
            [q.rows(), q.cols()],
            q.ty,
            q.blocksize(),
            codes,
            absmax,
            *q.quant_map(),
        )
    };
    let again = parts(q.codes().to_vec(), q.absmax().to_vec()).unwrap();
    let (mut a, mut b) = (
        vec![0f32; q.rows() * q.cols()],
        vec![0f32; q.rows() * q.cols()],
    );
    q.decode(0, &mut a);
    again.decode(0, &mut b);
    assert_eq!(a, b);
    assert!(parts(q.codes()[1..].to_vec(), q.absmax().to_vec()).is_err());
    assert!(parts(q.codes().to_vec(), q.absmax()[1..].to_vec()).is_err());
}
