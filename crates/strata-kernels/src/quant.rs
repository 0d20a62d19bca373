//! The seam through which quantized weight formats (GGUF Q8_0, Q4_K, ...) reach the CPU
//! matmul and embedding kernels without this crate knowing any block layout.

use std::any::Any;
use std::ops::Range;

/// Shape of a `[rows, cols]` weight matrix (rows = output features, cols = input features).
pub trait MatrixShape {
    /// Number of rows (output features).
    fn rows(&self) -> usize;
    /// Number of columns (input features): the length of each row.
    fn cols(&self) -> usize;
}

/// Input vectors converted once per matmul by [`RowDot::prepare`] (for example quantized to
/// 8-bit blocks), in whatever form the implementation chooses. The CPU matmul keeps one per
/// thread and hands it back on the next call, so the memory is reused.
#[derive(Default)]
pub struct PreparedInput {
    /// The implementation's state; `prepare` may replace it with its own type.
    pub state: Option<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for PreparedInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedInput")
            .field("state", &self.state.is_some())
            .finish()
    }
}

/// A row-major matrix whose rows can be dotted with an f32 vector and dequantized, one row
/// at a time. The weights crate implements this for its quantized tensors; the kernels
/// parallelise over rows and never look inside a block.
pub trait RowDot: MatrixShape + Send + Sync {
    /// `sum_i W[row, i] * x[i]`; `x.len() == self.cols()`.
    fn dot_row(&self, row: usize, x: &[f32]) -> f32;

    /// Writes the `cols()` values of `row` as f32 into `out`.
    fn dequant_row(&self, row: usize, out: &mut [f32]);

    /// Bytes the matrix's stored form takes (a product reads them all once). The default
    /// counts f32 values.
    fn stored_bytes(&self) -> usize {
        self.rows() * self.cols() * 4
    }

    /// Dots `row` with several inputs at once: `xs` holds `out.len()` vectors of `cols()`
    /// values back to back. Formats can override it to decode each block once for all
    /// inputs; the default calls [`RowDot::dot_row`] per input.
    fn dot_row_many(&self, row: usize, xs: &[f32], out: &mut [f32]) {
        let cols = self.cols();
        for (o, x) in out.iter_mut().zip(xs.chunks_exact(cols)) {
            *o = self.dot_row(row, x);
        }
    }

    /// Converts the `xs.len() / cols()` input vectors of a matmul once, before any row is
    /// dotted (a format with an integer kernel quantizes them to 8 bits here). Returns
    /// `false` when the format has no such path; the matmul then uses [`RowDot::dot_row`] /
    /// [`RowDot::dot_row_many`]. The default has none.
    ///
    /// Results through this path may differ from [`RowDot::dot_row`] by the error of the
    /// conversion (for 8-bit activations: at most half a quantization step of each
    /// activation block times the block's `sum |w|`).
    fn prepare(&self, _xs: &[f32], _input: &mut PreparedInput) -> bool {
        false
    }

    /// What [`RowDot::prepare`] makes of an input, as a key: inputs prepared for one matrix
    /// serve every matrix with the same key and `cols()`, so products that read one input
    /// (a layer's q, k and v; gate and up) convert it once. `None`, the default, shares
    /// with nothing.
    fn prepared_key(&self) -> Option<u64> {
        None
    }

    /// `out[i * stride + j] = W[rows.start + i] . x[tokens.start + j]` for inputs that
    /// [`RowDot::prepare`] converted (and returned `true` for). The default, never called
    /// for a format whose `prepare` returns `false`, writes NaN.
    fn dot_prepared(
        &self,
        rows: Range<usize>,
        _input: &PreparedInput,
        tokens: Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        for i in 0..rows.len() {
            out[i * stride..i * stride + tokens.len()].fill(f32::NAN);
        }
    }
}
