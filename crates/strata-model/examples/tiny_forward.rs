//! One model on the CPU backend, without the scheduler or the engine: the tiny random Llama
//! of `tests/fixtures/tiny/llama-tiny` (a safetensors file and its config.json) loaded with
//! `Model::load`, a prompt run through it in one forward pass over a KV pool, then three
//! greedy decode steps of one token each, which read the K/V the earlier steps stored.
use std::path::Path;

use strata_kernels::{cpu::CpuBackend, sampling::argmax};
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, PagePlan};
use strata_model::{ForwardBatch, LogitsMode, Model, SeqChunk};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama-tiny");
    let model = Model::load(CpuBackend::new(), &dir)?;
    let cfg = model.config();
    let (layers, vocab) = (cfg.num_layers(), cfg.vocab_size);
    println!("{:?}: {layers} layers, vocab {vocab}", cfg.architecture);

    // The K/V of every layer in host memory, f32: 16 pages of 4 tokens.
    let layout = KvLayout::for_config(cfg, KvCacheDtype::F32)?;
    let plan = PagePlan {
        full: 16,
        window: 0,
        page_size: 4,
    };
    let mut kv = KvPool::new(layout, plan, CacheType::Naive, HostStorage::new())?;
    let request = kv.alloc_request();

    let mut tokens: Vec<u32> = vec![1, 5, 9, 13, 17];
    let mut start = 0;
    for _ in 0..4 {
        // The tokens not yet in the pool: the whole prompt first, then one at a time.
        let chunk = tokens[start..].to_vec();
        let end = tokens.len();
        kv.extend(request, end - start)?;
        let batch = ForwardBatch {
            embeds: Vec::new(),
            seqs: vec![SeqChunk {
                request,
                tokens: chunk,
                start,
                logits: LogitsMode::Last,
            }],
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        let out = model.forward(&mut kv, &batch)?;
        let last = out.last(0).ok_or("no logits")?;
        let next = argmax(last);
        let logit = last[next as usize];
        println!("positions {start}..{end}: argmax of the last logits {next} ({logit:.4})");
        start = end;
        tokens.push(next);
    }
    println!("sequence: {tokens:?}");
    kv.release(request)?;
    Ok(())
}
