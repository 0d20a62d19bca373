//! The encoders' dense products on the host.

use crate::error::{ModelError, Result};

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
