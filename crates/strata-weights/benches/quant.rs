//! Dequantization and dot-product throughput per format, in bytes of quantized input per
//! second. `cargo bench -p strata-weights --bench quant`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use strata_weights::quant::{
    self, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8_0, F16Le, QuantBlock,
};

/// Elements per benchmarked row set: 1 Mi values (a mid-sized weight matrix's worth).
const N: usize = 1 << 20;

/// Deterministic pseudo-random blocks with finite f16 scales at `f16_offsets`.
fn blocks<B: QuantBlock>(f16_offsets: &[usize]) -> Vec<B> {
    let size = std::mem::size_of::<B>();
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut bytes: Vec<u8> = (0..N / B::ELEMS * size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for block in bytes.chunks_exact_mut(size) {
        for &off in f16_offsets {
            block[off..off + 2].copy_from_slice(&F16Le::from_f32(0.01).0);
        }
    }
    quant::as_blocks::<B>(&bytes).unwrap().to_vec()
}

fn bench_format<B: QuantBlock>(c: &mut Criterion, f16_offsets: &[usize]) {
    let w = blocks::<B>(f16_offsets);
    let bytes = (w.len() * std::mem::size_of::<B>()) as u64;
    let x: Vec<f32> = (0..N).map(|i| ((i % 17) as f32 - 8.0) * 0.1).collect();
    let acts = quant::quantize_activations::<B::Activation>(&x).unwrap();
    let mut out = vec![0.0f32; N];

    let mut g = c.benchmark_group(B::TYPE.name());
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("dequantize", |b| {
        b.iter(|| quant::dequantize_row(black_box(&w), black_box(&mut out)).unwrap())
    });
    g.bench_function("dot_f32", |b| {
        b.iter(|| quant::dot(black_box(&w), black_box(&x)).unwrap())
    });
    g.bench_function("dot_q8", |b| {
        b.iter(|| quant::dot_q8(black_box(&w), black_box(&acts)).unwrap())
    });
    g.finish();
}

fn all_formats(c: &mut Criterion) {
    bench_format::<BlockQ8_0>(c, &[0]);
    bench_format::<BlockQ4_0>(c, &[0]);
    bench_format::<BlockQ4_1>(c, &[0, 2]);
    bench_format::<BlockQ5_0>(c, &[0]);
    bench_format::<BlockQ5_1>(c, &[0, 2]);
    bench_format::<BlockQ2K>(c, &[80, 82]);
    bench_format::<BlockQ3K>(c, &[108]);
    bench_format::<BlockQ4K>(c, &[0, 2]);
    bench_format::<BlockQ5K>(c, &[0, 2]);
    bench_format::<BlockQ6K>(c, &[208]);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = all_formats
}
criterion_main!(benches);
