//! bitsandbytes 4-bit matrices kept 4-bit on the CPU: each product decodes a row's codes
//! into f32 (bitsandbytes' values, rounded to the state's dtype) as it dots them, so the
//! matrix takes about 0.56 bytes a weight instead of a dense copy's 2.

use std::cell::RefCell;

use strata_kernels::{MatrixShape, RowDot};
use strata_weights::bnb::Bnb4;

/// A [`Bnb4`] matrix as the CPU's products take it.
pub struct Bnb4Weight(pub Bnb4);

thread_local! {
    /// One decoded row a thread, reused across rows and products.
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl Bnb4Weight {
    /// Calls `f` with row `row` decoded.
    fn with_row<R>(&self, row: usize, f: impl FnOnce(&[f32]) -> R) -> R {
        let cols = self.0.cols();
        ROW.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize(cols, 0.0);
            self.0.decode(row * cols, &mut buf);
            f(&buf)
        })
    }
}

/// `w . x` with eight partial sums (vectorised by the compiler), in a fixed order.
fn dot(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(8));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for k in 0..8 {
            acc[k] += a[k] * b[k];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (a, b) in wr.iter().zip(xr) {
        s += a * b;
    }
    s
}

impl MatrixShape for Bnb4Weight {
    fn rows(&self) -> usize {
        self.0.rows()
    }
    fn cols(&self) -> usize {
        self.0.cols()
    }
}

impl RowDot for Bnb4Weight {
    fn dot_row(&self, row: usize, x: &[f32]) -> f32 {
        self.with_row(row, |w| dot(w, x))
    }

    fn dequant_row(&self, row: usize, out: &mut [f32]) {
        self.0.decode(row * self.0.cols(), out);
    }

    fn stored_bytes(&self) -> usize {
        self.0.stored_bytes()
    }

    /// The row decoded once for every input.
    fn dot_row_many(&self, row: usize, xs: &[f32], out: &mut [f32]) {
        let cols = self.0.cols();
        self.with_row(row, |w| {
            for (o, x) in out.iter_mut().zip(xs.chunks_exact(cols.max(1))) {
                *o = dot(w, x);
            }
        });
    }
}
