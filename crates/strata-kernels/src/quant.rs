//! The seam through which quantized weight formats (GGUF Q8_0, Q4_K, ...) reach the CPU
//! matmul and embedding kernels without this crate knowing any block layout.

/// Shape of a `[rows, cols]` weight matrix (rows = output features, cols = input features).
pub trait MatrixShape {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
}

/// A row-major matrix whose rows can be dotted with an f32 vector and dequantized, one row
/// at a time. The weights crate implements this for its quantized tensors; the kernels
/// parallelise over rows and never look inside a block.
pub trait RowDot: MatrixShape + Send + Sync {
    /// `sum_i W[row, i] * x[i]`; `x.len() == self.cols()`.
    fn dot_row(&self, row: usize, x: &[f32]) -> f32;

    /// Writes the `cols()` values of `row` as f32 into `out`.
    fn dequant_row(&self, row: usize, out: &mut [f32]);

    /// Dots `row` with several inputs at once: `xs` holds `out.len()` vectors of `cols()`
    /// values back to back. Formats can override it to decode each block once for all
    /// inputs; the default calls [`RowDot::dot_row`] per input.
    fn dot_row_many(&self, row: usize, xs: &[f32], out: &mut [f32]) {
        let cols = self.cols();
        for (o, x) in out.iter_mut().zip(xs.chunks_exact(cols)) {
            *o = self.dot_row(row, x);
        }
    }
}
