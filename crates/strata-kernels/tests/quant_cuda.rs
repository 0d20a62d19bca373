//! GGUF block formats kept on the GPU (`CudaQuantMatrix::blocks`, `kernels/quant.cu`)
//! against the host decoder of `strata-weights` (the definition of each format): the
//! decoded values bit for bit (lookups), and products through the GEMV (1 to 32 rows, every
//! tile) and through the decoded path (more rows; a weight decoded in two slices), in the
//! exact mode and the bf16 mode, against f64 products of the host-decoded weights.
//!
//! Random bytes make the blocks, so every code, scale and min bit pattern occurs; only the
//! f16 super-scales are drawn from a bounded range (a random f16 can be inf or NaN).
//! Without a GPU each test prints `skipped: no GPU` and passes (`STRATA_REQUIRE_GPU=1` makes
//! that a failure).
#![cfg(feature = "cuda")]

use std::sync::OnceLock;

use half::f16;
use strata_gguf::GgmlType;
use strata_kernels::cuda::{BlockFormat, CudaBackend, CudaQuantMatrix, DEQUANT_SLICE_VALUES};
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
    let bf16 = b.clone().with_bf16_gemm(true);
    for (i, f) in BlockFormat::ALL.into_iter().enumerate() {
        // 37 features: not a whole number of the GEMV's 4-warp blocks.
        let (n, k) = (37, 3 * 256);
        let (bytes, w) = random_blocks(f, n, k, 100 + i as u64);
        let m = CudaQuantMatrix::blocks(b, f, n, k, &bytes).unwrap();
        for t in [1, 2, 3, 5, 8, 9, 16, 17, 32, 33, 70] {
            let x = random_vec(t * k, 7 * t as u64 + i as u64);
            let out = matmul(b, &m, &x, t);
            check_product(
                &format!("{f:?} t={t} exact"),
                &out,
                &x,
                &w,
                (t, k, n),
                0..n,
                f64::from,
                3e-5,
            );
            // The bf16 mode's decoded path rounds x and the weight to bf16 (the GEMV keeps
            // x in f32 at any mode).
            let out = matmul(&bf16, &m, &x, t);
            let round = if t > strata_kernels::cuda::QUANT_GEMV_MAX_ROWS {
                bf16_round
            } else {
                f64::from
            };
            check_product(
                &format!("{f:?} t={t} bf16 mode"),
                &out,
                &x,
                &w,
                (t, k, n),
                0..n,
                round,
                3e-5,
            );
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
