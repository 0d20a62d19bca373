//! A Gemma-4 GGUF written by llama.cpp's converter (`--outtype bf16`) against transformers on
//! the checkpoint it came from (tests/fixtures/gguf-gemma4/, made by
//! scripts/reference/make_gemma4_gguf_fixtures.py). The GGUF holds the checkpoint's weights
//! rounded to bf16, so Strata on it must give transformers' logits for those rounded weights,
//! and differ from the checkpoint's own logits by no more than that rounding does.

use std::path::{Path, PathBuf};

use strata_kernels::cpu::CpuBackend;
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
use strata_model::{Assistant, DraftSeq, ForwardBatch, LoadOptions, LogitsMode, Model, SeqChunk};

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

fn pool(model: &Model<CpuBackend>) -> KvPool<HostStorage> {
    let layout = KvLayout::for_config(model.config(), KvCacheDtype::F32).unwrap();
    let plan = PagePlan {
        full: 16,
        window: 16,
        page_size: 4,
    };
    KvPool::new(layout, plan, CacheType::Naive, HostStorage::new()).unwrap()
}

/// Every position's logits of `ids` in one prefill, f32 KV.
fn logits(model: &Model<CpuBackend>, ids: &[u32]) -> Vec<f32> {
    let mut kv = pool(model);
    let req = kv.alloc_request();
    kv.extend(req, ids.len()).unwrap();
    let batch = ForwardBatch {
        embeds: Vec::new(),
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

/// The tiny assistant's checkpoint as llama.cpp's converter read it: the fixture's weights
/// with the centroid head off (the converter drops it), in a temporary directory.
fn assistant_checkpoint() -> tempfile::TempDir {
    let src = dir().join("../tiny/gemma4-tiny-assistant");
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["use_ordered_embeddings"] = false.into();
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    tmp
}

/// Four draft steps of `assistant` after a prompt through `target`: each step's token and
/// logits.
fn drafts(target: &Model<CpuBackend>, assistant: &Assistant<CpuBackend>) -> Vec<(u32, Vec<f32>)> {
    let ids: Vec<u32> = vec![2, 300, 301, 302, 371, 340, 355, 356, 400];
    let mut kv = pool(target);
    let req = kv.alloc_request();
    kv.extend(req, ids.len()).unwrap();
    let prompt = ForwardBatch {
        embeds: Vec::new(),
        seqs: vec![SeqChunk {
            request: req,
            tokens: ids.clone(),
            start: 0,
            logits: LogitsMode::Last,
        }],
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    };
    let out = target.forward_greedy_rows(&mut kv, &prompt).unwrap();
    let mut hidden = out.hidden.unwrap();
    let mut token = out.tokens[0][0];
    let seq = DraftSeq {
        request: req,
        position: ids.len(),
    };
    let mut steps = Vec::new();
    for _ in 0..4 {
        let d = assistant
            .step(target, &mut kv, &[seq], &[token], &hidden, true)
            .unwrap();
        token = d.tokens[0];
        steps.push((token, d.logits.unwrap().remove(0)));
        hidden = d.hidden;
    }
    steps
}

#[test]
fn gemma4_assistant_ggufs_draft_as_their_checkpoint() {
    let b = CpuBackend::new();
    let target = Model::load(b.clone(), &dir().join("gemma4-tiny-BF16.gguf")).unwrap();
    let ckpt = assistant_checkpoint();
    let load = |path: &Path| {
        Assistant::load(b.clone(), path, target.config(), LoadOptions::default()).unwrap()
    };
    let reference = drafts(&target, &load(ckpt.path()));
    // F32: the same weights, so the same drafts and logits up to summation order.
    let f32_steps = drafts(
        &target,
        &load(&dir().join("gemma4-tiny-assistant-F32.gguf")),
    );
    for (i, ((t, l), (rt, rl))) in f32_steps.iter().zip(&reference).enumerate() {
        assert_eq!(t, rt, "F32 step {i}");
        let d = max_abs_diff(l, rl);
        assert!(d < 1e-5, "F32 step {i}: logits off by {d}");
    }
    // BF16: the matrices rounded; the logits move by that rounding only, and the draft is
    // the same wherever the checkpoint's top two are further apart than twice that.
    let bf16_steps = drafts(
        &target,
        &load(&dir().join("gemma4-tiny-assistant-BF16.gguf")),
    );
    const BF16_BOUND: f32 = 0.05;
    let mut clear = 0;
    for (i, ((t, l), (rt, rl))) in bf16_steps.iter().zip(&reference).enumerate() {
        let d = max_abs_diff(l, rl);
        assert!(d < BF16_BOUND, "BF16 step {i}: logits off by {d}");
        let mut sorted = rl.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 2.0 * BF16_BOUND {
            assert_eq!(t, rt, "BF16 step {i}");
            clear += 1;
        }
        // Each step feeds its own draft on, so compare only while they agree.
        if t != rt {
            break;
        }
    }
    eprintln!("BF16 drafter: {clear} of 4 steps with a clear top token");
    // The two paths share nothing but the backend: a drafter that scored nothing would
    // still pass the comparisons above, so the drafts must carry information.
    assert!(reference.iter().any(|(_, l)| l.iter().any(|&x| x != l[0])));
}

#[test]
fn a_gemma4_assistant_gguf_for_another_target_is_refused_naming_the_field() {
    let b = CpuBackend::new();
    let target = Model::load(b.clone(), &dir().join("hf")).unwrap();
    let mut cfg = target.config().clone();
    cfg.hidden_size = 128;
    let err = Assistant::load(
        b,
        &dir().join("gemma4-tiny-assistant-BF16.gguf"),
        &cfg,
        LoadOptions::default(),
    )
    .err()
    .expect("a drafter for a wider target must be refused")
    .to_string();
    assert!(err.contains("backbone_hidden_size"), "{err}");
}

#[test]
fn a_gemma4_assistant_gguf_is_not_served_as_a_model() {
    let err = Model::load(
        CpuBackend::new(),
        &dir().join("gemma4-tiny-assistant-BF16.gguf"),
    )
    .err()
    .expect("an assistant GGUF is a draft model")
    .to_string();
    assert!(
        err.contains("general.architecture") && err.contains("--draft"),
        "{err}"
    );
}
