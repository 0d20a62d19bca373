//! Products split over k ([`Backend::matmul_parts`]), the residual norms that add the
//! parts ([`RmsNormParams::parts`]) and the head norm with RoPE that does
//! ([`Backend::head_norm_rope_parts_idx`]).

use super::fused::inv_freq_with_zero_tail;
use super::{compare, ctx, get, CheckResult, TestData, Tolerance};
use crate::cpu::CpuBackend;
use crate::{
    Backend, DType, MatmulShape, ResidualStep as Step, RmsNormParams, RopeAt, RopeParams, RopeStyle,
};

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
    check_norms_of_parts(b)?;
    check_head_norm_rope_of_parts(b)
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
        let whole = summed_parts(&y, parts, dim);
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
                same_as_summed_and_cpu(&what, &got, &summed, &on_cpu)?;
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
            Self::AddNorm => {
                b.residual_norm(&mut rb, &yb, p, Step::norm_add_norm(w1, 1.0, w2, &mut out))?
            }
            Self::AddScaleNorm => {
                b.residual_norm(&mut rb, &yb, p, Step::norm_add_norm(w1, 0.37, w2, &mut out))?
            }
            Self::NormAdd => b.residual_norm(&mut rb, &yb, p, Step::norm_then_add(w1, 0.61))?,
            Self::AddThenNorm => {
                b.residual_norm(&mut rb, &yb, p, Step::add_then_norm(w1, &mut out))?
            }
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

/// `head_norm_rope_parts_idx` over a KV-shared layer's q in parts: Gemma-4's head sizes with
/// f32 weights (a backend's fused form), none, and cases off it (a bf16 weight, an odd
/// head_dim, interleaved pairs), two to four parts, at far positions; each against
/// `head_norm_rope_idx` on the parts' sum (added in order in f32) on the same backend, and
/// against the CPU backend.
fn check_head_norm_rope_of_parts<B: Backend>(b: &B) -> CheckResult {
    let cases = [
        (
            5usize,
            8usize,
            256usize,
            2usize,
            Some(DType::F32),
            RopeStyle::Neox,
            0usize,
        ),
        (3, 8, 512, 2, Some(DType::F32), RopeStyle::Neox, 192),
        (4, 2, 128, 4, None, RopeStyle::Neox, 4),
        (2, 3, 64, 3, Some(DType::F32), RopeStyle::Neox, 0),
        (3, 2, 256, 2, Some(DType::BF16), RopeStyle::Neox, 0),
        (2, 2, 96, 2, Some(DType::F32), RopeStyle::Neox, 6),
        (2, 2, 128, 2, Some(DType::F32), RopeStyle::Interleaved, 0),
    ];
    for (seed, &(tokens, heads, d, parts, w_dtype, style, zero_tail)) in cases.iter().enumerate() {
        let what = format!(
            "head_norm_rope_parts {tokens}x{heads}x{d} in {parts} parts, {w_dtype:?}, {style:?}"
        );
        let width = heads * d;
        let mut data = TestData::new(900 + seed as u64);
        let x = data.normals(tokens * parts * width, 1.5, DType::F32);
        let w = w_dtype.map(|dt| (data.normals(d, 0.5, dt), dt));
        let positions: Vec<u32> = (0..tokens).map(|i| (i * 1231 + 7) as u32).collect();
        let inv_freq = inv_freq_with_zero_tail(d, zero_tail);
        let whole = summed_parts(&x, parts, width);
        let rope = RopeParams {
            n_heads: heads,
            head_dim: d,
            style,
        };
        let norm = RmsNormParams::new(d, 1e-6);
        let ins = HeadIns {
            w: w.as_ref().map(|(w, dt)| (w.as_slice(), *dt)),
            positions: &positions,
            inv_freq: &inv_freq,
            norm,
            rope,
        };
        let got = ctx(&what, ins.run(b, &x, parts))?;
        let summed = ctx(&what, ins.run(b, &whole, 1))?;
        let on_cpu = ctx(&what, ins.run(&CpuBackend::new(), &x, parts))?;
        same_as_summed_and_cpu(&what, &got, &summed, &on_cpu)?;
    }
    Ok(())
}

/// A head norm check's inputs besides the normed one.
pub(super) struct HeadIns<'a> {
    /// The norm's weight and the dtype it is uploaded as.
    pub(super) w: Option<(&'a [f32], DType)>,
    pub(super) positions: &'a [u32],
    pub(super) inv_freq: &'a [f32],
    pub(super) norm: RmsNormParams,
    pub(super) rope: RopeParams,
}

impl HeadIns<'_> {
    /// The op over `input` in `parts` parts (`head_norm_rope_parts_idx`), or over a whole
    /// input (`head_norm_rope_idx`) when `parts` is 1.
    pub(super) fn run<B: Backend>(
        &self,
        b: &B,
        input: &[f32],
        parts: usize,
    ) -> crate::Result<Vec<f32>> {
        let xb = b.upload_f32_as(input, DType::F32)?;
        let wb = self.w.map(|(w, dt)| b.upload_f32_as(w, dt)).transpose()?;
        let pos = b.upload_index(self.positions)?;
        let freqs = b.upload_f32_as(self.inv_freq, DType::F32)?;
        let (norm, rope) = (self.norm, self.rope);
        let at = RopeAt {
            positions: &pos,
            inv_freq: &freqs,
        };
        let out = if parts > 1 {
            let mut out = b.zeros(input.len() / parts, DType::F32)?;
            let norm = norm.with_parts(parts);
            b.head_norm_rope_parts_idx(&xb, &mut out, wb.as_ref(), norm, at, rope)?;
            out
        } else {
            let mut xb = xb;
            b.head_norm_rope_idx(&mut xb, wb.as_ref(), norm, at, rope)?;
            xb
        };
        b.download(&out)
    }
}

/// `[rows, parts, width]` summed to `[rows, width]`, each row's parts added in order in f32
/// (the definition of an input in parts).
fn summed_parts(y: &[f32], parts: usize, width: usize) -> Vec<f32> {
    let mut whole = vec![0f32; y.len() / parts];
    for (o, row) in whole
        .chunks_exact_mut(width)
        .zip(y.chunks_exact(parts * width))
    {
        o.copy_from_slice(&row[..width]);
        for part in row[width..].chunks_exact(width) {
            for (a, &v) in o.iter_mut().zip(part) {
                *a += v;
            }
        }
    }
    whole
}

/// `got` against the same op on the parts' sum and against the CPU backend, at f32's
/// tolerance.
fn same_as_summed_and_cpu(what: &str, got: &[f32], summed: &[f32], on_cpu: &[f32]) -> CheckResult {
    for (against, want) in [("the summed input", summed), ("the CPU", on_cpu)] {
        let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        let mag: Vec<f64> = want64.iter().map(|v| v.abs()).collect();
        let what = format!("{what}, against {against}");
        compare(&what, got, &want64, &mag, Tolerance::for_dtype(DType::F32))?;
    }
    Ok(())
}
