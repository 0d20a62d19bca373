//! A Gemma-4 GGUF written by llama.cpp's converter (`--outtype bf16`) against transformers on
//! the checkpoint it came from (tests/fixtures/gguf-gemma4/, made by
//! scripts/reference/make_gemma4_gguf_fixtures.py). The GGUF holds the checkpoint's weights
//! rounded to bf16, so Strata on it must give transformers' logits for those rounded weights,
//! and differ from the checkpoint's own logits by no more than that rounding does.

use std::path::{Path, PathBuf};

use strata_kernels::cpu::CpuBackend;
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
use strata_model::{ForwardBatch, LogitsMode, Model, SeqChunk};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf-gemma4")
}

fn tensor_f32(st: &safetensors::SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every position's logits of `ids` in one prefill, f32 KV.
fn logits(model: &Model<CpuBackend>, ids: &[u32]) -> Vec<f32> {
    let layout = KvLayout::for_config(model.config(), KvCacheDtype::F32).unwrap();
    let plan = PagePlan {
        full: 16,
        window: 16,
        page_size: 4,
    };
    let mut kv = KvPool::new(layout, plan, CacheType::Naive, HostStorage::new()).unwrap();
    let req = kv.alloc_request();
    kv.extend(req, ids.len()).unwrap();
    let batch = ForwardBatch {
        seqs: vec![SeqChunk {
            request: req,
            tokens: ids.to_vec(),
            start: 0,
            logits: LogitsMode::All,
        }],
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    };
    model.forward(&mut kv, &batch).unwrap().logits.remove(0)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn bf16_gguf_of_the_converter_equals_transformers_on_the_rounded_checkpoint() {
    let bytes = std::fs::read(dir().join("hf/reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ids: Vec<u32> = st
        .tensor("input_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    let exact = tensor_f32(&st, "logits");
    let rounded = tensor_f32(&st, "logits_bf16_weights");

    let gguf = Model::load(CpuBackend::new(), &dir().join("gemma4-tiny-BF16.gguf")).unwrap();
    let hf = Model::load(CpuBackend::new(), &dir().join("hf")).unwrap();
    let from_gguf = logits(&gguf, &ids);
    let from_hf = logits(&hf, &ids);

    let gguf_err = max_abs_diff(&from_gguf, &rounded);
    let hf_err = max_abs_diff(&from_hf, &exact);
    let rounding = max_abs_diff(&exact, &rounded);
    let between = max_abs_diff(&from_gguf, &from_hf);
    eprintln!(
        "GGUF vs transformers (bf16 weights) {gguf_err:.2e}; checkpoint vs transformers \
         {hf_err:.2e}; GGUF vs checkpoint {between:.3} (the rounding moves transformers by \
         {rounding:.3})"
    );
    // f32 arithmetic on the same weights: the project's f32 bound against transformers.
    assert!(gguf_err < 1e-4, "BF16 GGUF vs transformers: {gguf_err}");
    assert!(hf_err < 1e-4, "checkpoint vs transformers: {hf_err}");
    // Within bf16 rounding: the GGUF differs from its checkpoint only as the rounding does.
    assert!(
        (between - rounding).abs() < 2e-3,
        "GGUF vs checkpoint {between}, rounding {rounding}"
    );
    assert!(
        rounding > 0.0,
        "the rounded weights must differ, or this test shows nothing"
    );
}
