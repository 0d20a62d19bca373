//! The Gemma-4 assistant (drafter) against transformers: three draft steps on the tiny
//! Gemma-4 target's K/V (`tests/fixtures/tiny/gemma4-tiny-assistant`, made by
//! `scripts/reference/make_assistant_fixture.py`), on the host pool and the paged pool.

use std::path::{Path, PathBuf};

use strata_kernels::cpu::CpuBackend;
use strata_kernels::{Backend, HostSlice};
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, KvStorage, PagePlan};
use strata_model::{
    Assistant, DraftSeq, ForwardBatch, KvCache, LoadOptions, LogitsMode, Model, PagedStorage,
    SeqChunk,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name)
}

struct Reference {
    ids: Vec<u32>,
    bonus: u32,
    target_hidden: Vec<f32>,
    draft_tokens: Vec<u32>,
    draft_logits: Vec<f32>,
    draft_hidden: Vec<f32>,
}

fn reference() -> Reference {
    let path = fixture("gemma4-tiny-assistant").join("reference.safetensors");
    let bytes = std::fs::read(path).expect("reference.safetensors");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let ids = |name: &str| -> Vec<u32> {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::I64, "{name}");
        t.data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    };
    Reference {
        ids: ids("input_ids"),
        bonus: ids("bonus")[0],
        target_hidden: f32s("target_hidden"),
        draft_tokens: ids("draft_tokens"),
        draft_logits: f32s("draft_logits"),
        draft_hidden: f32s("draft_hidden"),
    }
}

/// The tiny Gemma-4 target and its assistant.
fn tiny_pair(b: &CpuBackend) -> (Model<CpuBackend>, Assistant<CpuBackend>) {
    let target = Model::load(b.clone(), &fixture("gemma4-tiny")).unwrap();
    let assistant = Assistant::load(
        b.clone(),
        &fixture("gemma4-tiny-assistant"),
        target.config(),
        LoadOptions::default(),
    )
    .unwrap();
    (target, assistant)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn pool_of<S: KvStorage>(model: &Model<CpuBackend>, storage: S) -> KvPool<S> {
    let layout = KvLayout::for_config(model.config(), KvCacheDtype::Auto).unwrap();
    let plan = PagePlan {
        full: 16,
        window: 16,
        page_size: 4,
    };
    KvPool::new(layout, plan, CacheType::Naive, storage).unwrap()
}

/// The prompt through the target, then three draft steps, each checked against the
/// reference: tokens exactly, logits and fed-back states within 1e-4.
fn drafts_match<S: KvStorage>(storage: S)
where
    KvPool<S>: KvCache<CpuBackend>,
{
    let r = reference();
    let b = CpuBackend::new();
    let (target, assistant) = tiny_pair(&b);
    let mut kv = pool_of(&target, storage);
    let req = kv.alloc_request();
    kv.extend(req, r.ids.len()).unwrap();
    let prompt = ForwardBatch {
        embeds: Vec::new(),
        seqs: vec![SeqChunk {
            request: req,
            tokens: r.ids.clone(),
            start: 0,
            logits: LogitsMode::Last,
        }],
        adjust: Vec::new(),
        masked: Vec::new(),
        adapters: Vec::new(),
    };
    let out = target.forward_greedy_rows(&mut kv, &prompt).unwrap();
    assert_eq!(out.tokens, vec![vec![r.bonus]]);
    let mut hidden = out.hidden.unwrap();
    let d = max_diff(&b.download(&hidden).unwrap(), &r.target_hidden);
    assert!(d < 1e-4, "target hidden state off by {d}");

    let seq = DraftSeq {
        request: req,
        position: r.ids.len(),
    };
    let vocab = target.config().vocab_size;
    let hb = target.config().hidden_size;
    let mut token = r.bonus;
    for step in 0..r.draft_tokens.len() {
        let drafted = assistant
            .step(&target, &mut kv, &[seq], &[token], &hidden, true)
            .unwrap();
        let logits = &drafted.logits.as_ref().unwrap()[0];
        let want = &r.draft_logits[step * vocab..(step + 1) * vocab];
        let d = max_diff(logits, want);
        assert!(d < 1e-4, "step {step}: logits off by {d}");
        assert_eq!(drafted.tokens, vec![r.draft_tokens[step]], "step {step}");
        let h = b.download(&drafted.hidden).unwrap();
        let d = max_diff(&h, &r.draft_hidden[step * hb..(step + 1) * hb]);
        assert!(d < 1e-4, "step {step}: state off by {d}");
        token = drafted.tokens[0];
        hidden = drafted.hidden;
    }
    // The drafter read the target's K/V and wrote none: the target's next step is as if
    // no draft had run.
    let stored = kv.seq_len(req).unwrap();
    assert_eq!(stored, r.ids.len());
}

#[test]
fn drafts_match_transformers_on_the_host_pool() {
    drafts_match(HostStorage::new());
}

#[test]
fn drafts_match_transformers_on_the_paged_pool() {
    drafts_match(PagedStorage::new(CpuBackend::new()));
}

#[test]
fn a_draft_step_needs_one_hidden_row_a_sequence() {
    let b = CpuBackend::new();
    let (target, assistant) = tiny_pair(&b);
    let mut kv = pool_of(&target, HostStorage::new());
    let req = kv.alloc_request();
    kv.extend(req, 3).unwrap();
    let short = b.upload(HostSlice::F32(&[0.0; 10])).unwrap();
    let seq = DraftSeq {
        request: req,
        position: 3,
    };
    let err = assistant
        .step(&target, &mut kv, &[seq], &[1], &short, false)
        .err()
        .expect("a wrong-sized state is refused");
    assert!(err.to_string().contains("hidden values"), "{err}");
}

#[test]
fn a_drafter_for_another_target_is_refused_naming_the_field() {
    let b = CpuBackend::new();
    for (target, field) in [("gemma3-tiny", "model_type"), ("llama-tiny", "model_type")] {
        let t = Model::load(b.clone(), &fixture(target)).unwrap();
        let err = Assistant::load(
            b.clone(),
            &fixture("gemma4-tiny-assistant"),
            t.config(),
            LoadOptions::default(),
        )
        .err()
        .expect("refused");
        assert!(err.to_string().contains(field), "{target}: {err}");
    }
}
