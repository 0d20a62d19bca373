//! Bad Gemma-4 GGUFs, made from the converter's own (tests/fixtures/gguf-gemma4): a key that is
//! missing or contradicts the tensors is refused at load naming the key, and no truncation or
//! corruption of the header makes the load path (configuration, tokenizer, weights) panic.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use strata_gguf::writer::GgufWriter;
use strata_gguf::{GgufFile, Value};
use strata_kernels::cpu::CpuBackend;
use strata_model::Model;
use strata_tokenizer::Tokenizer;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gguf-gemma4")
        .join(name)
}

/// The fixture `name` rewritten with `edit` applied to its metadata (`None` drops the key).
fn rewritten(name: &str, edit: &dyn Fn(&str, &Value) -> Option<Value>) -> Vec<u8> {
    let file = GgufFile::open(fixture(name)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        if let Some(v) = edit(k, v) {
            w.kv(k, v);
        }
    }
    for t in file.tensors() {
        w.tensor(&t.name, &t.dims, t.ggml_type, file.tensor_data(t).to_vec());
    }
    w.to_bytes()
}

/// Loads `bytes` as a model (through a file, as a server does): the error's text.
fn load_error(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, bytes).unwrap();
    match Model::load(CpuBackend::new(), &path) {
        Ok(_) => panic!("the bad file loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn an_unedited_copy_loads() {
    let bytes = rewritten("gemma4-tiny-Q4_K_M.gguf", &|_, v| Some(v.clone()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, bytes).unwrap();
    Model::load(CpuBackend::new(), &path).unwrap();
}

/// A key's new value from its old one (`None`: the key is dropped).
type Edit = Box<dyn Fn(&Value) -> Option<Value>>;

#[test]
fn missing_or_contradictory_keys_are_refused_naming_the_key() {
    let cases: Vec<(&str, Edit)> = vec![
        (
            "gemma4.attention.sliding_window_pattern",
            Box::new(|_| None),
        ),
        ("gemma4.block_count", Box::new(|_| None)),
        (
            "gemma4.embedding_length",
            Box::new(|_| Some(Value::U32(128))),
        ),
        (
            "gemma4.embedding_length_per_layer_input",
            Box::new(|_| Some(Value::U32(16))),
        ),
        (
            "gemma4.attention.key_length",
            Box::new(|_| Some(Value::U32(64))),
        ),
        (
            "gemma4.attention.shared_kv_layers",
            Box::new(|_| Some(Value::U32(6))),
        ),
        (
            "gemma4.attention.sliding_window_pattern",
            Box::new(|v| match v {
                Value::Array(a) => {
                    let mut a = a.clone();
                    a.items.pop();
                    Some(Value::Array(a))
                }
                _ => unreachable!(),
            }),
        ),
        (
            "gemma4.feed_forward_length",
            Box::new(|v| match v {
                Value::Array(a) => {
                    let mut a = a.clone();
                    a.items[0] = Value::I32(80);
                    Some(Value::Array(a))
                }
                _ => unreachable!(),
            }),
        ),
    ];
    for (key, edit) in &cases {
        let bytes = rewritten("gemma4-tiny-BF16.gguf", &|k, v| {
            if k == *key {
                edit(v)
            } else {
                Some(v.clone())
            }
        });
        let err = load_error(&bytes);
        assert!(err.contains(key), "{key}: {err}");
    }
}

/// Where the header ends: the tensor data that follows is only numbers to the loader.
fn header_len(bytes: &[u8]) -> usize {
    let file = GgufFile::from_vec(bytes.to_vec()).unwrap();
    let data: usize = file.tensors().iter().map(|t| t.byte_len() as usize).sum();
    bytes.len() - data
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Bytes of the header overwritten, or the file cut anywhere: the configuration, the
    /// tokenizer and the weights load or fail with an error, never a panic.
    #[test]
    fn corrupt_gemma4_ggufs_never_panic(
        cut in any::<prop::sample::Index>(),
        writes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        truncate in any::<bool>(),
    ) {
        let mut bytes = std::fs::read(fixture("gemma4-tiny-Q4_K_M.gguf")).unwrap();
        let head = header_len(&bytes);
        for (at, b) in &writes {
            bytes[at.index(head)] = *b;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(file) = GgufFile::from_vec(bytes.clone()) {
            let _ = strata_config::ModelConfig::from_gguf(&file);
            let _ = Tokenizer::from_gguf(&file);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, &bytes).unwrap();
        let _ = Model::load(CpuBackend::new(), &path);
    }
}
