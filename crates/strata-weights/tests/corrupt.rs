//! Corrupt input never panics: hand-made cases with the error they must give, the committed
//! fuzz corpus replayed, and random mutations of valid files.

use std::path::PathBuf;

use proptest::prelude::*;
use strata_gguf::writer::GgufWriter;
use strata_weights::{fuzzing, write_safetensors, GgmlType, GgufModel, SafetensorsModel};

fn st_err(bytes: Vec<u8>) -> String {
    SafetensorsModel::from_vec("x.safetensors", bytes)
        .unwrap_err()
        .to_string()
}

fn with_header(json: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.extend_from_slice(data);
    v
}

#[test]
fn safetensors_corruptions_are_errors() {
    assert!(st_err(vec![1, 2, 3]).contains("too short"));
    assert!(st_err(u64::MAX.to_le_bytes().to_vec()).contains("header length"));
    // Header length one past the end of the file.
    let mut past = 3u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    assert!(st_err(past).contains("header length"));
    let mut big = (200_000_000u64).to_le_bytes().to_vec();
    big.extend_from_slice(b"{}");
    assert!(st_err(big).contains("header length"));
    assert!(st_err(with_header("{\"a\":[", &[])).contains("JSON"));
    assert!(st_err(with_header("[1, 2]", &[])).contains("JSON"));
    let mut non_utf8 = 8u64.to_le_bytes().to_vec();
    non_utf8.extend_from_slice(b"{\"\xff\xfe\":1}");
    assert!(st_err(non_utf8).contains("JSON"));
    let e = st_err(with_header(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,9]}}"#,
        &[0; 8],
    ));
    assert!(e.contains("\"a\"") && e.contains("outside"), "{e}");
    let e = st_err(with_header(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[6,2]}}"#,
        &[0; 8],
    ));
    assert!(e.contains("outside"), "{e}");
    let e = st_err(with_header(
        r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
        &[0; 8],
    ));
    assert!(e.contains("needs 12 bytes"), "{e}");
    let e = st_err(with_header(
        r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}"#,
        &[],
    ));
    assert!(e.contains("overflows"), "{e}");
    let e = st_err(with_header(
        r#"{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
    ));
    assert!(e.contains("unknown dtype"), "{e}");
    let e = st_err(with_header(
        r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    ));
    assert!(e.contains("\"a\""), "{e}");
    let e = st_err(with_header(r#"{"__metadata__":{"k":3}}"#, &[]));
    assert!(e.contains("__metadata__"), "{e}");
    // The valid baseline parses.
    let ok = write_safetensors(&[("a", "F32", &[2], &[0; 8])]);
    assert!(SafetensorsModel::from_vec("ok", ok).is_ok());
}

fn small_gguf() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.str("general.architecture", "llama")
        .u32("llama.block_count", 1);
    w.tensor("a", &[32, 2], GgmlType::Q8_0, vec![0; 68]);
    w.tensor("b", &[4], GgmlType::F32, vec![0; 16]);
    w.to_bytes()
}

#[test]
fn gguf_corruptions_are_errors() {
    let valid = small_gguf();
    assert!(GgufModel::from_vec(valid.clone()).is_ok());
    // Every truncation fails cleanly.
    for n in 0..valid.len() {
        assert!(
            GgufModel::from_vec(valid[..n].to_vec()).is_err(),
            "prefix {n} accepted"
        );
    }
    let mut bad = valid.clone();
    bad[0] = b'X';
    assert!(GgufModel::from_vec(bad)
        .unwrap_err()
        .to_string()
        .contains("magic"));
    let mut bad = valid.clone();
    bad[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(GgufModel::from_vec(bad).is_err());
    // Offset of the last tensor (last 8 bytes of its info) far past the end.
    let file = GgufModel::from_vec(valid.clone()).unwrap();
    let header_len = file.file().data_offset as usize;
    let pos = find(&valid[..header_len], b"b").unwrap(); // name "b" of the second tensor
    let offset_at = pos + 1 + 4 + 8 + 4; // name, n_dims, one dim, type
    let mut bad = valid.clone();
    bad[offset_at..offset_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(GgufModel::from_vec(bad).is_err());
    // Dims whose product overflows.
    let mut bad = valid.clone();
    bad[pos + 5..pos + 13].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(GgufModel::from_vec(bad).is_err());
    // A non-UTF-8 metadata key.
    let mut bad = valid.clone();
    let key = find(&bad, b"general.architecture").unwrap();
    bad[key] = 0xff;
    assert!(GgufModel::from_vec(bad)
        .unwrap_err()
        .to_string()
        .contains("UTF-8"));
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

/// Replays every committed seed of both fuzz targets (and any crash artifacts kept there).
#[test]
fn fuzz_corpus_replays_without_panic() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut n = 0;
    for (dir, target) in [
        ("gguf_header", fuzzing::gguf as fn(&[u8])),
        ("safetensors_header", fuzzing::safetensors),
    ] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            target(&data);
            n += 1;
        }
    }
    assert!(n >= 10, "only {n} seeds");
    // The valid seeds really are valid (so the corpus exercises decoding, not just errors).
    let valid = std::fs::read(root.join("gguf_header/valid_k_quants")).unwrap();
    assert_eq!(
        GgufModel::from_vec(valid).unwrap().file().tensors().len(),
        5
    );
    let valid = std::fs::read(root.join("safetensors_header/valid")).unwrap();
    assert!(SafetensorsModel::from_vec("valid", valid).is_ok());
    // Gemma-4 GGUFs of llama.cpp's converter (links to tests/fixtures/gguf-gemma4).
    for (seed, arch) in [
        ("gemma4_tiny_q4_k_m", "gemma4"),
        ("gemma4_assistant_bf16", "gemma4-assistant"),
    ] {
        let data = std::fs::read(root.join("gguf_header").join(seed)).unwrap();
        let model = GgufModel::from_vec(data).unwrap();
        assert_eq!(model.file().architecture(), Some(arch), "{seed}");
    }
}

/// A mutation of a valid file: overwrite bytes, truncate, or splice in junk.
#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    SetU64(usize, u64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (
            any::<usize>(),
            prop_oneof![
                Just(0u64),
                Just(u64::MAX),
                Just(1 << 32),
                Just(1 << 63),
                any::<u64>()
            ]
        )
            .prop_map(|(i, v)| Mutation::SetU64(i, v)),
    ]
}

fn apply(mut data: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if data.is_empty() {
            break;
        }
        let len = data.len();
        match m {
            Mutation::Set(i, b) => data[i % len] = *b,
            Mutation::Truncate(i) => data.truncate(i % len),
            Mutation::Insert(i, v) => {
                let at = i % len;
                data.splice(at..at, v.iter().copied());
            }
            Mutation::SetU64(i, v) => {
                let at = i % len;
                let end = (at + 8).min(len);
                data[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
        }
    }
    data
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn mutated_gguf_never_panics(muts in proptest::collection::vec(mutation(), 1..6)) {
        let seed = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/gguf_header/valid_k_quants")).unwrap();
        fuzzing::gguf(&apply(seed, &muts));
    }

    #[test]
    fn mutated_safetensors_never_panics(muts in proptest::collection::vec(mutation(), 1..6)) {
        let seed = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/safetensors_header/valid")).unwrap();
        fuzzing::safetensors(&apply(seed, &muts));
    }
}

/// Found by the fuzzer: a tensor with a zero-length axis has no elements but may claim
/// enormous other axes; views of it must not overflow or allocate.
#[test]
fn zero_element_tensor_with_huge_axes() {
    let mut w = GgufWriter::new();
    w.tensor("z", &[0, 1 << 40, 1 << 40], GgmlType::F32, vec![]);
    let model = GgufModel::from_vec(w.to_bytes()).unwrap();
    let v = strata_weights::WeightSource::get(&model, "z").unwrap();
    assert_eq!(v.elements(), 0);
    assert_eq!(v.rows(), usize::MAX);
    assert_eq!(v.row_len(), 0);
    assert_eq!(v.row(5), Some(&[][..]));
    assert!(v.to_f32_vec().unwrap().is_empty());
    fuzzing::gguf(&w.to_bytes());
}
