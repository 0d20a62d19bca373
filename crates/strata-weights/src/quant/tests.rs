//! Property checks of every block format: dot products against the dequantized values,
//! quantization error bounds, and layout details. Bit-exactness against gguf-py is checked
//! in `tests/reference.rs` with committed vectors.

use super::*;
use bytemuck::Zeroable;

/// SplitMix64: a tiny deterministic generator so the tests need no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

/// Random blocks of `B` whose f16 fields (at `f16_offsets` within a block) are finite.
fn random_blocks<B: QuantBlock>(rng: &mut Rng, n: usize, f16_offsets: &[usize]) -> Vec<B> {
    let size = std::mem::size_of::<B>();
    let mut bytes = rng.bytes(n * size);
    for block in bytes.chunks_exact_mut(size) {
        for &off in f16_offsets {
            let v = F16Le::from_f32(rng.f32() * 0.5);
            block[off..off + 2].copy_from_slice(&v.0);
        }
    }
    as_blocks::<B>(&bytes).unwrap().to_vec()
}

fn dequantized<B: QuantBlock>(blocks: &[B]) -> Vec<f32> {
    let mut out = vec![0.0; blocks.len() * B::ELEMS];
    dequantize_row(blocks, &mut out).unwrap();
    out
}

/// Runs `check::<B>(f16 field offsets)` for every block type with a dot-product kernel (the
/// offsets are where its f16 scales sit, which the random blocks must keep finite).
macro_rules! for_each_block_type {
    ($check:ident) => {
        $check::<BlockQ4_0>(&[0]);
        $check::<BlockQ4_1>(&[0, 2]);
        $check::<BlockQ5_0>(&[0]);
        $check::<BlockQ5_1>(&[0, 2]);
        $check::<BlockQ8_0>(&[0]);
        $check::<BlockQ2K>(&[80, 82]);
        $check::<BlockQ3K>(&[108]);
        $check::<BlockQ4K>(&[0, 2]);
        $check::<BlockQ5K>(&[0, 2]);
        $check::<BlockQ6K>(&[208]);
    };
}

/// f32 and quantized-activation dot products agree with the f64 dot of the dequantized
/// weights: tightly for f32 activations, within the activation quantization error for Q8.
fn check_dots<B: QuantBlock>(f16_offsets: &[usize]) {
    let mut rng = Rng(B::TYPE.id() as u64 + 1);
    for _ in 0..20 {
        let blocks: Vec<B> = random_blocks(&mut rng, 4, f16_offsets);
        let w = dequantized(&blocks);
        let x = rng.values(w.len(), 2.0);
        let exact: f64 = w
            .iter()
            .zip(&x)
            .map(|(&w, &x)| f64::from(w) * f64::from(x))
            .sum();
        let magnitude: f64 = w
            .iter()
            .zip(&x)
            .map(|(&w, &x)| (f64::from(w) * f64::from(x)).abs())
            .sum();

        let got = f64::from(dot(&blocks, &x).unwrap());
        assert!(
            (got - exact).abs() <= 1e-5 * magnitude + 1e-6,
            "{}: dot {got} vs {exact}",
            B::TYPE
        );

        let acts = quantize_activations::<B::Activation>(&x).unwrap();
        let got = f64::from(dot_q8(&blocks, &acts).unwrap());
        // Each activation moves by at most half a step (max|x|/127/2) per block.
        let wsum: f64 = w.iter().map(|&w| f64::from(w).abs()).sum();
        let step = 2.0 / 127.0;
        assert!(
            (got - exact).abs() <= wsum * step * 0.5 + 1e-4 * magnitude + 1e-6,
            "{}: dot_q8 {got} vs {exact}",
            B::TYPE
        );
    }
}

#[test]
fn dot_products_match_dequantization() {
    for_each_block_type!(check_dots);
}

#[test]
fn byte_dispatch_matches_typed_calls() {
    let mut rng = Rng(7);
    let blocks: Vec<BlockQ4K> = random_blocks(&mut rng, 2, &[0, 2]);
    let bytes: &[u8] = bytemuck::cast_slice(&blocks);
    let mut a = vec![0.0; 512];
    dequantize(GgmlType::Q4_K, bytes, &mut a).unwrap();
    assert_eq!(a, dequantized(&blocks));
    let x = rng.values(512, 1.0);
    assert_eq!(
        dot_bytes(GgmlType::Q4_K, bytes, &x).unwrap(),
        dot(&blocks, &x).unwrap()
    );
    // Wrong lengths and unsupported types are errors, not panics.
    assert!(dequantize(GgmlType::Q4_K, &bytes[1..], &mut a).is_err());
    assert!(dequantize(GgmlType::Q4_K, bytes, &mut a[1..]).is_err());
    assert!(dot_bytes(GgmlType::Q4_K, bytes, &x[1..]).is_err());
    assert!(dequantize(GgmlType::IQ2_XXS, bytes, &mut a).is_err());
    assert!(quantize_activations::<BlockQ8K>(&x[1..]).is_err());
}

#[test]
fn float_types_decode() {
    let vals = [1.0f32, -2.5, 0.0, 65504.0, 1e-7];
    let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16_bytes: Vec<u8> = vals
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let bf16_bytes: Vec<u8> = vals.iter().flat_map(|&v| f32_to_bf16(v)).collect();
    let mut out = [0.0f32; 5];
    dequantize(GgmlType::F32, &f32_bytes, &mut out).unwrap();
    assert_eq!(out, vals);
    dequantize(GgmlType::F16, &f16_bytes, &mut out).unwrap();
    assert_eq!(out[..4], vals[..4]);
    assert!((out[4] - 1e-7).abs() < 6e-8); // f16 subnormal spacing
    dequantize(GgmlType::BF16, &bf16_bytes, &mut out).unwrap();
    assert_eq!(out[..3], vals[..3]);
    assert_eq!(out[3], 65536.0); // 65504 rounds to the nearest bf16
    let x = [1.0f32, 1.0, 1.0, 0.0, 0.0];
    assert_eq!(dot_bytes(GgmlType::BF16, &bf16_bytes, &x).unwrap(), -1.5);
    // bf16 rounding: ties to even, NaN stays NaN.
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), [0x80, 0x3f]);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), [0x82, 0x3f]);
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
}

/// Inputs that stress quantizers: ordinary, all zero, one sign, one outlier, tiny, huge.
fn quantizer_inputs(n: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng(99);
    let mut cases = vec![
        rng.values(n, 1.0),
        rng.values(n, 1e-4),
        rng.values(n, 300.0),
        vec![0.0; n],
        rng.values(n, 1.0).iter().map(|v| v.abs() + 0.5).collect(),
        rng.values(n, 1.0).iter().map(|v| -v.abs() - 0.5).collect(),
        vec![3.25; n],
    ];
    let mut outlier = rng.values(n, 0.01);
    outlier[n / 3] = 50.0;
    cases.push(outlier);
    // Sub-blocks of very different ranges inside one super-block.
    cases.push(
        (0..n)
            .map(|i| rng.f32() * 10f32.powi((i / 32 % 8) as i32 - 4))
            .collect(),
    );
    cases
}

#[test]
fn q8_0_quantization_error_is_half_a_step() {
    for x in quantizer_inputs(256) {
        let mut blocks = vec![BlockQ8_0::zeroed(); 8];
        q8_0::quantize_row(&x, &mut blocks).unwrap();
        let y = dequantized(&blocks);
        for (b, (xs, ys)) in blocks.iter().zip(x.chunks(32).zip(y.chunks(32))) {
            let d = b.d.to_f32();
            // Codes use the unrounded scale; rounding it to f16 moves it by at most 2^-11 d
            // (2^-25 absolute for subnormal halves), which the largest code multiplies by 127.
            let f16_err = (d * 2f32.powi(-11)).max(2f32.powi(-25));
            let bound = d * 0.5 + 127.0 * f16_err + 1e-30;
            for (&a, &b) in xs.iter().zip(ys) {
                assert!((a - b).abs() <= bound, "Q8_0: {a} -> {b}, step {d}");
            }
        }
    }
    assert!(q8_0::quantize_row(&[0.0; 31], &mut [BlockQ8_0::zeroed()]).is_err());
}

#[test]
fn q4_k_quantization_error_is_half_a_step() {
    for x in quantizer_inputs(512) {
        let mut blocks = vec![BlockQ4K::zeroed(); 2];
        q4_k::quantize_row(&x, &mut blocks).unwrap();
        let y = dequantized(&blocks);
        for (b, (xs, ys)) in blocks.iter().zip(x.chunks(256).zip(y.chunks(256))) {
            let (sc, _) = k_common::unpack_scales_mins(&b.scales);
            for (j, (xs, ys)) in xs.chunks(32).zip(ys.chunks(32)).enumerate() {
                let step = b.d.to_f32() * f32::from(sc[j]);
                let range = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let bound = step * 0.5 + range * 1e-6 + 1e-30;
                for (&a, &b) in xs.iter().zip(ys) {
                    assert!((a - b).abs() <= bound, "Q4_K: {a} -> {b}, step {step}");
                }
            }
        }
        // And the step is not wasteful: the largest scale code uses (nearly) all 6 bits,
        // unless d is a subnormal half whose coarse spacing forbids it.
        let b = &blocks[0];
        let (sc, _) = k_common::unpack_scales_mins(&b.scales);
        let max_sc = sc.iter().max().copied().unwrap();
        let d_is_normal = b.d.to_f32() >= 6.1e-5;
        assert!(
            max_sc == 0 || !d_is_normal || max_sc >= 62,
            "largest scale code {max_sc} wastes range"
        );
    }
}

#[test]
fn q6_k_quantization_error_is_half_a_step() {
    for x in quantizer_inputs(512) {
        let mut blocks = vec![BlockQ6K::zeroed(); 2];
        q6_k::quantize_row(&x, &mut blocks).unwrap();
        let y = dequantized(&blocks);
        for (b, (xs, ys)) in blocks.iter().zip(x.chunks(256).zip(y.chunks(256))) {
            for (g, (xs, ys)) in xs.chunks(16).zip(ys.chunks(16)).enumerate() {
                let step = b.d.to_f32() * f32::from(b.scales[g]);
                let range = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let bound = step * 0.5 + range * 1e-6 + 1e-30;
                for (&a, &b) in xs.iter().zip(ys) {
                    assert!((a - b).abs() <= bound, "Q6_K: {a} -> {b}, step {step}");
                }
            }
        }
    }
}

#[test]
fn quantized_rms_error_is_small_on_gaussian_like_data() {
    let mut rng = Rng(5);
    let x: Vec<f32> = (0..4096)
        .map(|_| (0..4).map(|_| rng.f32()).sum::<f32>())
        .collect();
    let rms = |y: &[f32]| {
        let e: f64 = x
            .iter()
            .zip(y)
            .map(|(&a, &b)| f64::from(a - b).powi(2))
            .sum();
        let s: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
        (e / s).sqrt()
    };
    let mut q8 = vec![BlockQ8_0::zeroed(); 128];
    q8_0::quantize_row(&x, &mut q8).unwrap();
    let mut q4 = vec![BlockQ4K::zeroed(); 16];
    q4_k::quantize_row(&x, &mut q4).unwrap();
    let mut q6 = vec![BlockQ6K::zeroed(); 16];
    q6_k::quantize_row(&x, &mut q6).unwrap();
    let (e8, e4, e6) = (
        rms(&dequantized(&q8)),
        rms(&dequantized(&q4)),
        rms(&dequantized(&q6)),
    );
    assert!(e8 < 0.01, "Q8_0 relative rms error {e8}");
    assert!(e4 < 0.12, "Q4_K relative rms error {e4}");
    assert!(e6 < 0.03, "Q6_K relative rms error {e6}");
    assert!(
        e8 < e6 && e6 < e4,
        "more bits should mean less error: {e8} {e6} {e4}"
    );
}

#[test]
fn q8_k_group_sums() {
    let mut rng = Rng(3);
    let x = rng.values(256, 4.0);
    let a = BlockQ8K::quantize(&x);
    for g in 0..16 {
        let s: i32 = a.qs[16 * g..16 * (g + 1)]
            .iter()
            .map(|&q| i32::from(q))
            .sum();
        assert_eq!(i32::from(a.bsums[g]), s);
    }
    for (&v, &q) in x.iter().zip(&a.qs) {
        assert!((v - a.d * f32::from(q)).abs() <= a.d * 0.5 + 1e-6);
    }
}

#[test]
fn layouts_place_elements_where_the_format_says() {
    // Q4_K: element 32 is the high nibble of byte 0; element 64 the low nibble of byte 32.
    let mut b = BlockQ4K::zeroed();
    b.d = F16Le::from_f32(1.0);
    b.scales = k_common::pack_scales_mins(&[1; 8], &[0; 8]);
    b.qs[0] = 0x52;
    b.qs[32] = 0x07;
    let y = dequantized(&[b]);
    assert_eq!((y[0], y[32], y[64], y[96]), (2.0, 5.0, 7.0, 0.0));

    // Q6_K: element 64 takes the high nibble of ql[0] and bits 4..6 of qh[0].
    let mut b = BlockQ6K::zeroed();
    b.d = F16Le::from_f32(1.0);
    b.scales = [1; 16];
    b.ql[0] = 0x30;
    b.qh[0] = 0b0010_0000;
    let y = dequantized(&[b]);
    assert_eq!(y[64], (3 | (2 << 4)) as f32 - 32.0);
    assert_eq!(y[0], -32.0);

    // Q5_0: bit 17 of qh is the fifth bit of element 17.
    let mut b = BlockQ5_0::zeroed();
    b.d = F16Le::from_f32(1.0);
    b.qh = (1u32 << 17).to_le_bytes();
    b.qs[1] = 0x30;
    let y = dequantized(&[b]);
    assert_eq!(y[17], (3 + 16 - 16) as f32);
    assert_eq!(y[1], -16.0);

    // Q3_K: with the high bit clear a code loses 4; scale 0 is stored as 32 + s.
    let mut b = BlockQ3K::zeroed();
    b.d = F16Le::from_f32(1.0);
    b.scales[0] = 0x01; // scale 0 low bits 1, high bits 0 -> 1 - 32 = -31
    b.qs[0] = 0b11;
    b.hmask[0] = 1;
    let y = dequantized(&[b]);
    assert_eq!(y[0], -31.0 * 3.0);
    assert_eq!(y[1], -31.0 * -4.0);
}

/// `rows` random rows of `blocks_per_row` blocks of `B` (as bytes, with a row's length),
/// and `tokens` random activation rows with their 8-bit quantization for `B`.
struct RowCase<B> {
    blocks: Vec<B>,
    row_bytes: usize,
    cols: usize,
    xs: Vec<f32>,
    input: Q8Input,
}

impl<B: QuantBlock> RowCase<B> {
    fn new(
        rng: &mut Rng,
        f16_offsets: &[usize],
        (rows, blocks_per_row, tokens): (usize, usize, usize),
    ) -> Self {
        let cols = blocks_per_row * B::ELEMS;
        let blocks: Vec<B> = random_blocks(rng, rows * blocks_per_row, f16_offsets);
        let row_bytes = std::mem::size_of_val(blocks.as_slice()) / rows;
        let xs = rng.values(tokens * cols, 3.0);
        let mut input = Q8Input::new();
        assert!(input.quantize(B::TYPE, &xs, cols));
        assert_eq!(input.tokens(), tokens);
        Self {
            blocks,
            row_bytes,
            cols,
            xs,
            input,
        }
    }

    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.blocks)
    }
}

/// The matmul row kernels (`dot_rows_q8`: AVX2 where the CPU has it) against the portable
/// integer dot (equal integer sums, so only f32 rounding differs) and against the f64 dot
/// of the dequantized weights with the unquantized activations, within the activation
/// quantization bound: each activation moves by at most half its block's step
/// `max|x_block| / 127`, so `|err| <= sum_blocks (step / 2) * sum |w_i|` (plus rounding).
fn check_row_kernels<B: QuantBlock>(f16_offsets: &[usize]) {
    let mut rng = Rng(B::TYPE.id() as u64 + 101);
    let elems = <B::Activation as ActivationBlock>::ELEMS;
    let (rows, blocks_per_row, tokens) = (5, 3, 3);
    for _ in 0..10 {
        let case = RowCase::<B>::new(&mut rng, f16_offsets, (rows, blocks_per_row, tokens));
        let (bytes, row_bytes, cols) = (case.bytes(), case.row_bytes, case.cols);
        let (xs, input) = (&case.xs, &case.input);
        let w = dequantized(&case.blocks);
        let mut fast = vec![0f32; rows * tokens];
        let mut portable = vec![0f32; rows * tokens];
        dot_rows_q8(
            B::TYPE,
            bytes,
            row_bytes,
            0..rows,
            input,
            0..tokens,
            &mut fast,
            tokens,
        );
        dot_rows_q8_portable(
            B::TYPE,
            bytes,
            row_bytes,
            0..rows,
            input,
            0..tokens,
            &mut portable,
            tokens,
        );
        // A sub-range lands at the same values.
        let mut part = vec![0f32; 2];
        dot_rows_q8(B::TYPE, bytes, row_bytes, 2..4, input, 1..2, &mut part, 1);
        assert_eq!(part, [fast[2 * tokens + 1], fast[3 * tokens + 1]]);
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            for t in 0..tokens {
                let x = &xs[t * cols..(t + 1) * cols];
                let magnitude: f64 = wr
                    .iter()
                    .zip(x)
                    .map(|(&w, &x)| (f64::from(w) * f64::from(x)).abs())
                    .sum();
                let exact: f64 = wr
                    .iter()
                    .zip(x)
                    .map(|(&w, &x)| f64::from(w) * f64::from(x))
                    .sum();
                let (f, p) = (
                    f64::from(fast[r * tokens + t]),
                    f64::from(portable[r * tokens + t]),
                );
                assert!(
                    (f - p).abs() <= 1e-5 * magnitude + 1e-6,
                    "{}: simd {f} vs portable {p}",
                    B::TYPE
                );
                let bound: f64 = wr
                    .chunks_exact(elems)
                    .zip(x.chunks_exact(elems))
                    .map(|(w, x)| {
                        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let wsum: f64 = w.iter().map(|&w| f64::from(w).abs()).sum();
                        // The Q8_0 scale is stored as f16: allow its rounding too.
                        f64::from(amax) / 127.0 * 0.5 * wsum * (1.0 + 2e-3)
                    })
                    .sum();
                assert!(
                    (f - exact).abs() <= bound + 1e-4 * magnitude + 1e-6,
                    "{}: q8 row dot {f} vs f32 {exact} (bound {bound})",
                    B::TYPE
                );
            }
        }
    }
}

#[test]
fn row_kernels_match_portable_and_f32_within_bound() {
    for_each_block_type!(check_row_kernels);
}

#[test]
fn row_kernels_refuse_mismatched_inputs() {
    let mut input = Q8Input::new();
    assert!(!input.quantize(GgmlType::F32, &[0.0; 32], 32));
    assert!(!input.quantize(GgmlType::Q4_K, &[0.0; 32], 32));
    assert!(!input.quantize(GgmlType::Q8_0, &[0.0; 48], 48));
    assert!(input.quantize(GgmlType::Q8_0, &[0.0; 64], 32));
    assert_eq!(input.tokens(), 2);
    assert!(has_q8_path(GgmlType::Q6_K) && !has_q8_path(GgmlType::BF16));
}

/// Batch invariance of the row kernels: a token's dot products have the same bits whether it
/// is dotted alone or in a pass with other tokens (any count, any offset), so a request's
/// logits do not depend on what else is in its batch or on how its prompt was chunked.
fn check_batch_invariance<B: QuantBlock>(f16_offsets: &[usize]) {
    let mut rng = Rng(B::TYPE.id() as u64 + 7);
    // 37 tokens: tiles of one to five eight-token groups, so both the kernels that decode
    // each block as they go (few groups) and those that decode a row once (many) run.
    let (rows, tokens) = (5, 37);
    let case = RowCase::<B>::new(&mut rng, f16_offsets, (rows, 2, tokens));
    let (bytes, row_bytes, input) = (case.bytes(), case.row_bytes, &case.input);
    let dots = |rows: std::ops::Range<usize>, range: std::ops::Range<usize>| {
        let n = range.len();
        let mut out = vec![0f32; rows.len() * n];
        dot_rows_q8(B::TYPE, bytes, row_bytes, rows, input, range, &mut out, n);
        out
    };
    // Each (row, token) alone, then in tiles of rows and tokens of every alignment.
    let alone: Vec<Vec<f32>> = (0..rows)
        .map(|r| (0..tokens).map(|t| dots(r..r + 1, t..t + 1)[0]).collect())
        .collect();
    let row_ranges = [0..rows, 1..rows, 1..3, 2..5, 3..4];
    let token_ranges = [
        0..tokens,
        1..tokens,
        2..9,
        3..7,
        5..6,
        0..8,
        3..35,
        8..tokens,
    ];
    for rr in row_ranges {
        for range in token_ranges.clone() {
            let n = range.len();
            let together = dots(rr.clone(), range.clone());
            for (i, r) in rr.clone().enumerate() {
                for (j, t) in range.clone().enumerate() {
                    assert_eq!(
                        together[i * n + j].to_bits(),
                        alone[r][t].to_bits(),
                        "{}: row {r} token {t} in rows {rr:?} tokens {range:?}",
                        B::TYPE
                    );
                }
            }
        }
    }
}

#[test]
fn row_kernels_are_batch_invariant() {
    for_each_block_type!(check_batch_invariance);
}

/// One architecture's `dot_rows_with`: its kernels with a given form of the byte dot.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
type DotRowsWith<D> = fn(
    D,
    GgmlType,
    &[u8],
    usize,
    std::ops::Range<usize>,
    &Q8Input,
    std::ops::Range<usize>,
    &mut [f32],
    usize,
) -> bool;

/// The bits each form of the byte dot gives on one random case of `B` (5 rows, 9 tokens):
/// `None` for a form with no kernel for `B`. Every value is finite.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn bits_by_dot_form<B: QuantBlock, D: Copy>(
    f16_offsets: &[usize],
    with: DotRowsWith<D>,
    forms: &[D],
) -> Vec<Option<Vec<u32>>> {
    let mut rng = Rng(B::TYPE.id() as u64 + 13);
    let (rows, tokens) = (5, 9);
    let case = RowCase::<B>::new(&mut rng, f16_offsets, (rows, 3, tokens));
    let (bytes, row_bytes, input) = (case.bytes(), case.row_bytes, &case.input);
    forms
        .iter()
        .map(|&dot| {
            let mut out = vec![f32::NAN; rows * tokens];
            let done = with(
                dot,
                B::TYPE,
                bytes,
                row_bytes,
                0..rows,
                input,
                0..tokens,
                &mut out,
                tokens,
            );
            assert!(!done || out.iter().all(|x| x.is_finite()), "{:?}", B::TYPE);
            done.then(|| out.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

/// The VNNI kernels (either encoding of `vpdpbusd` this CPU has) give the AVX2 kernels'
/// bits: the same four products summed a lane, then the same f32 steps. Formats without a
/// VNNI kernel take the AVX2 one either way.
#[cfg(target_arch = "x86_64")]
fn check_vnni_equals_avx2<B: QuantBlock>(f16_offsets: &[usize]) {
    use super::x86::Dot;
    let forms: Vec<Dot> = [Dot::Avx2, Dot::AvxVnni, Dot::Avx512Vnni]
        .into_iter()
        .filter(|d| d.runs_here())
        .collect();
    let bits = bits_by_dot_form::<B, _>(f16_offsets, super::x86::dot_rows_with, &forms);
    for (dot, b) in forms.iter().zip(&bits).skip(1) {
        assert_eq!(&bits[0], b, "{:?} {dot:?}", B::TYPE);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn vnni_kernels_equal_the_avx2_ones() {
    use super::x86::Dot;
    if !super::x86::available()
        || ![Dot::AvxVnni, Dot::Avx512Vnni]
            .iter()
            .any(|d| d.runs_here())
    {
        eprintln!("skipped: this CPU has no VNNI");
        return;
    }
    for_each_block_type!(check_vnni_equals_avx2);
}

/// The vectorized activation quantization gives the scalar one's bits: scales and codes,
/// with ties at .5, zeros, infinities and NaN in the blocks.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn vector_activation_quantization_equals_scalar() {
    #[cfg(target_arch = "x86_64")]
    if !super::x86::available() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    #[cfg(target_arch = "x86_64")]
    let quantize = |x: &[f32], qs: &mut [i8]| {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        unsafe { super::x86_acts::quantize(x, qs) }
    };
    #[cfg(target_arch = "aarch64")]
    let quantize = super::neon_acts::quantize;
    let mut rng = Rng(99);
    for case in 0..200 {
        let mut x = rng.values(256, 4.0);
        match case % 5 {
            // Values whose codes land exactly on halves: amax 127 makes id 1.
            0 => {
                x.iter_mut().for_each(|v| *v = (*v * 16.0).round() * 0.5);
                x[0] = 127.0;
            }
            1 => x[3] = f32::NAN,
            2 => x[7] = f32::INFINITY,
            3 => x.iter_mut().for_each(|v| *v = 0.0),
            _ => {}
        }
        let mut qs = vec![0i8; 256];
        let d = quantize(&x, &mut qs);
        let k = <BlockQ8K as ActivationBlock>::quantize(&x);
        assert_eq!(d.to_bits(), k.d.to_bits(), "case {case}");
        assert_eq!(qs, k.qs.to_vec(), "case {case}");
        for (b, x) in x.chunks_exact(32).enumerate() {
            let mut qs = [0i8; 32];
            let d = quantize(x, &mut qs);
            let s = BlockQ8_0::quantize(x);
            assert_eq!(
                (F16Le::from_f32(d), qs),
                (s.d, s.qs),
                "case {case} block {b}"
            );
        }
    }
}

/// The x86 one-pass Q8_0 quantization of a whole input (blocks, widened scales, scales
/// times code sums) gives the scalar quantizer's bits, scales that round to half
/// subnormals and past half's range among them.
#[cfg(target_arch = "x86_64")]
#[test]
fn q8_0_blocks_in_one_pass_equal_scalar() {
    if !super::x86::available() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let mut rng = Rng(7);
    for (case, scale) in [1.0f32, 4.0, 1e-6, 3e-5, 1e7, 0.0].into_iter().enumerate() {
        let mut x = rng.values(32 * 9, scale);
        x[40] = f32::NAN;
        x[100] = (x[100] * 2.0).round() * 0.5;
        let (mut blocks, mut d, mut dsum) = (vec![], vec![], vec![]);
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        unsafe { super::x86_acts::quantize_q8_0_blocks(&x, &mut blocks, &mut d, &mut dsum) };
        assert_eq!(blocks.len(), 9);
        for (b, x) in x.chunks_exact(32).enumerate() {
            let s = BlockQ8_0::quantize(x);
            assert_eq!(
                (blocks[b].d, blocks[b].qs),
                (s.d, s.qs),
                "case {case} block {b}"
            );
            let sd = s.d.to_f32();
            let sum: i32 = s.qs.iter().map(|&q| i32::from(q)).sum();
            assert_eq!(d[b].to_bits(), sd.to_bits(), "case {case} block {b}");
            assert_eq!(
                dsum[b].to_bits(),
                (sd * sum as f32).to_bits(),
                "case {case} block {b}"
            );
        }
    }
}

/// The NEON kernels' two forms of the byte dot (`sdot`, and `smull` + `sadalp` for CPUs
/// without the dot-product extension) give the same bits: a block's lanes are summed to one
/// integer before any f32 step. Every format with a NEON kernel takes it (the generic row
/// tests above then check the NEON path, not the portable one).
#[cfg(target_arch = "aarch64")]
fn check_dotprod_equals_neon<B: QuantBlock>(f16_offsets: &[usize]) {
    use super::neon::Dot;
    let with_kernel = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];
    let forms: Vec<Dot> = [Dot::Neon, Dot::DotProd]
        .into_iter()
        .filter(|d| d.runs_here())
        .collect();
    let bits = bits_by_dot_form::<B, _>(f16_offsets, super::neon::dot_rows_with, &forms);
    assert_eq!(
        bits[0].is_some(),
        with_kernel.contains(&B::TYPE),
        "{:?}: a NEON kernel where expected",
        B::TYPE
    );
    if let [neon, dotprod] = &bits[..] {
        assert_eq!(neon, dotprod, "{:?}", B::TYPE);
    }
}

#[cfg(target_arch = "aarch64")]
#[test]
fn dotprod_kernels_equal_the_neon_ones() {
    if !super::neon::Dot::DotProd.runs_here() {
        // CI sets this where it runs the tests on an emulated CPU with the extension.
        assert!(
            std::env::var("STRATA_REQUIRE_DOTPROD").is_err(),
            "STRATA_REQUIRE_DOTPROD is set but this CPU has no sdot"
        );
        eprintln!("dotprod_kernels_equal_the_neon_ones: this CPU has no sdot; NEON alone checked");
    }
    for_each_block_type!(check_dotprod_equals_neon);
}
