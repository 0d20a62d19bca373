//! Backend-agnostic checks of every op against plain scalar f64 references.
//!
//! Each family has `check_<op>_case(backend, case)` for one shape (property tests feed it
//! random shapes) and `check_<op>(backend)` running a fixed, seeded list of shapes that
//! covers the model's real cases (head_dim 64..512, GQA, windows, partial RoPE, ...).
//! A check uploads random host inputs, runs the op, downloads and compares element by
//! element within a [`Tolerance`] chosen from the backend's activation dtype. Inputs are
//! rounded to that dtype before the reference sees them, so a bf16 backend is judged on
//! its arithmetic, not on input rounding. A failure is an `Err` describing the first bad
//! element; nothing here panics on a mismatch.
//!
//! A new backend runs them all with [`check_all`], or one `#[test]` a case with
//! [`crate::conformance_tests!`]; [`CASES`] lists the cases and the `Backend` methods each
//! one checks.

mod adjust;
mod attention;
mod conformer;
mod elementwise;
mod forms;
mod fused;
mod k_parts;
mod lora;
mod matmul;
mod memory;
mod norm;
mod paged;
pub mod reference;
mod registry;
mod rope;
mod sampling;

pub use adjust::{check_adjust_logits, check_mask_logits};
pub use attention::{check_attention, check_attention_case, AttentionCase};
pub use conformer::{check_chunked_attention, check_clamp, check_depthwise_conv};
pub use elementwise::{
    check_act_mul, check_act_mul_case, check_activation, check_arith, check_softcap,
    ElementwiseCase,
};
pub use forms::{check_host_pick, check_index_forms};
pub use fused::{
    check_act_mul_slice, check_fused, check_fused_norms, check_head_norm_rope, check_qkv_norm_rope,
    check_qkv_norm_rope_store,
};
pub use k_parts::check_k_parts;
pub use lora::{check_lora_bgmv, check_lora_bgmv_case, check_lora_shared_input, LoraCase};
pub use matmul::{
    check_embedding, check_embedding_case, check_embedding_quant, check_fused_matmuls,
    check_fused_matmuls_quant, check_fused_matmuls_within, check_gated_matmul_case,
    check_gated_slice_matmul_case, check_matmul, check_matmul_case, check_matmul_quant,
    check_matmul_quant_case, check_shared_matmul_case, EmbeddingCase, GatedMatmulCase,
    GatedSliceCase, MatmulCase, RowScaledQ8, SharedMatmulCase,
};
pub use memory::{check_copy_strided, check_upload_download};
pub use norm::{check_rms_norm, check_rms_norm_case, NormVariant, RmsNormCase};
pub use paged::{
    check_kv_store_case, check_paged, check_paged_attention_case,
    check_paged_attention_case_within, check_paged_attention_graph_case_within,
    paged_attention_cases, paged_attention_graph_cases, paged_attention_verification_cases,
    run_paged_attention_case, PagedCase, ALL_FORMATS,
};
pub use registry::{run_case, Case, CASES, NOT_OPS};
pub use rope::{check_rope, check_rope_case, RopeCase};
pub use sampling::{check_argmax, check_clustered_argmax, check_feed_tokens, check_sample};

use crate::sampling::SamplerRng;
use crate::{Backend, DType};

/// Outcome of a check: `Err` holds a readable description of the first mismatch.
pub type CheckResult = Result<(), String>;

/// Allowed error per element: `|got - want| <= abs + rel * |want| + accum * magnitude`,
/// where `magnitude` is op-specific (for a dot product, the sum of `|x_i * w_i|`), which
/// covers rounding during accumulation independent of cancellation in the result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute error allowed on every element.
    pub abs: f64,
    /// Error allowed per unit of `|want|`.
    pub rel: f64,
    /// Error allowed per unit of the op-specific accumulated magnitude.
    pub accum: f64,
}

impl Tolerance {
    /// Stated per activation dtype:
    /// - F32: a few ulps per elementwise result (`rel` 4e-6), 2e-5 of the accumulated
    ///   magnitude (f32 sums of up to a few thousand terms), `abs` 1e-6.
    /// - BF16: 2^-7 relative (two bf16 roundings), 1e-2 of magnitude, `abs` 1e-3.
    /// - F16: 2^-10 relative, 2e-3 of magnitude, `abs` 1e-4.
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F32 => Self {
                abs: 1e-6,
                rel: 4e-6,
                accum: 2e-5,
            },
            DType::BF16 => Self {
                abs: 1e-3,
                rel: 1.0 / 128.0,
                accum: 1e-2,
            },
            DType::F16 => Self {
                abs: 1e-4,
                rel: 1.0 / 1024.0,
                accum: 2e-3,
            },
        }
    }

    /// Whether `got` is within the bound of `want`, given the element's accumulated
    /// `magnitude` (0 for elementwise results); NaN or infinity never passes.
    pub fn allows(&self, got: f32, want: f64, magnitude: f64) -> bool {
        let err = (got as f64 - want).abs();
        // NaN/inf in `got` never pass: `err <= bound` is false for NaN.
        err <= self.abs + self.rel * want.abs() + self.accum * magnitude
    }
}

/// Compares `got` with `want` element by element; `magnitude[i]` as in [`Tolerance`]
/// (pass an empty slice for purely elementwise ops).
pub fn compare(
    what: &str,
    got: &[f32],
    want: &[f64],
    magnitude: &[f64],
    tol: Tolerance,
) -> CheckResult {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: got {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let m = magnitude.get(i).copied().unwrap_or(0.0);
        if !tol.allows(g, w, m) {
            return Err(format!(
                "{what}: element {i}: got {g}, want {w} (error {:.3e}, magnitude {m:.3e}, {tol:?})",
                (g as f64 - w).abs()
            ));
        }
    }
    Ok(())
}

/// Seeded random test data (reuses the sampler's documented PRNG).
pub struct TestData {
    rng: SamplerRng,
}

impl TestData {
    /// A stream determined by `seed`: the same seed gives the same data.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: SamplerRng::new(seed),
        }
    }

    /// A uniform draw between `lo` and `hi` (from one f64 in `[0, 1)`, rounded to f32).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.rng.next_f64() as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.rng.next_f64().max(1e-300);
        let u2 = self.rng.next_f64();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// `n` values `N(0, std^2)` rounded to `dtype`.
    pub fn normals(&mut self, n: usize, std: f32, dtype: DType) -> Vec<f32> {
        (0..n).map(|_| dtype.round(self.normal() * std)).collect()
    }

    /// An integer in `0..n` (the next u64 modulo `n`; panics for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }
}

/// Uploads `data` (already rounded to `dtype`) as a buffer of `dtype`.
pub(crate) fn put<B: Backend>(b: &B, data: &[f32], dtype: DType) -> Result<B::Buffer, String> {
    b.upload_f32_as(data, dtype).map_err(|e| e.to_string())
}

pub(crate) fn get<B: Backend>(b: &B, buf: &B::Buffer) -> Result<Vec<f32>, String> {
    b.download(buf).map_err(|e| e.to_string())
}

pub(crate) fn ctx<T>(what: &str, r: crate::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Runs every case of [`CASES`], in order, stopping at the first failure (named in the
/// error). `prepare_quant` turns the reference quantized matrix into the backend's
/// quantized form (CPU: `|q| Box::new(q.clone())`).
pub fn check_all<B: Backend>(
    b: &B,
    prepare_quant: &dyn Fn(&RowScaledQ8) -> Box<B::QuantMatrix>,
) -> CheckResult {
    for case in CASES {
        let r = run_case(case.name, b, prepare_quant).expect("every case in CASES runs");
        r.map_err(|e| format!("{}: {e}", case.name))?;
    }
    Ok(())
}
