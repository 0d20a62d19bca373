//! LoRA adapters against peft: CPU f32 logits of the tiny fixtures with each random adapter
//! (made by `scripts/reference/make_lora_fixtures.py`), alone and in one batch mixing every
//! adapter and the base model, chunked prompts included; and the adapters Strata refuses.

use std::path::{Path, PathBuf};

use strata_kernels::cpu::CpuBackend;
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
use strata_model::{ForwardBatch, LogitsMode, Model, SeqChunk};

const ADAPTERS: [&str; 3] = ["attn-r4", "mlp-r8-rs", "all-r2"];

fn tiny(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name)
}

/// The fixture's input ids and peft's logits by name (`logits_base`, `logits_<adapter>`).
fn reference(model: &str) -> (Vec<u32>, impl Fn(&str) -> Vec<f32>) {
    let bytes = std::fs::read(tiny("lora").join(model).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ids = st
        .tensor("input_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    let tensors: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n.starts_with("logits_"))
        .map(|(n, t)| {
            let v = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (n, v)
        })
        .collect();
    let get = move |name: &str| {
        let key = format!("logits_{name}");
        tensors.iter().find(|t| t.0 == key).unwrap().1.clone()
    };
    (ids, get)
}

fn pool(model: &Model<CpuBackend>) -> KvPool<HostStorage> {
    let layout = KvLayout::for_config(model.config(), KvCacheDtype::F32).unwrap();
    let plan = PagePlan {
        full: 128,
        window: 128,
        page_size: 4,
    };
    KvPool::new(layout, plan, CacheType::Naive, HostStorage::new()).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Every position's logits of `ids` for each of `adapters` (0 = none), all sequences in the
/// same steps, the prompt in chunks of `chunks`.
fn run_mixed(
    model: &Model<CpuBackend>,
    ids: &[u32],
    adapters: &[u32],
    chunks: &[usize],
) -> Vec<Vec<f32>> {
    let mut kv = pool(model);
    let reqs: Vec<_> = adapters.iter().map(|_| kv.alloc_request()).collect();
    let mut out = vec![Vec::new(); adapters.len()];
    let mut start = 0;
    for &n in chunks {
        let mut batch = ForwardBatch {
            adapters: adapters.to_vec(),
            ..ForwardBatch::default()
        };
        for &r in &reqs {
            kv.extend(r, n).unwrap();
            batch.seqs.push(SeqChunk {
                request: r,
                tokens: ids[start..start + n].to_vec(),
                start,
                logits: LogitsMode::All,
            });
        }
        let got = model.forward(&mut kv, &batch).unwrap();
        for (o, l) in out.iter_mut().zip(got.logits) {
            o.extend(l);
        }
        start += n;
    }
    out
}

fn check(name: &str) {
    let mut model = Model::load(CpuBackend::new(), &tiny(name)).unwrap();
    // Every layer runs every row, so that the adapters' rows in KV-shared layers count too.
    model.set_kv_shared_trim(false);
    let (ids, want) = reference(name);
    for (i, a) in ADAPTERS.iter().enumerate() {
        let info = model
            .load_lora(i as u32 + 1, &tiny("lora").join(name).join(a), 64)
            .unwrap();
        assert!(!info.adapted.is_empty(), "{name} {a}");
    }
    let n = ids.len();
    // Each adapter alone, in one pass.
    for (i, a) in ADAPTERS.iter().enumerate() {
        let got = run_mixed(&model, &ids, &[i as u32 + 1], &[n]).remove(0);
        let d = max_abs_diff(&got, &want(a));
        assert!(d < 1e-4, "{name} {a}: differs from peft by {d}");
        // The adapter changes the logits (else the test could not fail).
        assert!(max_abs_diff(&want(a), &want("base")) > 0.1, "{name} {a}");
    }
    // One batch of the base model and every adapter, twice over in a different order, the
    // prompt in chunks.
    let mix = [0, 1, 2, 3, 3, 1, 0, 2];
    for chunks in [vec![n], vec![7, 5, n - 12]] {
        let got = run_mixed(&model, &ids, &mix, &chunks);
        for (&id, g) in mix.iter().zip(&got) {
            let key = if id == 0 {
                "base"
            } else {
                ADAPTERS[id as usize - 1]
            };
            let d = max_abs_diff(g, &want(key));
            assert!(
                d < 1e-4,
                "{name} mixed {key} {chunks:?}: differs from peft by {d}"
            );
        }
    }
    // Unloaded, an adapter's id is refused.
    assert!(model.unload_lora(2));
    let mut kv = pool(&model);
    let r = kv.alloc_request();
    kv.extend(r, 1).unwrap();
    let batch = ForwardBatch {
        seqs: vec![SeqChunk {
            request: r,
            tokens: ids[..1].to_vec(),
            start: 0,
            logits: LogitsMode::Last,
        }],
        adapters: vec![2],
        ..ForwardBatch::default()
    };
    let e = model.forward(&mut kv, &batch).unwrap_err().to_string();
    assert!(e.contains("adapter 2 is not loaded"), "{e}");
}

#[test]
fn gemma4_adapters_alone_and_mixed_match_peft() {
    check("gemma4-tiny");
}

#[test]
fn qwen3_adapters_alone_and_mixed_match_peft() {
    check("qwen3-tiny");
}

#[test]
fn llama_adapters_alone_and_mixed_match_peft() {
    check("llama-tiny");
}

/// A copy of adapter `from` of model `model` in a fresh directory, its config changed by
/// `config` and its tensors replaced by `tensors` when given.
fn variant(
    model: &str,
    from: &str,
    config: impl FnOnce(&mut serde_json::Value),
    tensors: Option<Vec<u8>>,
) -> tempfile::TempDir {
    let src = tiny("lora").join(model).join(from);
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(src.join("adapter_config.json")).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    config(&mut cfg);
    std::fs::write(dir.path().join("adapter_config.json"), cfg.to_string()).unwrap();
    let bytes =
        tensors.unwrap_or_else(|| std::fs::read(src.join("adapter_model.safetensors")).unwrap());
    std::fs::write(dir.path().join("adapter_model.safetensors"), bytes).unwrap();
    dir
}

/// A safetensors file of f32 zero matrices.
fn matrices(list: &[(&str, [usize; 2])]) -> Vec<u8> {
    let data: Vec<Vec<u8>> = list
        .iter()
        .map(|(_, s)| vec![0u8; s[0] * s[1] * 4])
        .collect();
    let entries: Vec<(&str, &str, &[usize], &[u8])> = list
        .iter()
        .zip(&data)
        .map(|((n, s), d)| (*n, "F32", &s[..], &d[..]))
        .collect();
    strata_weights::write_safetensors(&entries)
}

#[test]
fn adapters_strata_cannot_serve_exactly_are_refused_by_name() {
    let gemma = Model::load(CpuBackend::new(), &tiny("gemma4-tiny")).unwrap();
    let llama = Model::load(CpuBackend::new(), &tiny("llama-tiny")).unwrap();
    let refused = |m: &Model<CpuBackend>, dir: &Path, rank: usize| {
        m.load_lora(1, dir, rank).unwrap_err().to_string()
    };
    // Another model's adapter: Qwen3's q is twice as wide as the tiny Llama's.
    let e = refused(&llama, &tiny("lora/qwen3-tiny/attn-r4"), 64);
    assert!(e.contains("q_proj") && e.contains("another model"), "{e}");
    // More layers than the model has.
    let e = refused(&llama, &tiny("lora/gemma4-tiny/mlp-r8-rs"), 64);
    assert!(e.contains("4 layers"), "{e}");
    // A rank above --max-lora-rank.
    let e = refused(&llama, &tiny("lora/llama-tiny/mlp-r8-rs"), 4);
    assert!(e.contains("rank 8") && e.contains("--max-lora-rank"), "{e}");
    // k on a KV-shared layer (Gemma-4's layers 3 to 5 read layer 1's and 2's K/V).
    let k = "base_model.model.model.layers.4.self_attn.k_proj.lora_";
    let (a, b) = (format!("{k}A.weight"), format!("{k}B.weight"));
    let shared = matrices(&[(a.as_str(), [2, 64]), (b.as_str(), [32, 2])]);
    let dir = variant("gemma4-tiny", "all-r2", |_| {}, Some(shared));
    let e = refused(&gemma, dir.path(), 64);
    assert!(e.contains("layer 4 has no k_proj"), "{e}");
    // Options that change the output in ways Strata does not compute.
    for (key, value) in [
        ("modules_to_save", serde_json::json!(["lm_head"])),
        ("use_dora", serde_json::json!(true)),
        ("bias", serde_json::json!("lora_only")),
    ] {
        let dir = variant("llama-tiny", "attn-r4", |c| c[key] = value, None);
        let e = refused(&llama, dir.path(), 64);
        assert!(e.contains(key), "{key}: {e}");
    }
    // A module outside the layers' products.
    let head = matrices(&[("base_model.model.lm_head.lora_A.weight", [4, 64])]);
    let dir = variant("llama-tiny", "attn-r4", |_| {}, Some(head));
    let e = refused(&llama, dir.path(), 64);
    assert!(e.contains("lm_head"), "{e}");
    // A truncated file.
    let mut bytes =
        std::fs::read(tiny("lora/llama-tiny/attn-r4/adapter_model.safetensors")).unwrap();
    bytes.truncate(bytes.len() / 2);
    let dir = variant("llama-tiny", "attn-r4", |_| {}, Some(bytes));
    refused(&llama, dir.path(), 64);
    // No adapter is left loaded by a refusal.
    assert!(!llama.unload_lora(1) && !gemma.unload_lora(1));
}

/// With room for two adapters on the backend, three are served in turn: each is uploaded
/// when a step names it, the least recently used one dropped, and the logits still equal
/// peft's; a step naming all three is refused.
#[test]
fn adapters_past_the_resident_limit_are_swapped_in_and_still_match_peft() {
    let name = "llama-tiny";
    let model = Model::load(CpuBackend::new(), &tiny(name)).unwrap();
    model.set_max_resident_loras(2);
    let (ids, want) = reference(name);
    for (i, a) in ADAPTERS.iter().enumerate() {
        model
            .load_lora(i as u32 + 1, &tiny("lora").join(name).join(a), 64)
            .unwrap();
    }
    let n = ids.len();
    for (turn, id) in [1u32, 2, 3, 1, 2, 2].into_iter().enumerate() {
        let got = run_mixed(&model, &ids, &[id, 0], &[n]);
        let d = max_abs_diff(&got[0], &want(ADAPTERS[id as usize - 1]));
        assert!(
            d < 1e-4,
            "turn {turn}, adapter {id}: differs from peft by {d}"
        );
        let s = model.lora_stats();
        assert!(s.resident <= 2 && s.loaded == 3, "{s:?}");
    }
    // Uploads: 1, 2, 3 (drops 1), 1 (drops 2), 2 (drops 3), then 2 again resident.
    assert_eq!(model.lora_stats().uploads, 5);
    let mut kv = pool(&model);
    let reqs: Vec<_> = (0..3).map(|_| kv.alloc_request()).collect();
    let mut batch = ForwardBatch {
        adapters: vec![1, 2, 3],
        ..ForwardBatch::default()
    };
    for &r in &reqs {
        kv.extend(r, 1).unwrap();
        batch.seqs.push(SeqChunk {
            request: r,
            tokens: ids[..1].to_vec(),
            start: 0,
            logits: LogitsMode::Last,
        });
    }
    let e = model.forward(&mut kv, &batch).unwrap_err().to_string();
    assert!(
        e.contains("3 LoRA adapters") && e.contains("at most 2"),
        "{e}"
    );
}
