//! GEMV on the real projection sizes and decode attention, on the CPU backend, and the host
//! sampler at Gemma's vocabulary. Kept short: `cargo bench -p strata-kernels`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use strata_kernels::conformance::TestData;
use strata_kernels::cpu::CpuBackend;
use strata_kernels::sampling::{sample, token_logprobs, SamplerRng, SamplingParams};
use strata_kernels::{AttentionParams, Backend, DType, MatmulShape};

fn gemv(c: &mut Criterion) {
    let b = CpuBackend::new();
    let mut g = c.benchmark_group("gemv");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    // (in, out): Gemma-4-sized projections.
    for (k, n) in [(576usize, 1536usize), (640, 2048)] {
        for dtype in [DType::F32, DType::BF16] {
            let mut data = TestData::new(1);
            let x = b
                .upload_f32_as(&data.normals(k, 1.0, DType::F32), DType::F32)
                .unwrap();
            let w = b
                .upload_f32_as(&data.normals(k * n, 0.05, dtype), dtype)
                .unwrap();
            let mut out = b.zeros(n, DType::F32).unwrap();
            let shape = MatmulShape {
                in_features: k,
                out_features: n,
            };
            g.throughput(Throughput::Bytes((k * n * dtype.size_bytes()) as u64));
            g.bench_function(format!("1x{k}x{n}/{dtype:?}"), |bench| {
                bench.iter(|| {
                    b.matmul(black_box(&x), black_box(&w), shape, &mut out)
                        .unwrap()
                })
            });
        }
    }
    g.finish();
}

fn attention_decode(c: &mut Criterion) {
    let b = CpuBackend::new();
    let mut g = c.benchmark_group("attention_decode");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    // Gemma-4 E2B: 8 query heads on one KV head; sliding (d 256, 512 keys) and full (d 512).
    // SmolLM2-135M: 9 query heads on 3 KV heads, d 64, at depth 1024.
    for (d, keys, window, nh, nkv) in [
        (256usize, 512usize, Some(512), 8, 1),
        (512, 2048, None, 8, 1),
        (64, 1024, None, 9, 3),
    ] {
        let mut data = TestData::new(2);
        let q = b
            .upload_f32_as(&data.normals(nh * d, 0.1, DType::F32), DType::F32)
            .unwrap();
        let k = b
            .upload_f32_as(&data.normals(keys * nkv * d, 0.1, DType::F32), DType::F32)
            .unwrap();
        let v = b
            .upload_f32_as(&data.normals(keys * nkv * d, 1.0, DType::F32), DType::F32)
            .unwrap();
        let k_pos: Vec<u32> = (0..keys as u32).collect();
        let q_pos = [keys as u32 - 1];
        let p = AttentionParams {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: d,
            scale: 1.0,
            window,
            causal: true,
            softcap: None,
        };
        let mut out = b.zeros(nh * d, DType::F32).unwrap();
        g.bench_function(format!("d{d}_keys{keys}_heads{nh}x{nkv}"), |bench| {
            bench.iter(|| {
                b.attention(black_box(&q), &k, &v, &q_pos, &k_pos, p, &mut out)
                    .unwrap()
            })
        });
    }
    g.finish();
}

/// One draw from a row of Gemma's 262,144 logits, per sampling setting: what the host pays
/// per sampled request and step (the greedy argmax for comparison).
fn sample_row(c: &mut Criterion) {
    let mut g = c.benchmark_group("sample_row");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10);
    let vocab = 262_144;
    let mut data = TestData::new(3);
    // Flat: every id near the others, so a top-p nucleus holds much of the row. Peaked, as a
    // trained model's rows mostly are: a few ids far above the rest.
    let flat = data.normals(vocab, 3.0, DType::F32);
    let mut peaked = data.normals(vocab, 2.0, DType::F32);
    for (i, x) in peaked.iter_mut().step_by(vocab / 8).enumerate() {
        *x = 14.0 + i as f32 * 0.5;
    }
    let warm = |temperature, top_k, top_p| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p: 0.0,
        seed: Some(1),
    };
    for (name, params, logits) in [
        ("greedy", SamplingParams::greedy(), &peaked),
        ("temperature", warm(0.8, 0, 1.0), &peaked),
        ("top_k_40", warm(0.8, 40, 1.0), &peaked),
        ("top_p_0.95_peaked", warm(0.8, 0, 0.95), &peaked),
        ("top_p_0.95_flat", warm(0.8, 0, 0.95), &flat),
    ] {
        let mut rng = SamplerRng::new(1);
        g.bench_function(name, |bench| {
            bench.iter(|| sample(black_box(logits), &params, rng.next_u64()).unwrap())
        });
    }
    // A token's logprob and its 5 / 20 top ones (what a request with `logprobs` adds to its
    // draw on the host).
    for n in [5, 20] {
        g.bench_function(format!("logprobs_{n}"), |bench| {
            bench.iter(|| token_logprobs(black_box(&peaked), 7, n))
        });
    }
    g.finish();
}

criterion_group!(benches, gemv, attention_decode, sample_row);
criterion_main!(benches);
