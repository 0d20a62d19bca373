//! RMSNorm and its fused residual forms.

use super::{compare, ctx, get, put, reference, CheckResult, TestData, Tolerance};
use crate::{Backend, DType, ResidualStep, RmsNormParams};

/// Which of the three norm ops to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormVariant {
    /// `out = norm(x)`
    Plain,
    /// `residual += x; out = norm(residual)`
    AddThenNorm,
    /// `residual += norm(x)`
    NormThenAdd,
}

/// One RMSNorm check: `rows` random rows of `dim`, through one of the three norm ops.
#[derive(Clone, Copy, Debug)]
pub struct RmsNormCase {
    /// Rows normed (every third one tiny, so eps matters).
    pub rows: usize,
    /// Elements a row ([`RmsNormParams::dim`]).
    pub dim: usize,
    /// Dtype of the weight, or None for the scale-free norm.
    pub weight: Option<DType>,
    /// [`RmsNormParams::weight_offset`].
    pub weight_offset: f32,
    /// [`RmsNormParams::eps`].
    pub eps: f32,
    /// Which op runs.
    pub variant: NormVariant,
    /// Seed of the [`TestData`] inputs.
    pub seed: u64,
}

/// The case's norm op against [`reference::rms_norm`]: the output and, for the fused
/// forms, the updated residual.
pub fn check_rms_norm_case<B: Backend>(b: &B, c: RmsNormCase) -> CheckResult {
    let act = b.activation_dtype();
    let tol = Tolerance::for_dtype(act);
    let mut data = TestData::new(c.seed);
    let n = c.rows * c.dim;
    // Non-unit scale and an offset mean so the normalisation visibly matters; every third
    // row is tiny (mean square ~1e-5) so the placement of eps matters too.
    let x: Vec<f32> = (0..n)
        .map(|i| {
            let small = if (i / c.dim) % 3 == 2 { 1e-3 } else { 1.0 };
            act.round((data.normal() * 3.0 + 0.5) * small)
        })
        .collect();
    let w: Option<Vec<f32>> = c.weight.map(|dt| {
        (0..c.dim)
            .map(|_| dt.round(1.0 + 0.3 * data.normal()))
            .collect()
    });
    let residual = data.normals(n, 2.0, act);
    let p = RmsNormParams {
        dim: c.dim,
        eps: c.eps,
        weight_offset: c.weight_offset,
        parts: 1,
    };
    let what = format!("rms_norm {c:?}");
    let xb = put(b, &x, act)?;
    let wb = match (&w, c.weight) {
        (Some(w), Some(dt)) => Some(put(b, w, dt)?),
        _ => None,
    };
    let norm = |x: &[f32]| reference::rms_norm(x, w.as_deref(), c.weight_offset, c.eps, c.dim);
    match c.variant {
        NormVariant::Plain => {
            let mut out = ctx(&what, b.zeros(n, act))?;
            ctx(&what, b.rms_norm(&xb, wb.as_ref(), p, &mut out))?;
            normed_matches(&what, &get(b, &out)?, &norm(&x), tol)
        }
        NormVariant::AddThenNorm => {
            let mut rb = put(b, &residual, act)?;
            let mut out = ctx(&what, b.zeros(n, act))?;
            ctx(
                &what,
                b.residual_norm(
                    &mut rb,
                    &xb,
                    p,
                    ResidualStep::add_then_norm(wb.as_ref(), &mut out),
                ),
            )?;
            // The updated residual is stored in the activation dtype; the norm reads that.
            let summed: Vec<f32> = residual
                .iter()
                .zip(&x)
                .map(|(r, v)| act.round(r + v))
                .collect();
            let summed64: Vec<f64> = summed.iter().map(|&v| v as f64).collect();
            compare(
                &format!("{what} (residual)"),
                &get(b, &rb)?,
                &summed64,
                &[],
                tol,
            )?;
            normed_matches(&what, &get(b, &out)?, &norm(&summed), tol)
        }
        NormVariant::NormThenAdd => {
            let mut rb = put(b, &residual, act)?;
            let step = ResidualStep::norm_then_add(wb.as_ref(), 1.0);
            ctx(&what, b.residual_norm(&mut rb, &xb, p, step))?;
            let normed = norm(&x);
            let want: Vec<f64> = residual
                .iter()
                .zip(&normed)
                .map(|(&r, &v)| r as f64 + v)
                .collect();
            let mag: Vec<f64> = residual
                .iter()
                .zip(&normed)
                .map(|(&r, &v)| (r as f64).abs() + v.abs())
                .collect();
            compare(&what, &get(b, &rb)?, &want, &mag, tol)
        }
    }
}

/// Hidden-size rows, per-head rows (64..512), the scale-free norm, Gemma-3's `1 + w`,
/// bf16 weights, and each fused form; plus a shape error.
pub fn check_rms_norm<B: Backend>(b: &B) -> CheckResult {
    let variants = [
        NormVariant::Plain,
        NormVariant::AddThenNorm,
        NormVariant::NormThenAdd,
    ];
    let shapes = [(3, 1536), (5, 256), (2, 512), (7, 64), (1, 1), (4, 33)];
    let weights = [Some(DType::F32), Some(DType::BF16), None];
    let mut seed = 10;
    for (i, &(rows, dim)) in shapes.iter().enumerate() {
        for (j, &variant) in variants.iter().enumerate() {
            seed += 1;
            check_rms_norm_case(
                b,
                RmsNormCase {
                    rows,
                    dim,
                    weight: weights[(i + j) % 3],
                    weight_offset: if i % 2 == 1 { 1.0 } else { 0.0 },
                    eps: 1e-6,
                    variant,
                    seed,
                },
            )?;
        }
    }
    let x = put(b, &[1.0; 10], b.activation_dtype())?;
    let mut out = put(b, &[0.0; 10], b.activation_dtype())?;
    if b.rms_norm(&x, None, RmsNormParams::new(4, 1e-6), &mut out)
        .is_ok()
    {
        return Err("rms_norm accepted 10 elements in rows of 4".into());
    }
    Ok(())
}

/// A norm's output against its f64 reference, each value's magnitude its scale.
fn normed_matches(what: &str, got: &[f32], want: &[f64], tol: Tolerance) -> CheckResult {
    let mag: Vec<f64> = want.iter().map(|v| v.abs()).collect();
    compare(what, got, want, &mag, tol)
}
