//! bitsandbytes 4-bit checkpoints (NF4 with double quantization, FP4, a bf16 state) load and
//! compute as transformers does on the same dequantized matrices (CPU f32 logits).

use std::path::{Path, PathBuf};

use strata_kernels::cpu::CpuBackend;
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
use strata_model::{ForwardBatch, LogitsMode, Model, SeqChunk};
use strata_weights::{SafetensorsModel, WeightSource};

fn dir(variant: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny/bnb")
        .join(variant)
}

/// `variant`'s logits of the reference ids, with LoRA adapter `lora` of the tiny Llama's
/// fixtures loaded when given, against the reference's `want`.
fn check_with(variant: &str, lora: Option<&str>, want: &str, bound: f32) {
    let reference = SafetensorsModel::open(dir(variant).join("reference.safetensors")).unwrap();
    let ids: Vec<u32> = reference
        .get("input_ids")
        .unwrap()
        .bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    let want = reference.get(want).unwrap().to_f32_vec().unwrap();
    let model = Model::load(CpuBackend::new(), &dir(variant)).unwrap();
    let adapters = match lora {
        Some(name) => {
            let path = dir("../lora/llama-tiny").join(name);
            model.load_lora(1, &path, 64).unwrap();
            vec![1]
        }
        None => Vec::new(),
    };
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
            tokens: ids.clone(),
            start: 0,
            logits: LogitsMode::All,
        }],
        adapters,
        ..ForwardBatch::default()
    };
    let got = model.forward(&mut kv, &batch).unwrap().logits.remove(0);
    let d = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        d < bound,
        "{variant} {lora:?}: differs from transformers by {d}"
    );
}

fn check(variant: &str, bound: f32) {
    check_with(variant, None, "logits", bound);
}

/// QLoRA serving: a LoRA adapter over the 4-bit base, against peft on the dequantized base.
#[test]
fn a_lora_adapter_over_4_bit_weights_matches_peft() {
    for variant in ["llama-tiny-nf4-dq", "llama-tiny-fp4"] {
        check_with(variant, Some("attn-r4"), "logits_lora_attn-r4", 1e-4);
    }
}

#[test]
fn nf4_double_quantized_matches_transformers() {
    check("llama-tiny-nf4-dq", 1e-4);
}

#[test]
fn fp4_matches_transformers() {
    check("llama-tiny-fp4", 1e-4);
}

#[test]
fn gemma4_nf4_with_a_bf16_state_matches_transformers() {
    check("gemma4-tiny-nf4-dq-bf16", 1e-4);
}

/// The 4-bit matrices stay 4-bit on the CPU: a decode step's products read exactly the
/// codes and absmax values of every layer's matrices, plus the dense output projection.
#[test]
fn four_bit_matrices_stay_four_bit_in_memory() {
    use strata_weights::ModelWeights;
    for variant in ["llama-tiny-nf4-dq", "llama-tiny-fp4"] {
        let model = Model::load(CpuBackend::new(), &dir(variant)).unwrap();
        let c = model.config();
        let w = ModelWeights::open(dir(variant), None, None).unwrap();
        let (mut packed, mut elements) = (0, 0);
        for l in 0..c.num_layers() {
            for m in [
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
                "mlp.down_proj",
            ] {
                let q = w
                    .bnb4(&format!("model.layers.{l}.{m}.weight"))
                    .unwrap_or_else(|| panic!("{variant}: layer {l} {m} is not 4-bit"));
                packed += q.stored_bytes();
                elements += q.rows() * q.cols();
            }
        }
        let head = w.lm_head(&[c.vocab_size, c.hidden_size]).unwrap();
        let (_, step) = model.weight_bytes();
        assert_eq!(step, packed + head.bytes.len(), "{variant}");
        // Half a byte a code and 4 bytes an absmax of 64 (or fewer) values.
        assert!(
            packed * 16 <= elements * 9 + 64,
            "{variant}: {packed} bytes for {elements}"
        );
    }
}
