//! Products split over k ([`Backend::matmul_parts`]) and the residual norms that add the
//! parts ([`RmsNormParams::parts`]).

use super::{compare, ctx, get, CheckResult, TestData, Tolerance};
use crate::cpu::CpuBackend;
use crate::{Backend, DType, MatmulShape, RmsNormParams};

/// Each part against its f64 definition, at decode row counts (the parts' lengths of
/// E2B's and E4B's products, fewer outputs to keep the f64 reference quick) and a small
/// odd shape; then every residual norm over inputs in parts.
pub fn check_k_parts<B: Backend>(b: &B) -> CheckResult {
    for (seed, &(rows, k, n, parts)) in [
        (3usize, 64usize, 48usize, 2usize),
        (100, 6144, 96, 4),
        (72, 2048, 256, 4),
        (104, 10240, 40, 2),
    ]
    .iter()
    .enumerate()
    {
        check_matmul_parts(b, seed as u64, rows, k, n, parts)?;
    }
    check_norms_of_parts(b)
}

fn check_matmul_parts<B: Backend>(
    b: &B,
    seed: u64,
    rows: usize,
    k: usize,
    n: usize,
    parts: usize,
) -> CheckResult {
    let what = format!("matmul_parts {rows} x {k} -> {n} in {parts} parts");
    let mut data = TestData::new(700 + seed);
    // bf16 values throughout, so a backend that rounds x to bf16 is judged on its sums.
    let x = data.normals(rows * k, 1.0, DType::BF16);
    let w = data.normals(n * k, 0.05, DType::BF16);
    let shape = MatmulShape {
        in_features: k,
        out_features: n,
    };
    let xb = ctx(&what, b.upload_f32_as(&x, DType::F32))?;
    let wb = ctx(&what, b.upload_f32_as(&w, DType::BF16))?;
    let mut out = ctx(&what, b.zeros(rows * parts * n, DType::F32))?;
    ctx(&what, b.matmul_parts(&xb, &wb, shape, parts, &mut out))?;
    let got = get(b, &out)?;
    let kp = k / parts;
    let (mut want, mut mag) = (Vec::new(), Vec::new());
    for r in 0..rows {
        for p in 0..parts {
            for j in 0..n {
                let span = p * kp..(p + 1) * kp;
                let terms = x[r * k..(r + 1) * k][span.clone()]
                    .iter()
                    .zip(&w[j * k..(j + 1) * k][span])
                    .map(|(&a, &c)| a as f64 * c as f64);
                let (s, m) = terms.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
                want.push(s);
                mag.push(m);
            }
        }
    }
    compare(&what, &got, &want, &mag, Tolerance::for_dtype(DType::F32))
}

/// The norm forms a model step runs after a product in parts, with f32 weights (their own
/// entry points) and bf16 weights, two to five parts: each against the same op on the
/// parts' sum (added in order in f32, as the parts' definition has it) on the same
/// backend, and against the CPU backend.
fn check_norms_of_parts<B: Backend>(b: &B) -> CheckResult {
    let (rows, dim) = (37usize, 1536usize);
    for (seed, &(parts, w_dtype)) in [
        (2usize, DType::F32),
        (4, DType::F32),
        (3, DType::F32),
        (5, DType::F32),
        (4, DType::BF16),
    ]
    .iter()
    .enumerate()
    {
        let mut data = TestData::new(800 + seed as u64);
        let y = data.normals(rows * parts * dim, 1.0, DType::F32);
        let r = data.normals(rows * dim, 3.0, DType::F32);
        let w1 = data.normals(dim, 0.5, w_dtype);
        let w2 = data.normals(dim, 0.5, w_dtype);
        let mut whole = vec![0f32; rows * dim];
        for (o, row) in whole.chunks_exact_mut(dim).zip(y.chunks_exact(parts * dim)) {
            o.copy_from_slice(&row[..dim]);
            for part in row[dim..].chunks_exact(dim) {
                for (a, &v) in o.iter_mut().zip(part) {
                    *a += v;
                }
            }
        }
        let p = RmsNormParams::new(dim, 1e-6);
        let ins = NormIns {
            r: &r,
            w1: &w1,
            w2: &w2,
            w_dtype,
        };
        for form in NormForm::ALL {
            for residual_out in [false, true] {
                let what = format!("{form:?} over {parts} parts, {w_dtype:?} weights");
                let run = |b: &B, y: &[f32], p| form.run(b, &ins, y, p, residual_out);
                let got = get(b, &ctx(&what, run(b, &y, p.with_parts(parts)))?)?;
                let summed = get(b, &ctx(&what, run(b, &whole, p))?)?;
                let cpu = CpuBackend::new();
                let on_cpu = ctx(
                    &what,
                    form.run(&cpu, &ins, &y, p.with_parts(parts), residual_out),
                )?;
                let on_cpu = get(&cpu, &on_cpu)?;
                for (against, want) in [("the summed input", &summed), ("the CPU", &on_cpu)] {
                    let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
                    let mag: Vec<f64> = want64.iter().map(|v| v.abs()).collect();
                    let what = format!("{what}, against {against}");
                    compare(&what, &got, &want64, &mag, Tolerance::for_dtype(DType::F32))?;
                }
            }
        }
    }
    Ok(())
}

/// A norm check's inputs besides the normed one.
struct NormIns<'a> {
    r: &'a [f32],
    w1: &'a [f32],
    w2: &'a [f32],
    w_dtype: DType,
}

/// The residual norms that read a product in parts.
#[derive(Clone, Copy, Debug)]
enum NormForm {
    AddNorm,
    AddScaleNorm,
    NormAdd,
    AddThenNorm,
    Plain,
}

impl NormForm {
    const ALL: [Self; 5] = [
        Self::AddNorm,
        Self::AddScaleNorm,
        Self::NormAdd,
        Self::AddThenNorm,
        Self::Plain,
    ];

    /// Runs the form over `y`; returns the residual (where the form writes one and
    /// `residual_out`) or the output.
    fn run<B: Backend>(
        self,
        b: &B,
        i: &NormIns<'_>,
        y: &[f32],
        p: RmsNormParams,
        residual_out: bool,
    ) -> crate::Result<B::Buffer> {
        let mut rb = b.upload_f32_as(i.r, DType::F32)?;
        let yb = b.upload_f32_as(y, DType::F32)?;
        let w1 = b.upload_f32_as(i.w1, i.w_dtype)?;
        let w2 = b.upload_f32_as(i.w2, i.w_dtype)?;
        let mut out = b.zeros(i.r.len(), DType::F32)?;
        let (w1, w2) = (Some(&w1), Some(&w2));
        match self {
            Self::AddNorm => b.rms_norm_add_norm(&mut rb, &yb, w1, w2, p, &mut out)?,
            Self::AddScaleNorm => {
                b.rms_norm_add_scale_norm(&mut rb, &yb, [w1, w2], p, 0.37, &mut out)?
            }
            Self::NormAdd => b.rms_norm_add_scale(&mut rb, &yb, w1, p, 0.61)?,
            Self::AddThenNorm => b.add_rms_norm(&mut rb, &yb, w1, p, &mut out)?,
            Self::Plain => b.rms_norm(&yb, w1, p, &mut out)?,
        }
        let writes_residual = !matches!(self, Self::Plain);
        let only_residual = matches!(self, Self::NormAdd);
        Ok(if only_residual || (residual_out && writes_residual) {
            rb
        } else {
            out
        })
    }
}
