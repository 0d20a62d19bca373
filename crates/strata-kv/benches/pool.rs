//! Allocation throughput and prefix matching with a million cached tokens (E2B layout,
//! bookkeeping only: the storage holds no bytes).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;
use strata_config::ModelConfig;
use strata_kv::{CacheType, KvCacheDtype, KvLayout, KvPool, ModelDtype, NullStorage, PagePlan};

fn e2b() -> ModelConfig {
    let types: Vec<&str> = (0..35)
        .map(|i| {
            if (i + 1) % 5 == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    let cfg = json!({
        "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 1536,
        "intermediate_size": 6144, "num_hidden_layers": 35, "num_attention_heads": 8,
        "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "sliding_window": 512, "layer_types": types,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
        },
        "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144,
        "num_kv_shared_layers": 20, "use_double_wide_mlp": true
    });
    ModelConfig::from_hf_json(&cfg.to_string()).unwrap()
}

fn pool(full: usize, window: usize, page_size: usize) -> KvPool<NullStorage> {
    let layout = KvLayout::new(&e2b(), KvCacheDtype::Bf16, ModelDtype::Bf16).unwrap();
    let plan = PagePlan {
        full,
        window,
        page_size,
    };
    KvPool::new(layout, plan, CacheType::Radix, NullStorage).unwrap()
}

/// A pseudo-random token sequence for session `s`.
fn session_tokens(s: u32, len: usize) -> Vec<u32> {
    let mut x = s.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % 262_144
        })
        .collect()
}

fn allocation(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocate");
    let tokens = 4096;
    group.throughput(Throughput::Elements(tokens as u64));
    for page_size in [1, 16] {
        let mut p = pool(1 << 20, 1 << 18, page_size);
        group.bench_function(
            format!("extend_commit_release/page_size_{page_size}/4096_tokens"),
            |b| {
                b.iter(|| {
                    let r = p.alloc_request();
                    for _ in 0..tokens / 256 {
                        let range = p.extend(r, 256).unwrap();
                        p.commit(r, range.end).unwrap();
                    }
                    p.release(r).unwrap();
                })
            },
        );
    }
    group.finish();
}

fn prefix_matching(c: &mut Criterion) {
    // 1024 sessions of 1024 tokens: 1M cached tokens.
    let (sessions, len) = (1024u32, 1024usize);
    let mut p = pool(1 << 21, 1 << 20, 1);
    for s in 0..sessions {
        let t = session_tokens(s, len);
        let r = p.alloc_request();
        for _ in 0..len / 256 {
            let range = p.extend(r, 256).unwrap();
            p.commit(r, range.end).unwrap();
        }
        p.cache_prefix(r, &t).unwrap();
        p.release(r).unwrap();
    }
    // Sessions that happen to start alike share their common prefix.
    assert!(p.status().cached_tokens > 1_040_000);
    let prompts: Vec<Vec<u32>> = (0..64)
        .map(|i| {
            let mut t = session_tokens(i * 13 % sessions, len);
            t.extend(session_tokens(9999 + i, 64));
            t
        })
        .collect();
    assert_eq!(
        p.match_prefix(&prompts[0]),
        len,
        "the window tail keeps each session usable"
    );
    let mut group = c.benchmark_group("match_prefix_1M_cached");
    group.throughput(Throughput::Elements(prompts[0].len() as u64));
    let mut i = 0;
    group.bench_function("peek_1088_token_prompt", |b| {
        b.iter(|| {
            i = (i + 1) % prompts.len();
            black_box(p.match_prefix(&prompts[i]))
        })
    });
    group.bench_function("reuse_and_release_1088_token_prompt", |b| {
        b.iter(|| {
            i = (i + 1) % prompts.len();
            let r = p.alloc_request();
            let n = p.reuse_prefix(r, &prompts[i]).unwrap();
            p.release(r).unwrap();
            black_box(n)
        })
    });
    group.finish();
}

/// Reading stored rows back as f32 (what CPU attention does with every key and value it
/// reads from the pool): 1,024 rows of 256 values.
fn row_decoding(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_row");
    let (rows, d) = (1024usize, 256usize);
    group.throughput(Throughput::Elements((rows * d) as u64));
    for format in [
        strata_kv::KvFormat::Bf16,
        strata_kv::KvFormat::Int8PerTokenHead,
    ] {
        let bytes: Vec<u8> = (0..rows * d * format.element_bytes())
            .map(|i| (i * 37 % 251) as u8)
            .collect();
        let mut out = vec![0f32; d];
        group.bench_function(format!("{format:?}/1024_rows_of_256"), |b| {
            b.iter(|| {
                for row in bytes.chunks_exact(d * format.element_bytes()) {
                    strata_kv::quant::decode_row(format, black_box(row), 0.5, &mut out);
                }
                black_box(&out);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, allocation, prefix_matching, row_decoding);
criterion_main!(benches);
