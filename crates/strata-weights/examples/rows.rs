//! Throughput of the quantized row kernels on one thread: `cargo run --release -p
//! strata-weights --example rows -- [TOKENS] [TILE]` (default 64, 32) prints giga
//! multiply-adds a second per format for Gemma-3 270M's product shapes (and SmolLM2's
//! Q4_1), rows in tasks of 64 and tokens in tiles of TILE as the CPU matmul walks them.
use std::time::Instant;

use strata_gguf::GgmlType;
use strata_weights::quant::{dot_rows_q8, Q8Input};

fn main() {
    let tokens: usize = std::env::args().nth(1).map_or(64, |a| a.parse().unwrap());
    let tile: usize = std::env::args().nth(2).map_or(32, |a| a.parse().unwrap());
    let mut s: u64 = 1;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    // Gemma-3 270M's shapes: gate/up (Q5_0), down (Q4_K, Q6_K), the output head (Q8_0).
    for (ty, block_bytes, elems, scale_at, rows, cols) in [
        (
            GgmlType::Q5_0,
            22usize,
            32usize,
            vec![0usize],
            2048usize,
            640usize,
        ),
        (GgmlType::Q8_0, 34, 32, vec![0], 2048, 640),
        (GgmlType::Q4_K, 144, 256, vec![0, 2], 640, 2048),
        (GgmlType::Q6_K, 210, 256, vec![208], 640, 2048),
        // SmolLM2-135M's gate/up (Q4_1).
        (GgmlType::Q4_1, 20, 32, vec![0, 2], 1536, 576),
        // Long rows of the same bytes: what a row's fixed costs take from the short ones.
        (GgmlType::Q4_1, 20, 32, vec![0, 2], 192, 4608),
        (GgmlType::Q8_0, 34, 32, vec![0], 256, 2560),
    ] {
        let xs: Vec<f32> = (0..tokens * cols)
            .map(|_| next() as f32 / 2e9 - 1.0)
            .collect();
        let row_bytes = cols / elems * block_bytes;
        let mut w: Vec<u8> = (0..rows * row_bytes).map(|_| next() as u8).collect();
        for b in w.chunks_exact_mut(block_bytes) {
            for &o in &scale_at {
                b[o..o + 2].copy_from_slice(&0x2000u16.to_le_bytes());
            }
        }
        let mut input = Q8Input::new();
        assert!(input.quantize(ty, &xs, cols));
        let mut out = vec![0f32; rows * tokens];
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for t0 in (0..tokens).step_by(tile) {
                let t1 = (t0 + tile).min(tokens);
                for r0 in (0..rows).step_by(64) {
                    let r1 = (r0 + 64).min(rows);
                    dot_rows_q8(
                        ty,
                        &w,
                        row_bytes,
                        r0..r1,
                        &input,
                        t0..t1,
                        &mut out[r0 * tokens + t0..],
                        tokens,
                    );
                }
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let macs = (rows * cols * tokens) as f64;
        println!(
            "{ty:?} {rows}x{cols}: {:.1} GMAC/s ({:.2} ms)",
            macs / best / 1e9,
            best * 1e3
        );
    }
}
