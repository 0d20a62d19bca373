//! The shared conformance checks on the CUDA backend (fixed shapes, property tests over
//! random shapes) and a report of the largest CUDA-vs-CPU differences on model shapes.
//!
//! The shared cases come from `conformance_tests!` (the same list the CPU file runs); the
//! tests below it are CUDA's own modes (GEMV row counts, the bf16 tensor-core paths,
//! cuBLASLt plans, bf16 twins) and the property tests.
//!
//! Without a usable GPU every test prints `<name>: skipped: no GPU` and passes, so `cargo
//! test` stays green on machines without CUDA; `STRATA_REQUIRE_GPU=1` (set by the GPU
//! bundle's script) turns a missing GPU into a failure instead
//! (`strata_kernels::gpu_test`).
#![cfg(feature = "cuda")]

use std::sync::OnceLock;

use proptest::prelude::*;
use strata_kernels::conformance::{self, *};
use strata_kernels::cpu::CpuBackend;
use strata_kernels::cuda::{CudaBackend, CudaQuantMatrix};
use strata_kernels::gpu_test::gpu_or_skip;
use strata_kernels::{
    Activation, AttentionParams, Backend, DType, DeviceBuffer, MatmulShape, ResidualStep,
    RmsNormParams, RopeParams, RopeStyle, TableSlice,
};

/// The shared backend, or `None` after printing `skipped: no GPU` (a failure instead under
/// `STRATA_REQUIRE_GPU`).
fn gpu() -> Option<&'static CudaBackend> {
    static GPU: OnceLock<Result<CudaBackend, String>> = OnceLock::new();
    gpu_or_skip(
        GPU.get_or_init(|| start().map_err(|e| e.to_string()))
            .as_ref(),
    )
}

/// A backend of its own (for tests that count what it plans), or `None` as [`gpu`].
fn open_gpu() -> Option<CudaBackend> {
    gpu_or_skip(start())
}

fn start() -> strata_kernels::Result<CudaBackend> {
    let t0 = std::time::Instant::now();
    let b = CudaBackend::new(0)?;
    eprintln!("CUDA backend on {b:?}, started in {:?}", t0.elapsed());
    Ok(b)
}

/// The reference quantized matrix, dequantized exactly (f32) onto the device.
fn quant(q: &RowScaledQ8) -> Box<CudaQuantMatrix> {
    let b = gpu().expect("only called with a GPU");
    Box::new(CudaQuantMatrix::from_f32(b, q.rows, q.cols, &q.dequantized(), DType::F32).unwrap())
}

strata_kernels::conformance_tests! {
    // A clone shares the one started backend (its context, stream and kernels).
    backend: gpu().cloned(),
    quant: quant,
}

/// A buffer's length moves within its allocation (what the decode graphs' shared logits
/// rely on): the values stay where they were, and a length past the allocation is refused.
#[test]
fn buffer_length_moves_within_its_allocation() {
    let Some(b) = gpu() else { return };
    let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let mut buf = b.upload_f32_as(&values, DType::F32).unwrap();
    buf.set_len(3).unwrap();
    assert_eq!((buf.len(), buf.capacity()), (3, 8));
    assert_eq!(b.download(&buf).unwrap(), &values[..3]);
    buf.set_len(8).unwrap();
    assert_eq!(b.download(&buf).unwrap(), values);
    assert!(buf.set_len(9).is_err());
    assert_eq!(buf.len(), 8);
}

/// Every GEMV row count (1 to 8; by default only 1 and 2 take that path).
#[test]
fn gemv_every_row_count() {
    if let Some(b) = gpu() {
        check_matmul(&b.clone().with_gemv_max_rows(8)).unwrap();
    }
}

/// Every case in one call, as a new backend's first run would (the cases above run them
/// one a test).
#[test]
fn check_all() {
    if let Some(b) = gpu() {
        conformance::check_all(b, &quant).unwrap();
    }
}

/// The shared-input and gated products at every GEMV row count, and in the bf16 mode (one
/// narrowing of x for all GEMMs past the GEMV rows: bf16's tolerance).
#[test]
fn fused_matmuls_every_row_count_and_bf16_mode() {
    let Some(b) = gpu() else { return };
    check_fused_matmuls(&b.clone().with_gemv_max_rows(8)).unwrap();
    let fast = b.clone().with_bf16_gemm(true);
    check_fused_matmuls_within(&fast, bf16_mode_tol()).unwrap();
}

/// The tensor-core GEMM for a decode step's rows (`kernels/skinny_gemm.cu`, bf16 mode, sm_90:
/// 3 to 32 rows with mma.sync, 33 to 128 with wgmma) on a decode step's shapes: every cluster
/// size (k split 1 to 8), partial feature tiles, token counts on either side of each tile's
/// edges, a layer's q / k / v in one launch, the gated MLP and the per-layer-input slice;
/// each against the f64 definition at the bf16 mode's tolerance, with the kernel on and
/// with cuBLAS in its place. The small-weight GEMM, which takes the per-layer-input shapes
/// first, is off here (it has a test of its own).
#[test]
fn skinny_gemm_on_decode_shapes() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    if b.arch() >= 90 {
        let want = if b.arch() == 90 { 128 } else { 32 };
        assert_eq!(
            fast.skinny_max_rows(),
            want,
            "sm_{} should run the skinny GEMM up to {want} rows",
            b.arch()
        );
    }
    let tol = bf16_mode_tol();
    let fast = fast.with_small_gemm(false);
    for be in [fast.clone(), fast.clone().with_skinny_gemm(false)] {
        let shared = [
            (3, 1536, vec![2048, 256, 256]),
            (32, 1536, vec![2048, 256, 256]),
            (17, 2048, vec![1536]),
            (9, 6144, vec![300]),
            (32, 64, vec![200, 7]),
            (31, 128, vec![129, 1, 64]),
            (20, 256, vec![1536]),
            (33, 1536, vec![2048, 256, 256]),
            (64, 2048, vec![1536]),
            (65, 6144, vec![1536]),
            (100, 1536, vec![4096, 512, 512]),
            (128, 256, vec![1536, 130]),
            (127, 64, vec![9000]),
        ];
        for (i, (tokens, in_features, outs)) in shared.into_iter().enumerate() {
            let c = SharedMatmulCase {
                tokens,
                in_features,
                outs,
                weight: DType::BF16,
                seed: 1000 + i as u64,
            };
            check_shared_matmul_case(&be, &c, tol).unwrap();
        }
        let gated = [
            (32, 1536, 700),
            (3, 512, 64),
            (5, 2048, 1030),
            (30, 64, 9000),
            (48, 1536, 6144),
            (128, 1536, 700),
            (97, 2048, 1030),
        ];
        check_gated_cases(&be, &gated, 1100, tol);
        check_gated_pairs(&be, 1107);
        for (i, (tokens, layers, layer)) in [(32, 35, 34), (7, 4, 0), (128, 35, 34), (50, 4, 1)]
            .into_iter()
            .enumerate()
        {
            let c = GatedSliceCase {
                tokens,
                in_features: 1536,
                out_features: 256,
                layers,
                layer,
                weight: DType::BF16,
                act: Activation::GeluTanh,
                seed: 1200 + i as u64,
            };
            check_gated_slice_matmul_case(&be, c, tol).unwrap();
        }
    }
}

/// The bf16 GEMMs without cuBLASLt's plans (`cublasGemmEx`, as where cuBLASLt is missing or
/// `STRATA_GEMM_PLANS=0`): gate and up as a pair, one call a weight, both memory orders
/// (seeds of both parities), and products split over k, one call a part.
#[test]
fn gemms_without_plans() {
    let Some(b) = gpu() else { return };
    let be = b
        .clone()
        .with_bf16_gemm(true)
        .with_small_gemm(false)
        .with_skinny_gemm(false)
        .without_gemm_plans();
    assert_eq!(be.gemm_plan_count(), None);
    check_gated_pairs(&be, 1300);
    check_k_parts(&be).unwrap();
}

/// Gated products past 64 rows with features a multiple of 8, which take gate and up as one
/// batched GEMM in the bf16 mode (`gated_pair_applies`); seeds `seed0 + i` of both
/// parities put the two weights on the GPU in either order (both memory orders).
fn check_gated_pairs(be: &CudaBackend, seed0: u64) {
    let cases = [
        (104, 512, 2048),
        (72, 256, 1024),
        (128, 64, 6144),
        (200, 128, 1024),
    ];
    check_gated_cases(be, &cases, seed0, bf16_mode_tol());
}

/// Gated products of bf16 weights, (tokens, in, out) each with both activations, case i
/// with seed `seed0 + i`.
fn check_gated_cases(
    be: &CudaBackend,
    cases: &[(usize, usize, usize)],
    seed0: u64,
    tol: Tolerance,
) {
    for (i, &(tokens, in_features, out_features)) in cases.iter().enumerate() {
        for act in [Activation::GeluTanh, Activation::Silu] {
            let c = GatedMatmulCase {
                tokens,
                in_features,
                out_features,
                weight: DType::BF16,
                act,
                seed: seed0 + i as u64,
            };
            check_gated_matmul_case(be, c, tol).unwrap();
        }
    }
}

/// The bf16 GEMMs cuBLAS runs take the cuBLASLt algorithm chosen for their bucket of row
/// counts: every row count, on either side of a bucket's edge, equals the f64 definition at
/// the bf16 mode's tolerance (plain products and the gated MLP, whose GEMMs write bf16).
/// A shape met for the first time has its 32 buckets up to 4,096 rows planned at once (16
/// of 8 rows up to 128, 16 of 256), so later row counts add none; past 4,096 a bucket is
/// planned when met. A backend of its own, so no other test's GEMMs are counted; the
/// skinny GEMM is off, so cuBLAS takes every row count past the GEMV's.
#[test]
fn gemms_share_an_algorithm_per_row_bucket() {
    let Some(b) = open_gpu() else { return };
    let fast = b
        .with_bf16_gemm(true)
        .with_small_gemm(false)
        .with_skinny_gemm(false);
    let Some(before) = fast.gemm_plan_count() else {
        eprintln!("note: no cuBLASLt, the GEMMs stay on cublasGemmEx");
        return;
    };
    assert_eq!(before, 0);
    let tol = bf16_mode_tol();
    // (rows, the algorithms chosen once they ran): buckets 8, 104, 256, 512 and 2048, then
    // 8192.
    for (i, (tokens, plans)) in [
        (3, 32),
        (100, 32),
        (129, 32),
        (200, 32),
        (256, 32),
        (257, 32),
        (2048, 32),
        (1800, 32),
        (4097, 33),
        (5000, 33),
    ]
    .into_iter()
    .enumerate()
    {
        let c = SharedMatmulCase {
            tokens,
            in_features: 512,
            outs: vec![512],
            weight: DType::BF16,
            seed: 1300 + i as u64,
        };
        check_shared_matmul_case(&fast, &c, tol).unwrap();
        assert_eq!(fast.gemm_plan_count(), Some(plans), "after {tokens} rows");
    }
    for (i, tokens) in [50, 130, 700, 2047].into_iter().enumerate() {
        let c = GatedMatmulCase {
            tokens,
            in_features: 512,
            out_features: 700,
            weight: DType::BF16,
            act: Activation::GeluTanh,
            seed: 1400 + i as u64,
        };
        check_gated_matmul_case(&fast, c, tol).unwrap();
    }
    // The gated product's two GEMMs write bf16: one more shape, its 32 buckets.
    assert_eq!(fast.gemm_plan_count(), Some(33 + 32));
}

/// The single products cuBLAS runs in a decode graph past 64 rows, at Gemma-4 E2B's shapes
/// (o: 2048 -> 1536, a KV-shared layer's q: 1536 -> 2048, down: 6144 and 12288 -> 1536):
/// each equals the f64 definition at the bf16 mode's tolerance, and running it again gives
/// the same bits (cuBLASLt splits k for these shapes; a split whose parts were added in a
/// varying order would make a replayed decode step differ from the one before it).
#[test]
fn decode_sized_gemms_match_and_repeat_bit_for_bit() {
    let Some(b) = open_gpu() else { return };
    let fast = b
        .with_bf16_gemm(true)
        .with_small_gemm(false)
        .with_skinny_gemm(false);
    let tol = bf16_mode_tol();
    let mut data = TestData::new(1500);
    for (i, (k, n)) in [(2048, 1536), (1536, 2048), (6144, 1536), (12288, 1536)]
        .into_iter()
        .enumerate()
    {
        for (j, tokens) in [72usize, 100, 128].into_iter().enumerate() {
            let c = SharedMatmulCase {
                tokens,
                in_features: k,
                outs: vec![n],
                weight: DType::BF16,
                seed: 1500 + (10 * i + j) as u64,
            };
            check_shared_matmul_case(&fast, &c, tol).unwrap();
            let x = data.normals(tokens * k, 1.0, DType::F32);
            let w = data.normals(n * k, 0.05, DType::BF16);
            let xb = fast.upload_f32_as(&x, DType::F32).unwrap();
            let wb = fast.upload_f32_as(&w, DType::BF16).unwrap();
            let shape = MatmulShape {
                in_features: k,
                out_features: n,
            };
            let run = || {
                let mut out = fast.zeros(tokens * n, DType::F32).unwrap();
                fast.matmul(&xb, &wb, shape, &mut out).unwrap();
                fast.download(&out).unwrap()
            };
            let (first, again) = (run(), run());
            let same = first
                .iter()
                .zip(&again)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{tokens} x {k} -> {n}: a second run differs");
        }
    }
}

/// One per-layer-input product of the small-weight GEMM test: the plain projection, or the
/// gate with its activation and table slice (`act`), on any backend.
struct PleProduct<'a> {
    w: &'a [f32],
    table: &'a [f32],
    shape: MatmulShape,
    slice: TableSlice,
    act: Option<Activation>,
}

impl PleProduct<'_> {
    /// The product of rows `x` on `be` (the weight uploaded as bf16).
    fn run<B: Backend>(&self, be: &B, x: &[f32]) -> Vec<f32> {
        let wb = be.upload_f32_as(self.w, DType::BF16).unwrap();
        let xb = be.upload_f32_as(x, DType::F32).unwrap();
        let tb = be.upload_f32_as(self.table, DType::F32).unwrap();
        let rows = x.len() / self.shape.in_features;
        let mut out = be
            .zeros(rows * self.shape.out_features, DType::F32)
            .unwrap();
        match self.act {
            None => be.matmul(&xb, &wb, self.shape, &mut out).unwrap(),
            Some(a) => be
                .gated_slice_matmul(a, &xb, &wb, self.shape, &tb, self.slice, &mut out)
                .unwrap(),
        }
        be.download(&out).unwrap()
    }
}

/// The small-weight GEMM (`kernels/small_gemm.cu`, bf16 mode, 3 to 128 rows): Gemma-4's
/// per-layer-input projection and gate (with its activation and table slice) at E2B's and
/// E4B's shapes, on both sides of the 16-token tile's edges. Each is the CPU backend's f32
/// product of the same bf16-rounded rows, from the same test body, at f32-accumulation
/// tolerance (magnitudes from the f64 definition), with the kernel and with cuBLAS in its
/// place.
#[test]
fn small_gemm_equals_cpu_on_per_layer_input_shapes() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    if b.arch() >= 80 {
        assert_eq!(fast.small_gemm_rows(), Some((3, 128)), "sm_{}", b.arch());
    }
    let cpu = CpuBackend::new();
    let mut data = TestData::new(13);
    let tol = Tolerance {
        abs: 1e-6,
        rel: 1e-5,
        accum: 1e-4,
    };
    // (rows, k, n, table layers and the layer sliced; 0 layers: a plain product)
    let cases = [
        (3, 256, 1536, 0, 0),
        (17, 1536, 256, 35, 3),
        (32, 256, 2560, 0, 0),
        (33, 2560, 256, 42, 41),
        (64, 1536, 256, 0, 0),
        (65, 256, 1536, 0, 0),
        (100, 256, 1536, 0, 0),
        (128, 256, 2560, 0, 0),
        (112, 1536, 256, 0, 0),
        (127, 1536, 256, 35, 34),
        (100, 2560, 256, 42, 0),
        (81, 1536, 256, 35, 7),
    ];
    for (t, k, n, layers, layer) in cases {
        let w = data.normals(n * k, 0.05, DType::BF16);
        let x = data.normals(t * k, 1.0, DType::F32);
        let xr: Vec<f32> = x.iter().map(|&v| DType::BF16.round(v)).collect();
        let table = data.normals(t * n * layers.max(1), 1.0, DType::F32);
        let slice = TableSlice {
            cols: n,
            offset: layer * n,
            stride: layers * n,
        };
        let shape = MatmulShape {
            in_features: k,
            out_features: n,
        };
        let acts = if layers == 0 {
            vec![None]
        } else {
            vec![Some(Activation::GeluTanh), Some(Activation::Silu)]
        };
        for act in acts {
            let product = PleProduct {
                w: &w,
                table: &table,
                shape,
                slice,
                act,
            };
            let got = product.run(&fast, &x);
            let on_cpu = product.run(&cpu, &xr);
            let (g, g_mag) = conformance::reference::matmul(&xr, &w, k, n);
            let mag: Vec<f64> = match act {
                None => g_mag,
                // An error e in the product moves the activation by at most 1.13 e.
                Some(_) => (0..g.len())
                    .map(|i| {
                        let tab = table[(i / n) * slice.stride + slice.offset + i % n] as f64;
                        (1.13 * g_mag[i] + 0.05 * g[i].abs()) * tab.abs()
                    })
                    .collect(),
            };
            let want: Vec<f64> = on_cpu.iter().map(|&v| v as f64).collect();
            let what = format!("small gemm {t}x{k}x{n} {act:?}");
            conformance::compare(&what, &got, &want, &mag, tol).unwrap();
            let worst = got
                .iter()
                .zip(&on_cpu)
                .map(|(a, c)| (a - c).abs())
                .fold(0.0f32, f32::max);
            eprintln!("{what}: max |cuda - cpu(bf16 x)| {worst:.3e}");
            // cuBLAS in its place gives the same values within the same bound.
            let other = product.run(&fast.clone().with_small_gemm(false), &x);
            conformance::compare(&format!("{what} via cuBLAS"), &other, &want, &mag, tol).unwrap();
        }
    }
}

/// A bf16 quantized-form matrix is the bf16-rounded reference: within bf16 weight rounding.
#[test]
fn matmul_quant_bf16_matches_a_bf16_dense_weight() {
    let Some(b) = gpu() else { return };
    let mut data = TestData::new(9);
    let (t, k, n) = (3, 256, 40);
    let w = data.normals(n * k, 0.05, DType::BF16);
    let x = data.normals(t * k, 1.0, DType::F32);
    let q = CudaQuantMatrix::from_f32(b, n, k, &w, DType::BF16).unwrap();
    let xb = b.upload_f32_as(&x, DType::F32).unwrap();
    let mut out = b.zeros(t * n, DType::F32).unwrap();
    b.matmul_quant(&xb, &q, &mut out).unwrap();
    let (want, mag) = conformance::reference::matmul(&x, &w, k, n);
    let got = b.download(&out).unwrap();
    conformance::compare(
        "bf16 quant",
        &got,
        &want,
        &mag,
        Tolerance::for_dtype(DType::F32),
    )
    .unwrap();
}

/// The bf16 GEMM path (`with_bf16_gemm(true)`): the same product as the CPU backend's f32
/// matmul of the bf16-rounded activations, at f32-accumulation tolerance, on model shapes;
/// at 8 rows or fewer (k % 8 == 0) the GEMV keeps the activations in f32 and gives the
/// CPU's product of the unrounded rows instead; and f32 weights or the path switched off
/// still give the exact f32 product.
#[test]
fn bf16_gemm_equals_cpu_on_bf16_rounded_inputs() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    let cpu = CpuBackend::new();
    let mut data = TestData::new(11);
    for (t, k, n) in [
        (1, 1536, 6144),
        (8, 1536, 512),
        (9, 1536, 512),
        (64, 2048, 1536),
        (7, 640, 262),
        (300, 256, 512),
    ] {
        let w = data.normals(n * k, 0.05, DType::BF16);
        let x = data.normals(t * k, 1.0, DType::F32);
        let xr: Vec<f32> = x.iter().map(|&v| DType::BF16.round(v)).collect();
        let shape = MatmulShape {
            in_features: k,
            out_features: n,
        };
        let run = |be: &CudaBackend, input: &[f32]| {
            let wb = be.upload_f32_as(&w, DType::BF16).unwrap();
            let xb = be.upload_f32_as(input, DType::F32).unwrap();
            let mut out = be.zeros(t * n, DType::F32).unwrap();
            be.matmul(&xb, &wb, shape, &mut out).unwrap();
            be.download(&out).unwrap()
        };
        let got = run(&fast, &x);
        let gemv = t <= fast.gemv_max_rows() && k % 8 == 0;
        let xr = if gemv { x.clone() } else { xr };
        let wc = cpu.upload_f32_as(&w, DType::BF16).unwrap();
        let xc = cpu.upload_f32_as(&xr, DType::F32).unwrap();
        let mut oc = cpu.zeros(t * n, DType::F32).unwrap();
        cpu.matmul(&xc, &wc, shape, &mut oc).unwrap();
        let on_cpu = cpu.download(&oc).unwrap();
        let (_, mag) = conformance::reference::matmul(&xr, &w, k, n);
        let tol = Tolerance {
            abs: 1e-6,
            rel: 1e-5,
            accum: 1e-4,
        };
        let want: Vec<f64> = on_cpu.iter().map(|&v| v as f64).collect();
        conformance::compare(&format!("bf16 gemm {t}x{k}x{n}"), &got, &want, &mag, tol).unwrap();
        let worst = got
            .iter()
            .zip(&on_cpu)
            .map(|(a, c)| (a - c).abs())
            .fold(0.0f32, f32::max);
        eprintln!("bf16 gemm {t}x{k}x{n}: max |cuda - cpu(bf16 x)| {worst:.3e}");
        // The exact path on the same inputs matches the unrounded product instead.
        let exact = run(b, &x);
        let (want, mag) = conformance::reference::matmul(&x, &w, k, n);
        conformance::compare(
            "exact gemm",
            &exact,
            &want,
            &mag,
            Tolerance::for_dtype(DType::F32),
        )
        .unwrap();
    }
}

/// Attention in the bf16 mode rounds the queries and probabilities to bf16 (tensor-core
/// kernel) or runs its GEMMs in TF32 (long query runs): bf16's tolerance.
fn bf16_mode_tol() -> Tolerance {
    Tolerance::for_dtype(DType::BF16)
}

/// Decode batches made as a captured step's, in the bf16 mode: the tensor-core kernels with
/// their splits capped by the window (E2B's sliding layers at 1 and 8 rows) and sized by
/// the wave alone (128 rows; E4B's two KV heads at 64; a full layer).
#[test]
fn paged_attention_graph_splits_bf16_mode() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    for c in paged_attention_graph_cases() {
        check_paged_attention_graph_case_within(&fast, &c, bf16_mode_tol()).unwrap();
    }
}

/// Verification batches (every sequence the same number of tokens) in the bf16 mode, on
/// bf16, fp8 and int8 slabs: the tensor-core decode kernels take a sequence's tokens in one
/// block where their query heads fit its rows, made as a step's batch and as a captured
/// step's; against the f32 reference over the same rows.
#[test]
fn paged_attention_verification_bf16_mode() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    for format in [
        strata_kernels::KvFormat::Bf16,
        strata_kernels::KvFormat::Fp8E4m3PerTokenHead,
        strata_kernels::KvFormat::Int8PerTokenHead,
    ] {
        for c in paged_attention_verification_cases() {
            let c = PagedCase { format, ..c };
            check_paged_attention_case_within(&fast, &c, bf16_mode_tol()).unwrap();
            check_paged_attention_graph_case_within(&fast, &c, bf16_mode_tol()).unwrap();
        }
    }
}

/// Every paged-attention case with its slab in bf16, in the bf16 mode: the shapes the
/// tensor-core kernel takes (head_dim a multiple of 64, groups up to 16) run there, long
/// query runs take the TF32 GEMMs; all against the f32 reference over the same bf16 rows.
#[test]
fn paged_attention_bf16_mode() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    for c in paged_attention_cases() {
        let c = PagedCase {
            format: strata_kernels::KvFormat::Bf16,
            ..c
        };
        check_paged_attention_case_within(&fast, &c, bf16_mode_tol()).unwrap();
    }
}

/// The 8-bit slabs (fp8 and int8 per token-head) in the bf16 mode: one-token rows take the
/// tensor-core decode kernels and long query runs the tensor-core prefill kernels, f16 mma
/// over the codes with the scales on the scores and probabilities; against the f64
/// reference over the same dequantized rows.
#[test]
fn paged_attention_bf16_mode_8bit_slabs() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    for format in [
        strata_kernels::KvFormat::Fp8E4m3PerTokenHead,
        strata_kernels::KvFormat::Int8PerTokenHead,
    ] {
        for (d, name) in [(256, "_d256"), (512, "_d512"), (64, "_d64")] {
            let p = AttentionParams {
                n_heads: 8,
                n_kv_heads: 1,
                head_dim: d,
                scale: 1.0,
                window: None,
                causal: true,
                softcap: None,
            };
            let kernel = fast.decode_attention_kernel(format, &p);
            let prefill = fast.prefill_attention_kernel(format, &p);
            if fast.arch() >= 90 {
                assert!(
                    kernel.starts_with("decode_attention_mma_"),
                    "{format:?}: {kernel}"
                );
                assert!(kernel.ends_with(name), "{format:?}: {kernel}");
                let prefill = prefill.unwrap_or_else(|| panic!("{format:?} d {d}: GEMM path"));
                assert!(
                    prefill.starts_with("prefill_attention_mma_") && prefill.ends_with(name),
                    "{format:?}: {prefill}"
                );
                let tag = if format == strata_kernels::KvFormat::Int8PerTokenHead {
                    "_int8_"
                } else {
                    "_fp8_"
                };
                assert!(kernel.contains(tag) && prefill.contains(tag));
            }
        }
        for c in paged_attention_cases() {
            let c = PagedCase { format, ..c };
            check_paged_attention_case_within(&fast, &c, bf16_mode_tol()).unwrap();
        }
    }
}

/// The bf16 twin: in the bf16 mode a norm (result in `out`, or the residual for the
/// post-norm add) and the gated product write a bf16 copy of their result that the next
/// bf16 GEMM reads instead of narrowing. The GEMM must give the bits it gives on the same
/// values uploaded fresh (narrowed), and any other write must make the copy stale.
#[test]
fn bf16_twin_matches_narrowing_and_goes_stale() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    let (rows, dim, n, inter) = (24, 320, 72, 200);
    let vals = |len: usize, seed: u32| -> Vec<f32> {
        (0..len as u32)
            .map(|i| {
                let h = i
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                ((h >> 8) as f32 / (1u32 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    };
    let up = |v: &[f32], dt: DType| fast.upload_f32_as(v, dt).unwrap();
    let x = up(&vals(rows * dim, 1), DType::F32);
    let norm_w = up(&vals(dim, 2), DType::BF16);
    let w = up(&vals(n * dim, 3), DType::BF16);
    let (gate, upw) = (
        up(&vals(inter * dim, 4), DType::BF16),
        up(&vals(inter * dim, 5), DType::BF16),
    );
    let down = up(&vals(n * inter, 6), DType::BF16);
    let p = RmsNormParams {
        dim,
        eps: 1e-6,
        weight_offset: 0.0,
        parts: 1,
    };
    let shape = MatmulShape {
        in_features: dim,
        out_features: n,
    };
    let down_shape = MatmulShape {
        in_features: inter,
        out_features: n,
    };
    // y = a * W^T on the buffer itself and on a fresh upload of its values.
    let both = |a: &strata_kernels::cuda::CudaBuffer, w, s: MatmulShape| {
        let mut y1 = fast.zeros(rows * s.out_features, DType::F32).unwrap();
        fast.matmul(a, w, s, &mut y1).unwrap();
        let fresh = up(&fast.download(a).unwrap(), DType::F32);
        let mut y2 = fast.zeros(rows * s.out_features, DType::F32).unwrap();
        fast.matmul(&fresh, w, s, &mut y2).unwrap();
        (fast.download(&y1).unwrap(), fast.download(&y2).unwrap())
    };

    let mut normed = fast.zeros(rows * dim, DType::F32).unwrap();
    fast.rms_norm(&x, Some(&norm_w), p, &mut normed).unwrap();
    let (y, want) = both(&normed, &w, shape);
    assert_eq!(y, want, "a norm's twin");

    fast.scale(&mut normed, 3.0).unwrap();
    let (y_scaled, want) = both(&normed, &w, shape);
    assert_eq!(
        y_scaled, want,
        "a write after the norm makes its twin stale"
    );
    assert_ne!(y_scaled, y, "the scale changed the product");

    let mut residual = up(&vals(rows * dim, 7), DType::F32);
    fast.residual_norm(
        &mut residual,
        &x,
        p,
        ResidualStep::norm_then_add(Some(&norm_w), 1.0),
    )
    .unwrap();
    let (y, want) = both(&residual, &w, shape);
    assert_eq!(y, want, "the post-norm add's residual twin");

    let mut act = fast.zeros(rows * inter, DType::F32).unwrap();
    let gate_shape = MatmulShape {
        in_features: dim,
        out_features: inter,
    };
    fast.gated_matmul(Activation::GeluTanh, &x, &gate, &upw, gate_shape, &mut act)
        .unwrap();
    let (y, want) = both(&act, &down, down_shape);
    assert_eq!(y, want, "the gated product's twin");
}

/// The attention output's bf16 twin (the o projection's operand) from the tensor-core
/// kernels: a prefill run alone (prefill kernel), long and short runs in one call (both
/// kernels), and decode rows only (the decode kernel, its splits merged by the combine).
/// The o projection must give the bits of a fresh narrowed upload; the outputs stay within
/// bf16 tolerance of the reference.
#[test]
fn attention_twin_matches_narrowing() {
    let Some(b) = gpu() else { return };
    let fast = b.clone().with_bf16_gemm(true);
    let (heads, kv_heads, d, n) = (8, 2, 128, 96);
    let mut data = conformance::TestData::new(31);
    let w = fast
        .upload_f32_as(&data.normals(n * heads * d, 0.05, DType::BF16), DType::BF16)
        .unwrap();
    let shape = MatmulShape {
        in_features: heads * d,
        out_features: n,
    };
    for (i, seqs) in [
        vec![(0, 80)],
        vec![(30, 70), (12, 1), (5, 2)],
        vec![(40, 1), (700, 1), (100, 1)],
    ]
    .into_iter()
    .enumerate()
    {
        let rows: usize = seqs.iter().map(|&(_, q)| q).sum();
        let c = PagedCase {
            format: strata_kernels::KvFormat::Bf16,
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: d,
            window: None,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: None,
            seqs,
            seed: 40 + i as u64,
        };
        let (out, want, mag) = conformance::run_paged_attention_case(&fast, &c).unwrap();
        let got = fast.download(&out).unwrap();
        conformance::compare("attention twin case", &got, &want, &mag, bf16_mode_tol()).unwrap();
        let mut y1 = fast.zeros(rows * n, DType::F32).unwrap();
        fast.matmul(&out, &w, shape, &mut y1).unwrap();
        let fresh = fast.upload_f32_as(&got, DType::F32).unwrap();
        let mut y2 = fast.zeros(rows * n, DType::F32).unwrap();
        fast.matmul(&fresh, &w, shape, &mut y2).unwrap();
        assert_eq!(
            fast.download(&y1).unwrap(),
            fast.download(&y2).unwrap(),
            "case {i}: the o projection on the attention's twin"
        );
    }
}

/// A random bf16-slab attention case in the bf16 mode (the tensor-core kernels), scaled by
/// 1/sqrt(head_dim), against the f32 reference at bf16 tolerance.
#[allow(clippy::too_many_arguments)]
fn check_bf16_mode_attention(
    b: &CudaBackend,
    kv_heads: usize,
    group: usize,
    d64: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    seqs: Vec<(usize, usize)>,
    seed: u64,
) -> conformance::CheckResult {
    let shape = Bf16ModeShape {
        kv_heads,
        group,
        d64,
        window,
        softcap,
    };
    check_bf16_mode_attention_on(b, strata_kernels::KvFormat::Bf16, shape, seqs, seed)
}

/// The heads, head_dim (64 x d64), window and softcap of a bf16-mode attention case.
struct Bf16ModeShape {
    kv_heads: usize,
    group: usize,
    d64: usize,
    window: Option<usize>,
    softcap: Option<f32>,
}

/// [`check_bf16_mode_attention`] over a slab of `format`.
fn check_bf16_mode_attention_on(
    b: &CudaBackend,
    format: strata_kernels::KvFormat,
    s: Bf16ModeShape,
    seqs: Vec<(usize, usize)>,
    seed: u64,
) -> conformance::CheckResult {
    let c = PagedCase {
        format,
        n_heads: s.kv_heads * s.group,
        n_kv_heads: s.kv_heads,
        head_dim: 64 * s.d64,
        window: s.window,
        scale: 1.0 / (64.0 * s.d64 as f32).sqrt(),
        softcap: s.softcap,
        seqs,
        seed,
    };
    check_paged_attention_case_within(&b.clone().with_bf16_gemm(true), &c, bf16_mode_tol())
}

/// A server's step at Gemma-4's shapes (eight query heads on one KV head, head_dim 256
/// with a 512-key window and 512 without): decode rows and whole prompts, the prompts'
/// attention one launch (split or not by how many blocks they make); then more prompts
/// than one launch takes.
#[test]
fn prompts_of_a_step_attend_together() {
    let Some(b) = gpu() else { return };
    let step = vec![
        (700, 1),
        (0, 300),
        (0, 300),
        (900, 1),
        (0, 300),
        (64, 100),
        (5, 1),
    ];
    let many: Vec<_> = (0..35).map(|i| (i % 3 * 20, 64)).collect();
    for format in [
        strata_kernels::KvFormat::Bf16,
        strata_kernels::KvFormat::Fp8E4m3PerTokenHead,
        strata_kernels::KvFormat::Int8PerTokenHead,
    ] {
        for (d64, window) in [(4, Some(512)), (8, None)] {
            for (i, seqs) in [step.clone(), many.clone()].into_iter().enumerate() {
                let shape = Bf16ModeShape {
                    kv_heads: 1,
                    group: 8,
                    d64,
                    window,
                    softcap: None,
                };
                check_bf16_mode_attention_on(b, format, shape, seqs, 40 + i as u64)
                    .unwrap_or_else(|e| panic!("{format:?} d {} case {i}: {e}", 64 * d64));
            }
        }
    }
}

fn weight_dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::BF16), Just(DType::F16)]
}

fn kv_format() -> impl Strategy<Value = strata_kernels::KvFormat> {
    proptest::sample::select(ALL_FORMATS.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn paged_attention_random_shapes(
        format in kv_format(), kv_heads in 1usize..3, group in 1usize..5,
        d32 in 1usize..17, window in proptest::option::of(1usize..40),
        seqs in proptest::collection::vec((0usize..600, 1usize..9), 1..4), seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let c = PagedCase {
                format, n_heads: kv_heads * group, n_kv_heads: kv_heads, head_dim: 32 * d32,
                window, scale: 1.0 / (32.0 * d32 as f32).sqrt(), softcap: None, seqs, seed,
            };
            check_paged_attention_case(b, &c).map_err(TestCaseError::fail)?;
        }
    }

    /// The same over 8-bit slabs (decode rows and short chunks: the tensor-core decode
    /// kernels where head_dim is 64, 128, 256 or 512, the CUDA-core kernel elsewhere).
    #[test]
    fn paged_attention_bf16_mode_8bit_random_shapes(
        fp8 in any::<bool>(), kv_heads in 1usize..3, group in 1usize..17, d64 in 1usize..9,
        window in proptest::option::of(1usize..300), softcap in proptest::option::of(5.0f32..60.0),
        seqs in proptest::collection::vec((0usize..1500, 1usize..9), 1..4), seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let format = if fp8 {
                strata_kernels::KvFormat::Fp8E4m3PerTokenHead
            } else {
                strata_kernels::KvFormat::Int8PerTokenHead
            };
            let shape = Bf16ModeShape { kv_heads, group, d64, window, softcap };
            check_bf16_mode_attention_on(b, format, shape, seqs, seed).map_err(TestCaseError::fail)?;
        }
    }

    /// The bf16 mode's tensor-core attention on random groups (up to 16 query heads a KV
    /// head), head_dims (multiples of 64), windows and key counts (several tiles, splits).
    #[test]
    fn paged_attention_bf16_mode_random_shapes(
        kv_heads in 1usize..3, group in 1usize..17, d64 in 1usize..9,
        window in proptest::option::of(1usize..300), softcap in proptest::option::of(5.0f32..60.0),
        seqs in proptest::collection::vec((0usize..1500, 1usize..9), 1..4), seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            check_bf16_mode_attention(b, kv_heads, group, d64, window, softcap, seqs, seed)
                .map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn kv_store_random_shapes(
        format in kv_format(), heads in 1usize..4, d in 1usize..600, rows in 1usize..20,
        seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            check_kv_store_case(b, format, heads, d, rows, seed).map_err(TestCaseError::fail)?;
        }
    }
}

proptest! {
    // Each case's f64 reference covers hundreds of rows against up to a thousand keys.
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Long query runs (prefill chunks, 64 rows or more) in the bf16 mode: the tensor-core
    /// prefill kernel (one launch for all of a call's runs), with cached prefixes, windows shorter and longer than the run,
    /// softcaps, groups up to 16 and a short sequence beside them (which takes the decode
    /// kernel in the same call).
    #[test]
    fn prefill_attention_bf16_mode_random_shapes(
        kv_heads in 1usize..3, group in 1usize..17, d64 in 1usize..9,
        window in proptest::option::of(1usize..300), softcap in proptest::option::of(5.0f32..60.0),
        seqs in proptest::collection::vec((0usize..700, 64usize..300), 1..5),
        short in proptest::option::of((0usize..400, 1usize..9)), short_at in 0usize..5,
        seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            // Two or more long runs share one launch; a short one among them splits their
            // rows into stretches.
            let mut seqs = seqs;
            if let Some(s) = short {
                seqs.insert(short_at.min(seqs.len()), s);
            }
            check_bf16_mode_attention(b, kv_heads, group, d64, window, softcap, seqs, seed)
                .map_err(TestCaseError::fail)?;
        }
    }

    /// The same over 8-bit slabs (fp8 or int8 per token-head): the prefill kernels that
    /// convert each tile's codes to f16 once, with the scales on S and P.
    #[test]
    fn prefill_attention_bf16_mode_8bit_random_shapes(
        fp8 in any::<bool>(), kv_heads in 1usize..3, group in 1usize..17, d64 in 1usize..9,
        window in proptest::option::of(1usize..300), softcap in proptest::option::of(5.0f32..60.0),
        seqs in proptest::collection::vec((0usize..700, 64usize..300), 1..5),
        short in proptest::option::of((0usize..400, 1usize..9)), short_at in 0usize..5,
        seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let format = if fp8 {
                strata_kernels::KvFormat::Fp8E4m3PerTokenHead
            } else {
                strata_kernels::KvFormat::Int8PerTokenHead
            };
            let mut seqs = seqs;
            if let Some(s) = short {
                seqs.insert(short_at.min(seqs.len()), s);
            }
            let shape = Bf16ModeShape { kv_heads, group, d64, window, softcap };
            check_bf16_mode_attention_on(b, format, shape, seqs, seed).map_err(TestCaseError::fail)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn matmul_random_shapes(
        tokens in 1usize..40, in_features in 1usize..300, out_features in 1usize..120,
        weight in weight_dtype(), seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let c = MatmulCase { tokens, in_features, out_features, weight, seed };
            check_matmul_case(b, c).map_err(TestCaseError::fail)?;
        }
    }

    /// Decode-sized products (1..8 rows, k a multiple of 8: the GEMV path for bf16).
    #[test]
    fn gemv_random_shapes(
        tokens in 1usize..9, k8 in 1usize..400, out_features in 1usize..300,
        weight in weight_dtype(), seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let c = MatmulCase { tokens, in_features: 8 * k8, out_features, weight, seed };
            check_matmul_case(&b.clone().with_gemv_max_rows(8), c).map_err(TestCaseError::fail)?;
        }
    }

    /// q / k / v-like weight sets and gated MLP products at random decode shapes.
    #[test]
    fn fused_matmul_random_shapes(
        tokens in 1usize..9, k8 in 1usize..300, outs in prop::collection::vec(1usize..300, 1..4),
        silu in any::<bool>(), seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let b = b.clone().with_gemv_max_rows(8);
            let tol = Tolerance::for_dtype(DType::F32);
            let c = SharedMatmulCase {
                tokens, in_features: 8 * k8, outs: outs.clone(), weight: DType::BF16, seed,
            };
            check_shared_matmul_case(&b, &c, tol).map_err(TestCaseError::fail)?;
            let act = if silu { Activation::Silu } else { Activation::GeluTanh };
            let c = GatedMatmulCase {
                tokens, in_features: 8 * k8, out_features: outs[0], weight: DType::BF16, act, seed,
            };
            check_gated_matmul_case(&b, c, tol).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn rms_norm_random_shapes(
        rows in 1usize..10, dim in 1usize..2000, weight in proptest::option::of(weight_dtype()),
        offset in prop_oneof![Just(0.0f32), Just(1.0f32)],
        variant in prop_oneof![Just(NormVariant::Plain), Just(NormVariant::AddThenNorm), Just(NormVariant::NormThenAdd)],
        seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let c = RmsNormCase { rows, dim, weight, weight_offset: offset, eps: 1e-6, variant, seed };
            check_rms_norm_case(b, c).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn rope_random_shapes(
        tokens in 1usize..6, n_heads in 1usize..5, half in 1usize..257, rotated_frac in 0.0f64..=1.0,
        interleaved in any::<bool>(), max_position in 1u32..50_000, seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let c = RopeCase {
                tokens, n_heads, head_dim: 2 * half,
                rotated_pairs: (rotated_frac * half as f64) as usize,
                theta: 1e4,
                style: if interleaved { RopeStyle::Interleaved } else { RopeStyle::Neox },
                max_position, seed,
            };
            check_rope_case(b, c).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn attention_random_shapes(
        q_tokens in 1usize..20, cached in 0usize..200, first_position in 0u32..1000,
        kv_heads in 1usize..3, group in 1usize..5,
        head_dim in prop_oneof![Just(64usize), Just(128), Just(256), Just(512), 1usize..40],
        window in proptest::option::of(1usize..64), causal in prop::bool::weighted(0.8),
        softcap in proptest::option::of(5.0f32..60.0), shuffle_keys in any::<bool>(),
        unit_scale in any::<bool>(), seed in any::<u64>(),
    ) {
        if let Some(b) = gpu() {
            let c = AttentionCase {
                q_tokens, cached, first_position, n_heads: kv_heads * group, n_kv_heads: kv_heads,
                head_dim, window, causal,
                scale: if unit_scale { 1.0 } else { 1.0 / (head_dim as f32).sqrt() },
                softcap, shuffle_keys, seed,
            };
            check_attention_case(b, c).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn act_mul_random_lengths(len in 1usize..100_000, spread in 0.1f32..20.0, silu in any::<bool>(), seed in any::<u64>()) {
        if let Some(b) = gpu() {
            let act = if silu { Activation::Silu } else { Activation::GeluTanh };
            check_act_mul_case(b, act, ElementwiseCase { len, spread, seed }).map_err(TestCaseError::fail)?;
        }
    }
}

/// Largest |CUDA - CPU| and the largest relative difference, over all elements.
fn diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold((0.0f32, 0.0f32), |(m, r), (&x, &y)| {
        let d = (x - y).abs();
        (m.max(d), r.max(d / y.abs().max(1e-3)))
    })
}

/// Runs `op` on both backends with the same host inputs and returns both outputs.
fn both<F, G>(cuda_op: F, cpu_op: G) -> (Vec<f32>, Vec<f32>)
where
    F: FnOnce(&CudaBackend) -> Vec<f32>,
    G: FnOnce(&CpuBackend) -> Vec<f32>,
{
    (cuda_op(gpu().unwrap()), cpu_op(&CpuBackend::new()))
}

fn run_matmul<B: Backend>(b: &B, x: &[f32], w: &[f32], wdt: DType, k: usize, n: usize) -> Vec<f32> {
    let xb = b.upload_f32_as(x, DType::F32).unwrap();
    let wb = b.upload_f32_as(w, wdt).unwrap();
    let mut out = b.zeros(x.len() / k * n, DType::F32).unwrap();
    let shape = MatmulShape {
        in_features: k,
        out_features: n,
    };
    b.matmul(&xb, &wb, shape, &mut out).unwrap();
    b.download(&out).unwrap()
}

fn run_attention<B: Backend>(
    b: &B,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    qp: &[u32],
    kp: &[u32],
    p: AttentionParams,
) -> Vec<f32> {
    let up = |x: &[f32]| b.upload_f32_as(x, DType::F32).unwrap();
    let mut out = b.zeros(q.len(), DType::F32).unwrap();
    b.attention(&up(q), &up(k), &up(v), qp, kp, p, &mut out)
        .unwrap();
    b.download(&out).unwrap()
}

/// Prints the largest CUDA-vs-CPU differences on the model's shapes (for the GPU log).
#[test]
fn report_max_differences_vs_cpu() {
    if gpu().is_none() {
        return;
    }
    let mut data = TestData::new(42);
    let mut report = Vec::new();
    for &(t, k, n) in &[(1, 640, 2048), (1, 1536, 6144), (64, 1536, 2048)] {
        for wdt in [DType::F32, DType::BF16, DType::F16] {
            let x = data.normals(t * k, 1.0, DType::F32);
            let w = data.normals(n * k, 0.05, wdt);
            let (g, c) = both(
                |b| run_matmul(b, &x, &w, wdt, k, n),
                |b| run_matmul(b, &x, &w, wdt, k, n),
            );
            report.push((format!("matmul {t}x{k}x{n} {wdt:?}"), diff(&g, &c)));
        }
    }
    for &(tq, s, heads, kvh, d, window) in &[
        (1usize, 600usize, 8usize, 1usize, 256usize, Some(512usize)),
        (1, 600, 8, 1, 512, None),
        (64, 64, 8, 2, 256, Some(512)),
        (32, 96, 16, 8, 128, None),
    ] {
        let q = data.normals(tq * heads * d, 0.3, DType::F32);
        let k = data.normals(s * kvh * d, 0.3, DType::F32);
        let v = data.normals(s * kvh * d, 1.0, DType::F32);
        let kp: Vec<u32> = (0..s as u32).collect();
        let qp: Vec<u32> = kp[s - tq..].to_vec();
        let p = AttentionParams {
            n_heads: heads,
            n_kv_heads: kvh,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window,
            causal: true,
            softcap: None,
        };
        let (g, c) = both(
            |b| run_attention(b, &q, &k, &v, &qp, &kp, p),
            |b| run_attention(b, &q, &k, &v, &qp, &kp, p),
        );
        report.push((
            format!("attention q{tq} k{s} h{heads}/{kvh} d{d} w{window:?}"),
            diff(&g, &c),
        ));
    }
    {
        let (rows, dim) = (64, 1536);
        let x = data.normals(rows * dim, 2.0, DType::F32);
        let w = data.normals(dim, 1.0, DType::BF16);
        let norm = |be: &dyn NormRunner| be.run(&x, &w, dim);
        let (g, c) = (norm(gpu().unwrap()), norm(&CpuBackend::new()));
        report.push((format!("rms_norm {rows}x{dim} bf16 w"), diff(&g, &c)));
    }
    {
        let (t, heads, d) = (16, 8, 256);
        let x = data.normals(t * heads * d, 1.0, DType::F32);
        let inv: Vec<f32> = (0..d / 2)
            .map(|i| 1e4f64.powf(-(2.0 * i as f64) / d as f64) as f32)
            .collect();
        let pos: Vec<u32> = (0..t as u32).map(|i| 30_000 + 97 * i).collect();
        let rope = |be: &dyn RopeRunner| be.run(&x, &pos, &inv, heads, d);
        let (g, c) = (rope(gpu().unwrap()), rope(&CpuBackend::new()));
        report.push((format!("rope {t}x{heads}x{d} pos 30000+"), diff(&g, &c)));
    }
    eprintln!("CUDA vs CPU, largest differences (abs, rel):");
    for (what, (abs, rel)) in &report {
        eprintln!("  {what:<44} {abs:.3e}  {rel:.3e}");
    }
}

trait NormRunner {
    fn run(&self, x: &[f32], w: &[f32], dim: usize) -> Vec<f32>;
}

impl<B: Backend> NormRunner for B {
    fn run(&self, x: &[f32], w: &[f32], dim: usize) -> Vec<f32> {
        let xb = self.upload_f32_as(x, DType::F32).unwrap();
        let wb = self.upload_f32_as(w, DType::BF16).unwrap();
        let mut out = self.zeros(x.len(), DType::F32).unwrap();
        self.rms_norm(&xb, Some(&wb), RmsNormParams::new(dim, 1e-6), &mut out)
            .unwrap();
        self.download(&out).unwrap()
    }
}

trait RopeRunner {
    fn run(&self, x: &[f32], pos: &[u32], inv: &[f32], heads: usize, d: usize) -> Vec<f32>;
}

impl<B: Backend> RopeRunner for B {
    fn run(&self, x: &[f32], pos: &[u32], inv: &[f32], heads: usize, d: usize) -> Vec<f32> {
        let mut xb = self.upload_f32_as(x, DType::F32).unwrap();
        let fb = self.upload_f32_as(inv, DType::F32).unwrap();
        let p = RopeParams {
            n_heads: heads,
            head_dim: d,
            style: RopeStyle::Neox,
        };
        self.rope(&mut xb, pos, &fb, p).unwrap();
        self.download(&xb).unwrap()
    }
}
