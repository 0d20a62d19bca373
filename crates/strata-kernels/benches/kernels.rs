//! GEMV on the real projection sizes and decode attention, on the CPU backend.
//! Kept short: `cargo bench -p strata-kernels`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use strata_kernels::conformance::TestData;
use strata_kernels::cpu::CpuBackend;
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
    for (d, keys, window) in [(256usize, 512usize, Some(512)), (512, 2048, None)] {
        let (nh, nkv) = (8, 1);
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

criterion_group!(benches, gemv, attention_decode);
criterion_main!(benches);
