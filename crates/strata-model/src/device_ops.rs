//! Steps the device towers (vision and audio) share, each into a fresh f32 buffer: a
//! product, an RMSNorm, and copies of whole rows.

use strata_kernels::{Backend, DType, DeviceBuffer, MatmulShape, RmsNormParams, StridedCopy};

use crate::error::Result;

/// A product's weight on a backend.
pub(crate) struct Matrix<B: Backend> {
    pub(crate) w: B::Buffer,
    pub(crate) shape: MatmulShape,
}

impl<B: Backend> Matrix<B> {
    /// `w [rows, cols]` (row-major, f32 on the host) on `b` as `dtype`.
    pub(crate) fn upload(b: &B, w: &[f32], rows: usize, cols: usize, dtype: DType) -> Result<Self> {
        Ok(Self {
            w: b.upload_f32_as(w, dtype)?,
            shape: MatmulShape {
                in_features: cols,
                out_features: rows,
            },
        })
    }

    /// `x [rows, in] W^T`.
    pub(crate) fn apply(&self, b: &B, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        let mut out = b.scratch(rows * self.shape.out_features, DType::F32)?;
        b.matmul(x, &self.w, self.shape, &mut out)?;
        Ok(out)
    }
}

/// RMSNorm of `x`'s rows of `dim` values, times `w` when given.
pub(crate) fn rms_norm<B: Backend>(
    b: &B,
    x: &B::Buffer,
    w: Option<&B::Buffer>,
    dim: usize,
    eps: f32,
) -> Result<B::Buffer> {
    let mut out = b.scratch(x.len(), DType::F32)?;
    b.rms_norm(x, w, RmsNormParams::new(dim, eps), &mut out)?;
    Ok(out)
}

/// `rows` whole rows of `cols` values from element `src_offset` to element `dst_offset`.
pub(crate) fn contiguous(
    rows: usize,
    cols: usize,
    src_offset: usize,
    dst_offset: usize,
) -> StridedCopy {
    StridedCopy {
        rows,
        cols,
        src_offset,
        src_stride: cols,
        dst_offset,
        dst_stride: cols,
    }
}

/// A copy of `x` (f32).
pub(crate) fn copy<B: Backend>(b: &B, x: &B::Buffer) -> Result<B::Buffer> {
    let mut out = b.scratch(x.len(), DType::F32)?;
    b.copy_strided(x, &mut out, contiguous(1, x.len(), 0, 0))?;
    Ok(out)
}
