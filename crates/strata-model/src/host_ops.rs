//! The encoders' host ops: their dense products, Gemma-4's clippable linears and RMSNorm.

use strata_weights::{WeightSource, Weights};

use crate::error::{ModelError, Result};

/// A linear layer without bias, `y = x W^T` for `W [rows, cols]` row-major, with its clamps
/// when the config has clipped linears (transformers' `Gemma4ClippableLinear`).
pub(crate) struct HostLinear {
    w: Vec<f32>,
    rows: usize,
    cols: usize,
    /// (input min, input max, output min, output max).
    clamp: Option<[f32; 4]>,
}

impl HostLinear {
    /// The `[rows, cols]` matrix `name`, unclamped.
    pub(crate) fn load(weights: &Weights, name: &str, rows: usize, cols: usize) -> Result<Self> {
        Ok(Self {
            w: weights.require(name, &[rows, cols])?.to_f32_vec()?,
            rows,
            cols,
            clamp: None,
        })
    }

    /// A clippable linear at `prefix` (`{prefix}.linear.weight`), with its four bounds
    /// (`{prefix}.input_min` ...) when `clipped`.
    pub(crate) fn load_clippable(
        weights: &Weights,
        prefix: &str,
        rows: usize,
        cols: usize,
        clipped: bool,
    ) -> Result<Self> {
        let mut l = Self::load(weights, &format!("{prefix}.linear.weight"), rows, cols)?;
        if clipped {
            let bound = |n: &str| -> Result<f32> {
                Ok(weights
                    .require(&format!("{prefix}.{n}"), &[])?
                    .to_f32_vec()?[0])
            };
            l.clamp = Some([
                bound("input_min")?,
                bound("input_max")?,
                bound("output_min")?,
                bound("output_max")?,
            ]);
        }
        Ok(l)
    }

    /// The matrix, its rows and its columns; for the device towers (which take no clamps).
    pub(crate) fn matrix(&self) -> (&[f32], usize, usize) {
        (&self.w, self.rows, self.cols)
    }

    /// (input min, input max, output min, output max), for a clipped linear.
    pub(crate) fn clamps(&self) -> Option<[f32; 4]> {
        self.clamp
    }

    /// `x [n, cols]` -> `[n, rows]`.
    pub(crate) fn apply(&self, x: &[f32]) -> Result<Vec<f32>> {
        match self.clamp {
            None => gemm_bt(x, &self.w, self.rows, self.cols),
            Some([imin, imax, omin, omax]) => {
                let xc: Vec<f32> = x.iter().map(|v| v.clamp(imin, imax)).collect();
                let mut y = gemm_bt(&xc, &self.w, self.rows, self.cols)?;
                y.iter_mut().for_each(|v| *v = v.clamp(omin, omax));
                Ok(y)
            }
        }
    }
}

/// Gemma-4's RMSNorm: `x * (mean(x^2) + eps)^-0.5`, times the weight as stored (not
/// 1 + weight) when given.
pub(crate) fn norm_in_place(row: &mut [f32], weight: Option<&[f32]>, eps: f64) {
    let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32 + eps as f32;
    let inv = ms.powf(-0.5);
    match weight {
        Some(w) => row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * inv * w),
        None => row.iter_mut().for_each(|v| *v *= inv),
    }
}

/// [`norm_in_place`] of each `width`-wide row of `x`.
pub(crate) fn rms_norm(x: &[f32], width: usize, weight: Option<&[f32]>, eps: f64) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(width) {
        norm_in_place(row, weight, eps);
    }
    out
}

/// `x [n, k] * w^T` for `w [m, k]` row-major -> `[n, m]`: a register-blocked, cache-tiled
/// f32 GEMM on every core (`matrixmultiply`). The encoder's products are large and dense
/// (thousands of patches or frames by the tower's width), where a GEMM beats the
/// decode-shaped products of the CPU backend several times over.
pub(crate) fn gemm_bt(x: &[f32], w: &[f32], m: usize, k: usize) -> Result<Vec<f32>> {
    let n = x.len() / k.max(1);
    if x.len() != n * k || w.len() != m * k {
        return Err(ModelError::Invalid(format!(
            "a product of {} values by a {m}x{k} matrix",
            x.len()
        )));
    }
    let mut y = vec![0.0f32; n * m];
    if n == 0 || m == 0 || k == 0 {
        return Ok(y);
    }
    // SAFETY: the pointers cover `x` ([n, k], row stride k), `w` read as its transpose
    // ([k, m]: row stride 1, column stride k) and `y` ([n, m], row stride m), whose lengths
    // were checked above; `y` is written only.
    unsafe {
        matrixmultiply::sgemm(
            n,
            k,
            m,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            0.0,
            y.as_mut_ptr(),
            m as isize,
            1,
        );
    }
    Ok(y)
}
