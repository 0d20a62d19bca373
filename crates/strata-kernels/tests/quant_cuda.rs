//! GGUF block formats kept on the GPU (`CudaQuantMatrix::blocks`, `kernels/quant.cu`)
//! against the host decoder of `strata-weights` (the definition of each format): the
//! decoded values bit for bit (lookups), and products through the GEMV (1 to 32 rows, every
//! tile) and through the decoded path (more rows; a weight decoded in two slices), in the
//! exact mode and the bf16 mode, against f64 products of the host-decoded weights. The bf16
//! mode's GEMV on 8-bit x is checked against the same product with x quantized on the host
//! as the kernel quantizes it. An ignored test times that GEMV against the f32 one.
//!
//! bitsandbytes 4-bit matrices (`CudaQuantMatrix::bnb4`) are checked the same way against
//! `strata_weights::bnb::Bnb4::decode`, for each rounding of the values (f32, bf16, f16).
//!
//! Random bytes make the blocks, so every code, scale and min bit pattern occurs; only the
//! f16 super-scales are drawn from a bounded range (a random f16 can be inf or NaN).
//! Without a GPU each test prints `skipped: no GPU` and passes (`STRATA_REQUIRE_GPU=1` makes
//! that a failure).
#![cfg(feature = "cuda")]

use std::sync::OnceLock;

use half::f16;
use strata_gguf::GgmlType;
use strata_kernels::cuda::{
    BlockFormat, Bnb4Parts, CudaBackend, CudaQuantMatrix, DEQUANT_SLICE_VALUES,
};
use strata_kernels::gpu_test::gpu_or_skip;
use strata_kernels::{Backend, DType, HostSlice};
use strata_weights::quant;

fn gpu() -> Option<&'static CudaBackend> {
    static GPU: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
    gpu_or_skip(
        GPU.get_or_init(|| CudaBackend::new(0).map_err(|e| e.to_string()))
            .as_ref(),
    )
}

/// A small deterministic generator (xorshift), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn f16_bytes(&mut self, scale: f32) -> [u8; 2] {
        f16::from_f32(self.unit() * scale).to_le_bytes()
    }
}

/// Byte offsets of a block's f16 super-scales (`d`, and `dmin` for Q4_K / Q5_K).
fn f16_fields(f: BlockFormat) -> &'static [usize] {
    match f {
        BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q8_0 => &[0],
        BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
        BlockFormat::Q6K => &[208],
        BlockFormat::Bnb4 => &[],
    }
}

/// `rows x cols` values of format `f` as random blocks, and the host decoder's values.
fn random_blocks(f: BlockFormat, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng(seed | 1);
    let blocks = rows * cols / f.block_values();
    let mut bytes = vec![0u8; blocks * f.block_bytes()];
    for b in bytes.chunks_exact_mut(f.block_bytes()) {
        for v in b.iter_mut() {
            *v = rng.next() as u8;
        }
        for &at in f16_fields(f) {
            b[at..at + 2].copy_from_slice(&rng.f16_bytes(0.02));
        }
    }
    let ty = GgmlType::from_name(f.ggml_name()).expect("a ggml type");
    let row_bytes = bytes.len() / rows;
    let mut values = vec![0f32; rows * cols];
    for (r, out) in values.chunks_exact_mut(cols).enumerate() {
        quant::dequantize(ty, &bytes[r * row_bytes..(r + 1) * row_bytes], out).unwrap();
    }
    (bytes, values)
}

fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed | 1);
    (0..n).map(|_| rng.unit()).collect()
}

fn bf16_round(v: f32) -> f64 {
    f64::from(half::bf16::from_f32(v).to_f32())
}

/// Checks `out[t, i]` (the columns `cols` of it) against f64 products of `x` and the
/// decoded weight, each term rounded by `round` first; the bound is `tol * sum |w x|`.
#[allow(clippy::too_many_arguments)]
fn check_product(
    what: &str,
    out: &[f32],
    x: &[f32],
    w: &[f32],
    (t, k, n): (usize, usize, usize),
    cols: impl Iterator<Item = usize> + Clone,
    round: fn(f32) -> f64,
    tol: f64,
) {
    for r in 0..t {
        for i in cols.clone() {
            let (mut want, mut mag) = (0f64, 0f64);
            for j in 0..k {
                let p = round(x[r * k + j]) * round(w[i * k + j]);
                want += p;
                mag += p.abs();
            }
            let got = f64::from(out[r * n + i]);
            assert!(
                (got - want).abs() <= tol * mag + 1e-6,
                "{what}: out[{r}, {i}] = {got}, want {want} (sum |w x| {mag})"
            );
        }
    }
}

/// `w`'s product with `x` (`t` rows) in the exact mode (`exact`) and in the bf16 mode
/// (`bf16`), each against f64 products of the decoded weight `dense`: the bf16 mode's
/// decoded path (past the GEMV's rows) rounds x and the weight to bf16; its f32 GEMV keeps x
/// in f32 (8-bit x has a test of its own).
fn check_both_modes(
    what: &str,
    (exact, bf16): (&CudaBackend, &CudaBackend),
    w: &CudaQuantMatrix,
    x: &[f32],
    dense: &[f32],
    (t, k, n): (usize, usize, usize),
) {
    let out = matmul(exact, w, x, t);
    check_product(
        &format!("{what} exact"),
        &out,
        x,
        dense,
        (t, k, n),
        0..n,
        f64::from,
        3e-5,
    );
    let round = if t > bf16.quant_gemv_max_rows() {
        bf16_round
    } else {
        f64::from
    };
    let out = matmul(bf16, w, x, t);
    check_product(
        &format!("{what} bf16 mode"),
        &out,
        x,
        dense,
        (t, k, n),
        0..n,
        round,
        3e-5,
    );
}

fn matmul(b: &CudaBackend, w: &CudaQuantMatrix, x: &[f32], t: usize) -> Vec<f32> {
    use strata_kernels::MatrixShape;
    let xd = b.upload(HostSlice::F32(x)).unwrap();
    let mut out = b.zeros(t * w.rows(), DType::F32).unwrap();
    b.matmul_quant(&xd, w, &mut out).unwrap();
    b.download(&out).unwrap()
}

#[test]
fn decoded_blocks_equal_the_host_decoder_bit_for_bit() {
    let Some(b) = gpu() else { return };
    for (i, f) in BlockFormat::ALL.into_iter().enumerate() {
        let (rows, cols) = (19, 2 * 256);
        let (bytes, want) = random_blocks(f, rows, cols, 11 + i as u64);
        let w = CudaQuantMatrix::blocks(b, f, rows, cols, &bytes).unwrap();
        assert_eq!(w.device_bytes(), bytes.len());
        // A lookup of every row, in a shuffled order and with repeats, at scale 1.
        let ids: Vec<u32> = (0..rows as u32).rev().chain([3, 3, 0]).collect();
        let mut out = b.zeros(ids.len() * cols, DType::F32).unwrap();
        b.embedding_quant(&ids, &w, 1.0, &mut out).unwrap();
        let got = b.download(&out).unwrap();
        for (n, &id) in ids.iter().enumerate() {
            let (g, e) = (
                &got[n * cols..(n + 1) * cols],
                &want[id as usize * cols..(id as usize + 1) * cols],
            );
            for (j, (g, e)) in g.iter().zip(e).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{f:?} row {id} value {j}: {g} vs {e}"
                );
            }
        }
        // The scale multiplies each decoded value once, in f32.
        let mut out = b.zeros(cols, DType::F32).unwrap();
        b.embedding_quant(&[5], &w, 3.5, &mut out).unwrap();
        let got = b.download(&out).unwrap();
        for (g, e) in got.iter().zip(&want[5 * cols..6 * cols]) {
            assert_eq!(g.to_bits(), (e * 3.5).to_bits(), "{f:?} scaled");
        }
        // An id past the table is an error, not a read out of bounds.
        assert!(b
            .embedding_quant(&[rows as u32], &w, 1.0, &mut out)
            .is_err());
    }
}

#[test]
fn block_products_match_the_decoded_weights_at_every_row_count() {
    let Some(b) = gpu() else { return };
    // Whatever STRATA_QUANT_DP4A says: x stays f32 here (8-bit x has its own test below).
    let bf16 = b.clone().with_bf16_gemm(true).with_quant_dp4a(false);
    let b = &b.clone().with_quant_dp4a(false);
    for (i, f) in BlockFormat::ALL.into_iter().enumerate() {
        // 37 features: not a whole number of the GEMV's 4-warp blocks.
        let (n, k) = (37, 3 * 256);
        let (bytes, w) = random_blocks(f, n, k, 100 + i as u64);
        let m = CudaQuantMatrix::blocks(b, f, n, k, &bytes).unwrap();
        for t in [1, 2, 3, 5, 8, 9, 16, 17, 32, 33, 70] {
            let x = random_vec(t * k, 7 * t as u64 + i as u64);
            check_both_modes(&format!("{f:?} t={t}"), (b, &bf16), &m, &x, &w, (t, k, n));
        }
    }
}

#[test]
fn long_rows_take_several_runs_of_x() {
    let Some(b) = gpu() else { return };
    // 144 sub-blocks: at every tile the GEMV stages x in more than one run, the last partial.
    let k = 18 * 256;
    for (i, f) in BlockFormat::ALL.into_iter().enumerate() {
        let n = 37;
        let (bytes, w) = random_blocks(f, n, k, 300 + i as u64);
        let m = CudaQuantMatrix::blocks(b, f, n, k, &bytes).unwrap();
        for t in [1, 2, 3, 8] {
            let x = random_vec(t * k, 11 * t as u64 + i as u64);
            let out = matmul(b, &m, &x, t);
            let what = format!("{f:?} k={k} t={t}");
            check_product(&what, &out, &x, &w, (t, k, n), 0..n, f64::from, 3e-5);
        }
    }
}

#[test]
fn a_large_weight_is_decoded_in_slices() {
    let Some(b) = gpu() else { return };
    let f = BlockFormat::Q8_0;
    let k = 4096;
    // Two slices: a whole one and 37 rows.
    let n = DEQUANT_SLICE_VALUES / k + 37;
    let (bytes, w) = random_blocks(f, n, k, 5);
    let m = CudaQuantMatrix::blocks(b, f, n, k, &bytes).unwrap();
    let t = 40;
    let x = random_vec(t * k, 9);
    let out = matmul(b, &m, &x, t);
    // Columns from both slices and the seam between them.
    let seam = DEQUANT_SLICE_VALUES / k;
    let cols = (0..n).step_by(997).chain(seam - 2..seam + 2).chain([n - 1]);
    check_product("sliced", &out, &x, &w, (t, k, n), cols, f64::from, 3e-5);
}

#[test]
fn bad_block_uploads_are_errors() {
    let Some(b) = gpu() else { return };
    // 100 values are not whole Q4_K blocks; 3 rows need 3 x 144 bytes.
    assert!(CudaQuantMatrix::blocks(b, BlockFormat::Q4K, 3, 100, &[0; 432]).is_err());
    assert!(CudaQuantMatrix::blocks(b, BlockFormat::Q4K, 3, 256, &[0; 431]).is_err());
    assert!(CudaQuantMatrix::blocks(b, BlockFormat::Q4K, 3, 256, &[0; 432]).is_ok());
}

/// x as `quant_x8` quantizes it, dequantized: per 32 values d = max |x| / 127 and
/// code = round-to-even(x * (1 / d)), the same f32 operations, then d * code in f64.
fn x8_dequantized(x: &[f32]) -> Vec<f64> {
    x.chunks_exact(32)
        .flat_map(|b| {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            b.iter()
                .map(move |v| f64::from(d) * f64::from((v * id).round_ties_even()))
        })
        .collect()
}

/// `matmul` into an output poisoned with NaN, so an unwritten value fails every check.
fn matmul_poisoned(b: &CudaBackend, w: &CudaQuantMatrix, x: &[f32], t: usize) -> Vec<f32> {
    use strata_kernels::MatrixShape;
    let xd = b.upload(HostSlice::F32(x)).unwrap();
    let mut out = b
        .upload(HostSlice::F32(&vec![f32::NAN; t * w.rows()]))
        .unwrap();
    b.matmul_quant(&xd, w, &mut out).unwrap();
    b.download(&out).unwrap()
}

/// The bf16 mode's products over 8-bit x (`kernels/quant_dp4a.cu`), every format and tile,
/// at rows that take one and several lanes' runs: against the f64 product of the decoded
/// weights with x quantized and dequantized as the kernel does (within f32 rounding:
/// 1e-5 of sum |w x8|), and, reported, against the product with x itself.
#[test]
fn dp4a_products_match_the_8_bit_x_reference() {
    let Some(b) = gpu() else { return };
    // The GEMV at every row count its tiles serve, whatever the default bound.
    let fast = b
        .clone()
        .with_bf16_gemm(true)
        .with_quant_dp4a(true)
        .with_quant_gemv_max_rows(32);
    assert!(fast.quant_dp4a());
    for (i, f) in BlockFormat::ALL.into_iter().enumerate() {
        let mut worst_x = 0f64;
        for (k, rows) in [
            (3 * 256, &[1, 2, 3, 5, 8, 9, 16, 17, 32][..]),
            (18 * 256, &[1, 4, 8]),
        ] {
            let n = 37;
            let (bytes, w) = random_blocks(f, n, k, 500 + i as u64 + k as u64);
            let m = CudaQuantMatrix::blocks(b, f, n, k, &bytes).unwrap();
            for &t in rows {
                let mut x = random_vec(t * k, 13 * t as u64 + i as u64 + k as u64);
                // A block of zeros (scale 0) and one of a single large value.
                x[32..64].fill(0.0);
                x[64] = 4.0;
                let x8 = x8_dequantized(&x);
                let out = matmul_poisoned(&fast, &m, &x, t);
                let (mut num, mut den) = (0f64, 0f64);
                for r in 0..t {
                    for c in 0..n {
                        let (mut want, mut mag, mut exact) = (0f64, 0f64, 0f64);
                        for j in 0..k {
                            let wv = f64::from(w[c * k + j]);
                            want += wv * x8[r * k + j];
                            mag += (wv * x8[r * k + j]).abs();
                            exact += wv * f64::from(x[r * k + j]);
                        }
                        let got = f64::from(out[r * n + c]);
                        assert!(
                            (got - want).abs() <= 1e-5 * mag + 1e-6,
                            "{f:?} k={k} t={t}: out[{r}, {c}] = {got}, want {want} (sum |w x8| {mag})"
                        );
                        num += (got - exact).powi(2);
                        den += exact.powi(2);
                    }
                }
                worst_x = worst_x.max((num / den).sqrt());
            }
        }
        eprintln!("{f:?}: |out - W x| / |W x| at most {worst_x:.2e} (x itself, not 8-bit x)");
        assert!(
            worst_x < 3e-2,
            "{f:?}: 8-bit x {worst_x:.2e} from the f32 product"
        );
    }
}

/// Blocks of random codes with f16 scales in range, for timing (no host decode).
fn timing_blocks(f: BlockFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut bytes = vec![0u8; rows * cols / f.block_values() * f.block_bytes()];
    for b in bytes.chunks_exact_mut(f.block_bytes()) {
        b.iter_mut().for_each(|v| *v = rng.next() as u8);
        for &at in f16_fields(f) {
            b[at..at + 2].copy_from_slice(&rng.f16_bytes(0.02));
        }
    }
    bytes
}

/// Microseconds a product: graphs of 64 products cycling over copies of the weight that
/// together outgrow L2, the median of 7 replays after 2 warm-up ones.
fn time_products(b: &CudaBackend, mats: &[CudaQuantMatrix], x: &[f32], t: usize) -> f64 {
    use strata_kernels::MatrixShape;
    const PRODUCTS: usize = 64;
    let xd = b.upload(HostSlice::F32(x)).unwrap();
    let mut out = b.zeros(t * mats[0].rows(), DType::F32).unwrap();
    b.matmul_quant(&xd, &mats[0], &mut out).unwrap();
    b.synchronize().unwrap();
    b.begin_capture().unwrap();
    for i in 0..PRODUCTS {
        b.matmul_quant(&xd, &mats[i % mats.len()], &mut out)
            .unwrap();
    }
    let g = b.end_capture().unwrap();
    let mut times = Vec::new();
    for rep in 0..9 {
        b.synchronize().unwrap();
        let t0 = std::time::Instant::now();
        b.launch_graph(&g).unwrap();
        b.synchronize().unwrap();
        if rep >= 2 {
            times.push(t0.elapsed().as_secs_f64() * 1e6 / PRODUCTS as f64);
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The bf16 mode's GEMV with 8-bit x against the f32-decoding one on E2B's shapes:
/// `cargo test -p strata-kernels --features cuda --test quant_cuda -- --ignored --nocapture`.
#[test]
#[ignore = "timings, for a GPU run by hand"]
fn dp4a_against_f32_decoding_timings() {
    let Some(b) = gpu() else { return };
    let new = b.clone().with_bf16_gemm(true).with_quant_dp4a(true);
    let old = new.clone().with_quant_dp4a(false);
    let copy = b.measure_copy_bandwidth(1 << 30).unwrap();
    println!("{}; copy bandwidth {:.0} GB/s", b.device_name(), copy / 1e9);
    println!(
        "| weight | format | rows | f32 GEMV us | 8-bit x us | speed-up | GB/s f32 | GB/s 8-bit |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let shapes = [
        ("q 2048x1536", 2048, 1536),
        ("gate 6144x1536", 6144, 1536),
        ("down 1536x6144", 1536, 6144),
    ];
    for (name, n, k) in shapes {
        for f in [BlockFormat::Q4K, BlockFormat::Q6K, BlockFormat::Q8_0] {
            let bytes = timing_blocks(f, n, k, n as u64 + k as u64);
            let copies = (192usize << 20).div_ceil(bytes.len()).clamp(2, 64);
            let mats: Vec<_> = (0..copies)
                .map(|_| CudaQuantMatrix::blocks(b, f, n, k, &bytes).unwrap())
                .collect();
            for t in [1, 2, 4, 8, 16, 32] {
                let x = random_vec(t * k, t as u64);
                let (us_old, us_new) = (
                    time_products(&old, &mats, &x, t),
                    time_products(&new, &mats, &x, t),
                );
                let gbs = |us: f64| bytes.len() as f64 / us / 1e3;
                println!(
                    "| {name} | {} | {t} | {us_old:.2} | {us_new:.2} | {:.2}x | {:.0} | {:.0} |",
                    f.ggml_name(),
                    us_old / us_new,
                    gbs(us_old),
                    gbs(us_new)
                );
            }
        }
    }
}

/// A random bitsandbytes 4-bit matrix (random map, codes and absmax values; blocks of 64
/// that run across rows where `cols` is not a multiple of 64), rounded to `ty`.
fn random_bnb4(rows: usize, cols: usize, ty: GgmlType, seed: u64) -> strata_weights::bnb::Bnb4 {
    let mut rng = Rng(seed);
    let n = rows * cols;
    let codes: Vec<u8> = (0..n / 2).map(|_| rng.next() as u8).collect();
    let absmax: Vec<f32> = (0..n.div_ceil(64))
        .map(|_| rng.unit().abs() * 3.0)
        .collect();
    let map: [f32; 16] = std::array::from_fn(|_| rng.unit());
    strata_weights::bnb::Bnb4::new([rows, cols], ty, 64, codes, absmax, map).unwrap()
}

fn upload_bnb4(b: &CudaBackend, w: &strata_weights::bnb::Bnb4) -> CudaQuantMatrix {
    let round_to = match w.ty {
        GgmlType::BF16 => DType::BF16,
        GgmlType::F16 => DType::F16,
        _ => DType::F32,
    };
    let parts = Bnb4Parts {
        rows: w.rows(),
        cols: w.cols(),
        blocksize: w.blocksize(),
        codes: w.codes(),
        absmax: w.absmax(),
        quant_map: w.quant_map(),
        round_to,
    };
    CudaQuantMatrix::bnb4(b, parts).unwrap()
}

#[test]
fn bnb4_values_equal_the_host_decoder_bit_for_bit() {
    let Some(b) = gpu() else { return };
    for (i, ty) in [GgmlType::F32, GgmlType::BF16, GgmlType::F16]
        .into_iter()
        .enumerate()
    {
        // 96 columns: blocks of 64 run across rows.
        let (rows, cols) = (13, 96);
        let w = random_bnb4(rows, cols, ty, 31 + i as u64);
        let mut want = vec![0f32; rows * cols];
        w.decode(0, &mut want);
        let m = upload_bnb4(b, &w);
        assert_eq!(m.format(), Some(BlockFormat::Bnb4));
        assert_eq!(m.device_bytes(), rows * (68 + 20 * cols / 32));
        let ids: Vec<u32> = (0..rows as u32).rev().chain([2, 2]).collect();
        let mut out = b.zeros(ids.len() * cols, DType::F32).unwrap();
        b.embedding_quant(&ids, &m, 1.0, &mut out).unwrap();
        let got = b.download(&out).unwrap();
        for (n, &id) in ids.iter().enumerate() {
            for j in 0..cols {
                let (g, e) = (got[n * cols + j], want[id as usize * cols + j]);
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{ty} row {id} value {j}: {g} vs {e}"
                );
            }
        }
    }
}

#[test]
fn bnb4_products_match_the_decoded_weights_at_every_row_count() {
    let Some(b) = gpu() else { return };
    let bf16 = b.clone().with_bf16_gemm(true);
    let b = &b.clone().with_quant_dp4a(false);
    for (i, ty) in [GgmlType::F32, GgmlType::BF16, GgmlType::F16]
        .into_iter()
        .enumerate()
    {
        // 37 features; 4,160 columns take two runs of x at one row.
        for (n, k) in [(37, 3 * 256), (37, 4160)] {
            let w = random_bnb4(n, k, ty, 200 + i as u64);
            let mut dense = vec![0f32; n * k];
            w.decode(0, &mut dense);
            let m = upload_bnb4(b, &w);
            for t in [1, 2, 3, 5, 8, 9, 33, 70] {
                let x = random_vec(t * k, 3 * t as u64 + i as u64);
                // In the bf16 mode the f32 GEMV too: looked-up codes have no 8-bit-x form.
                let what = format!("bnb4 {ty} k={k} t={t}");
                check_both_modes(&what, (b, &bf16), &m, &x, &dense, (t, k, n));
            }
        }
    }
}

#[test]
fn bnb4_uploads_that_do_not_fit_are_errors() {
    let Some(b) = gpu() else { return };
    let w = random_bnb4(2, 64, GgmlType::F32, 1);
    let parts = |cols, blocksize, codes: &'static [u8]| Bnb4Parts {
        rows: 2,
        cols,
        blocksize,
        codes,
        absmax: &[1.0; 2],
        quant_map: w.quant_map(),
        round_to: DType::F32,
    };
    static CODES: [u8; 64] = [0; 64];
    assert!(CudaQuantMatrix::bnb4(b, parts(64, 64, &CODES[..64])).is_ok());
    // Rows of 48 values are not whole 32-value runs; blocks of 16 neither; too few codes.
    assert!(CudaQuantMatrix::bnb4(b, parts(48, 64, &CODES[..48])).is_err());
    assert!(CudaQuantMatrix::bnb4(b, parts(64, 16, &CODES[..64])).is_err());
    assert!(CudaQuantMatrix::bnb4(b, parts(64, 64, &CODES[..63])).is_err());
}
