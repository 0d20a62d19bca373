use super::*;
use crate::writer::GgufWriter;
use proptest::prelude::*;

fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.str("general.architecture", "llama")
        .u32("llama.block_count", 2)
        .f32("llama.rope.freq_base", 10000.0)
        .kv("flag", Value::Bool(true))
        .kv("i64", Value::I64(-5))
        .kv("f64", Value::F64(0.25))
        .kv("u16", Value::U16(7))
        .array(
            "tokenizer.ggml.tokens",
            vec![Value::String("a".into()), Value::String("bc".into())],
        )
        .tensor("t.f32", &[4, 2], GgmlType::F32, vec![1u8; 32])
        .tensor("t.q8", &[32], GgmlType::Q8_0, vec![2u8; 34]);
    w.to_bytes()
}

#[test]
fn round_trips_every_value_type_and_tensors() {
    let f = GgufFile::from_vec(sample()).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.get("llama.block_count").unwrap().as_u64(), Some(2));
    assert_eq!(f.get("flag").unwrap().as_bool(), Some(true));
    assert_eq!(f.get("i64").unwrap().as_i64(), Some(-5));
    assert_eq!(f.get("f64").unwrap().as_f64(), Some(0.25));
    let toks = f.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(toks[1].as_str(), Some("bc"));
    let t = f.tensor("t.q8").unwrap();
    assert_eq!(t.byte_len(), 34);
    assert_eq!(f.tensor_data(t), &[2u8; 34][..]);
    assert_eq!(f.tensor_data(f.tensor("t.f32").unwrap()), &[1u8; 32][..]);
    assert_eq!(f.data_offset % 32, 0);
}

#[test]
fn rejects_bad_magic_and_version() {
    let mut b = sample();
    b[0] = b'X';
    assert!(matches!(GgufFile::from_vec(b), Err(Error::BadMagic(_))));
    let mut b = sample();
    b[4] = 1;
    assert!(matches!(GgufFile::from_vec(b), Err(Error::Version(1))));
}

#[test]
fn every_truncation_is_an_error() {
    let b = sample();
    for len in 0..b.len() - 1 {
        assert!(GgufFile::from_vec(b[..len].to_vec()).is_err(), "len {len}");
    }
}

#[test]
fn absurd_counts_are_refused_without_allocating() {
    let mut b = sample();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(GgufFile::from_vec(b).is_err());
    let mut b = sample();
    b[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(GgufFile::from_vec(b).is_err());
}

#[test]
fn non_utf8_key_is_an_error() {
    let mut w = GgufWriter::new();
    w.u32("k\u{e9}y", 1);
    let mut b = w.to_bytes();
    let pos = b.windows(2).position(|p| p == [0xc3, 0xa9]).unwrap();
    b[pos] = 0xff;
    let err = GgufFile::from_vec(b).unwrap_err().to_string();
    assert!(err.contains("UTF-8"), "{err}");
}

#[test]
fn tensor_past_end_of_file_is_an_error() {
    let mut w = GgufWriter::new();
    w.tensor("x", &[1 << 20], GgmlType::F32, vec![0; 16]);
    let err = GgufFile::from_vec(w.to_bytes()).unwrap_err().to_string();
    assert!(err.contains("\"x\""), "{err}");
}

#[test]
fn overflowing_shape_is_an_error() {
    let mut w = GgufWriter::new();
    w.tensor("x", &[1 << 40, 1 << 40], GgmlType::F32, vec![]);
    assert!(GgufFile::from_vec(w.to_bytes()).is_err());
}

#[test]
fn duplicate_keys_are_refused() {
    let mut w = GgufWriter::new();
    w.u32("a", 1).u32("a", 2);
    assert!(GgufFile::from_vec(w.to_bytes()).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Random byte flips in a valid file never panic.
    #[test]
    fn corrupted_files_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut b = sample();
        for (i, v) in flips {
            let n = b.len();
            b[i % n] = v;
        }
        let _ = GgufFile::from_vec(b);
    }

    #[test]
    fn random_bytes_never_panic(mut b in proptest::collection::vec(any::<u8>(), 0..256)) {
        if b.len() >= 8 {
            b[..4].copy_from_slice(&MAGIC.to_le_bytes());
            b[4..8].copy_from_slice(&3u32.to_le_bytes());
        }
        let _ = GgufFile::from_vec(b);
    }
}

#[test]
fn overlapping_tensors_are_refused_naming_both() {
    let mut w = GgufWriter::new();
    w.tensor("t.a", &[8], GgmlType::F32, vec![1u8; 32]).tensor(
        "t.b",
        &[8],
        GgmlType::F32,
        vec![2u8; 32],
    );
    let good = w.to_bytes();
    assert!(GgufFile::from_vec(good.clone()).is_ok());
    // The directory entry of "t.b": name, 1 dim (u32), the dim (u64), the type (u32), then
    // its offset (u64), which points it at "t.a"'s second half.
    let name = good.windows(3).position(|w| w == b"t.b").unwrap();
    let at = name + 3 + 4 + 8 + 4;
    assert_eq!(good[at..at + 8], 32u64.to_le_bytes());
    let mut bad = good;
    bad[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    let err = GgufFile::from_vec(bad).unwrap_err().to_string();
    assert!(
        err.contains("overlap") && err.contains("t.a") && err.contains("t.b"),
        "{err}"
    );
}
