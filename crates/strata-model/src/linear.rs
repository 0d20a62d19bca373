//! Weight matrices on a backend: dense (f32 / bf16 / f16) or quantized (GGUF block formats).

use std::sync::Arc;

use std::ops::Range;

use strata_kernels::cpu::{CpuBackend, PreparedInput};
use strata_kernels::{Backend, HostSlice, MatmulShape, MatrixShape, RowDot};
use strata_weights::{quant, GgmlType, TensorView};

use crate::error::{ModelError, Result};

/// A `[rows, cols]` weight matrix (rows = output features) ready for `matmul`.
pub enum Linear<B: Backend> {
    Dense {
        w: B::Buffer,
        rows: usize,
        cols: usize,
    },
    Quant(Arc<B::QuantMatrix>),
}

impl<B: Backend> Linear<B> {
    pub fn rows(&self) -> usize {
        match self {
            Linear::Dense { rows, .. } => *rows,
            Linear::Quant(q) => q.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Linear::Dense { cols, .. } => *cols,
            Linear::Quant(q) => q.cols(),
        }
    }

    /// `out [T, rows] = x [T, cols] * W^T`.
    pub fn forward(&self, b: &B, x: &B::Buffer, out: &mut B::Buffer) -> Result<()> {
        match self {
            Linear::Dense { w, rows, cols } => b.matmul(
                x,
                w,
                MatmulShape {
                    in_features: *cols,
                    out_features: *rows,
                },
                out,
            )?,
            Linear::Quant(q) => b.matmul_quant(x, q, out)?,
        }
        Ok(())
    }

    /// Rows of the matrix as embeddings: `out[t] = W[ids[t]] * scale`.
    pub fn embed(&self, b: &B, ids: &[u32], scale: f32, out: &mut B::Buffer) -> Result<()> {
        match self {
            Linear::Dense { w, cols, .. } => b.embedding(ids, w, *cols, scale, out)?,
            Linear::Quant(q) => b.embedding_quant(ids, q, scale, out)?,
        }
        Ok(())
    }
}

/// A quantized matrix in host memory, decoded block by block as rows are used.
pub struct QuantWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    bytes: Vec<u8>,
}

impl QuantWeight {
    pub fn new(view: &TensorView<'_>) -> Result<Self> {
        let (rows, cols) = (view.rows(), view.row_len());
        let row_bytes = view.row_bytes();
        let w = Self {
            ty: view.ty,
            rows,
            cols,
            row_bytes,
            bytes: view.bytes.to_vec(),
        };
        // Decoding one row proves the format is supported, so later calls cannot fail.
        let mut probe = vec![0.0; cols];
        quant::dequantize(w.ty, &w.bytes[..row_bytes], &mut probe)
            .map_err(|e| ModelError::Invalid(format!("{}: {e}", view.name)))?;
        Ok(w)
    }
}

impl MatrixShape for QuantWeight {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

impl RowDot for QuantWeight {
    fn dot_row(&self, row: usize, x: &[f32]) -> f32 {
        let r = &self.bytes[row * self.row_bytes..(row + 1) * self.row_bytes];
        quant::dot_bytes(self.ty, r, x).unwrap_or(f32::NAN)
    }

    fn dequant_row(&self, row: usize, out: &mut [f32]) {
        let r = &self.bytes[row * self.row_bytes..(row + 1) * self.row_bytes];
        if quant::dequantize(self.ty, r, out).is_err() {
            out.fill(f32::NAN);
        }
    }

    /// Quantizes the activations to the 8-bit blocks this format's integer dot pairs with,
    /// once per matmul (see `strata_weights::quant::Q8Input` for the error bound).
    fn prepare(&self, xs: &[f32], input: &mut PreparedInput) -> bool {
        if !quant::has_q8_path(self.ty) {
            return false;
        }
        if !input
            .state
            .as_ref()
            .is_some_and(|s| s.is::<quant::Q8Input>())
        {
            input.state = Some(Box::new(quant::Q8Input::new()));
        }
        match input
            .state
            .as_mut()
            .and_then(|s| s.downcast_mut::<quant::Q8Input>())
        {
            Some(q) => q.quantize(self.ty, xs, self.cols),
            None => false,
        }
    }

    fn dot_prepared(
        &self,
        rows: Range<usize>,
        input: &PreparedInput,
        tokens: Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        match input
            .state
            .as_ref()
            .and_then(|s| s.downcast_ref::<quant::Q8Input>())
        {
            Some(q) => quant::dot_rows_q8(
                self.ty,
                &self.bytes,
                self.row_bytes,
                rows,
                q,
                tokens,
                out,
                stride,
            ),
            None => {
                for i in 0..rows.len() {
                    out[i * stride..i * stride + tokens.len()].fill(f32::NAN);
                }
            }
        }
    }
}

/// How a backend takes quantized weights.
pub trait QuantUpload: Backend {
    fn upload_quant(&self, w: QuantWeight) -> Result<Arc<Self::QuantMatrix>>;
}

impl QuantUpload for CpuBackend {
    fn upload_quant(&self, w: QuantWeight) -> Result<Arc<Self::QuantMatrix>> {
        Ok(Arc::new(w))
    }
}

/// Uploads a stored matrix: dense types as they are, block formats through `QuantUpload`.
pub fn upload_linear<B: QuantUpload>(b: &B, view: &TensorView<'_>) -> Result<Linear<B>> {
    let (rows, cols) = (view.rows(), view.row_len());
    let dense = |w| Ok(Linear::Dense { w, rows, cols });
    match view.ty {
        GgmlType::F32 => match view.as_f32() {
            Some(s) => dense(b.upload(HostSlice::F32(s))?),
            None => dense(b.upload(HostSlice::F32(&view.to_f32_vec()?))?),
        },
        GgmlType::BF16 => match view.as_bf16() {
            Some(s) => dense(b.upload(HostSlice::BF16(s))?),
            None => {
                let v: Vec<half::bf16> = view
                    .bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                    .collect();
                dense(b.upload(HostSlice::BF16(&v))?)
            }
        },
        GgmlType::F16 => match view.as_f16() {
            Some(s) => dense(b.upload(HostSlice::F16(s))?),
            None => {
                let v: Vec<half::f16> = view
                    .bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect();
                dense(b.upload(HostSlice::F16(&v))?)
            }
        },
        _ => Ok(Linear::Quant(b.upload_quant(QuantWeight::new(view)?)?)),
    }
}

/// A small vector (norm weight, scalar) decoded to f32 on the backend.
pub fn upload_vector<B: Backend>(b: &B, view: &TensorView<'_>) -> Result<B::Buffer> {
    Ok(b.upload(HostSlice::F32(&view.to_f32_vec()?))?)
}
