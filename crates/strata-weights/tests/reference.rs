//! Bit-exact agreement with gguf-py's dequantization, using the committed vectors in
//! `fixtures/reference.gguf` (written by `fixtures/make_reference.py` through gguf-py's own
//! GGUF writer, so this also checks the reader against gguf-py's writer).

use std::collections::BTreeSet;
use std::path::PathBuf;

use strata_weights::quant::{self, f32_to_bf16, BlockQ8_0};
use strata_weights::{GgmlType, GgufModel, TensorView, Value, WeightSource};

fn fixture() -> GgufModel {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/reference.gguf");
    GgufModel::open(&path).expect("fixtures/reference.gguf parses")
}

fn assert_bit_exact(case: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{case}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{case}: element {i}: ours {} vs gguf-py {}",
            got[i], want[i]
        );
    }
}

#[test]
fn dequantization_is_bit_exact_with_gguf_py() {
    let model = fixture();
    let mut covered = BTreeSet::new();
    let mut cases = 0;
    for name in model.names() {
        let Some(case) = name.strip_suffix(".q") else {
            continue;
        };
        let q = model.get(name).unwrap();
        let want = model
            .get(&format!("{case}.f32"))
            .expect("every case has its .f32");
        assert_eq!(want.ty, GgmlType::F32);
        assert_eq!(q.shape, want.shape, "{case}: shapes");
        let got = q.to_f32_vec().unwrap();
        assert_bit_exact(case, &got, &want.to_f32_vec().unwrap());
        covered.insert(q.ty);
        cases += 1;
    }
    let expected: BTreeSet<GgmlType> = quant::SUPPORTED_TYPES
        .into_iter()
        .filter(|t| *t != GgmlType::F16)
        .collect();
    assert_eq!(covered, expected, "fixture covers every supported format");
    assert!(cases >= 20, "only {cases} cases");
}

#[test]
fn real_model_slices_are_present() {
    let model = fixture();
    for ty in ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_1"] {
        let view = model.get(&format!("real.{ty}.q"));
        assert!(
            view.is_some(),
            "real.{ty}.q missing: regenerate with the models present"
        );
        assert_eq!(view.unwrap().ty.name(), ty);
    }
}

#[test]
fn shapes_are_reported_outermost_first() {
    let model = fixture();
    // gguf-py wrote numpy arrays of shape (2, 1024): ggml dims {1024, 2}.
    let v: TensorView = model.get("rand.Q4_K.q").unwrap();
    assert_eq!(v.shape, vec![2, 1024]);
    assert_eq!(
        model.file().tensor("rand.Q4_K.q").unwrap().dims,
        vec![1024, 2]
    );
    assert_eq!(v.rows(), 2);
    assert_eq!(v.row_bytes(), 4 * 144);
    // Row-wise dot equals the full dequantization's row.
    let w = v.to_f32_vec().unwrap();
    let x: Vec<f32> = (0..1024).map(|i| (i as f32 * 0.37).sin()).collect();
    let want: f64 = w[1024..]
        .iter()
        .zip(&x)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    let got = f64::from(v.dot_row(1, &x).unwrap());
    assert!(
        (got - want).abs() < 1e-3 * want.abs().max(1.0),
        "{got} vs {want}"
    );
    assert!(v.dot_row(2, &x).is_err());
}

#[test]
fn q8_0_and_bf16_quantization_match_gguf_py() {
    let model = fixture();
    let x = model.get("py.input.f32").unwrap().to_f32_vec().unwrap();

    let want = model.get("py.Q8_0.q").unwrap().bytes;
    let mut blocks = vec![
        BlockQ8_0 {
            d: Default::default(),
            qs: [0; 32]
        };
        x.len() / 32
    ];
    quant::q8_0::quantize_row(&x, &mut blocks).unwrap();
    assert_eq!(bytemuck::cast_slice::<_, u8>(&blocks), want, "Q8_0 bytes");

    let want = model.get("py.BF16.q").unwrap().bytes;
    let ours: Vec<u8> = x.iter().flat_map(|&v| f32_to_bf16(v)).collect();
    assert_eq!(ours, want, "BF16 bytes");
}

#[test]
fn every_metadata_type_reads_back() {
    let model = fixture();
    let m = |k: &str| {
        model
            .metadata(k)
            .unwrap_or_else(|| panic!("{k} missing"))
            .clone()
    };
    assert_eq!(m("meta.u8"), Value::U8(200));
    assert_eq!(m("meta.i8"), Value::I8(-100));
    assert_eq!(m("meta.u16"), Value::U16(60000));
    assert_eq!(m("meta.i16"), Value::I16(-30000));
    assert_eq!(m("meta.u32"), Value::U32(4_000_000_000));
    assert_eq!(m("meta.i32"), Value::I32(-2_000_000_000));
    assert_eq!(m("meta.f32"), Value::F32(1.5));
    assert_eq!(m("meta.bool"), Value::Bool(true));
    assert_eq!(m("meta.string"), Value::String("héllo".into()));
    assert_eq!(m("meta.u64"), Value::U64((1 << 63) + 5));
    assert_eq!(m("meta.i64"), Value::I64(-(1 << 62)));
    assert_eq!(m("meta.f64"), Value::F64(-0.125));
    let ints: Vec<i64> = m("meta.array_i32")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(ints, [1, -2, 3]);
    let strs: Vec<&str> = model
        .metadata("meta.array_str")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(strs, ["a", "bc"]);
    assert_eq!(model.architecture(), Some("strata-reference"));
    assert_eq!(model.file().alignment, 32);
}
