//! Dense matmul through cuBLAS SGEMM, and the CUDA form of a quantized weight.
//!
//! Activations are f32 and must stay f32-accurate, and cuBLAS has no f32 x bf16 product, so
//! a BF16 / F16 weight is first widened (exactly) to an f32 scratch matrix. That costs a
//! pass over the weight and a scratch allocation per call: correct first; a fused
//! low-precision path (bf16 activations, cuBLASLt) can replace it later.

use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::CudaSlice;

use super::buffer::{CudaBuffer, Storage};
use super::{device_err, CudaBackend};
use crate::error::ensure;
use crate::{
    Backend, DType, DeviceBuffer, HostSlice, KernelError, MatmulShape, MatrixShape, Result,
};

/// A quantized weight as CUDA computes with it: the matrix dequantized on upload to a dense
/// device matrix (BF16 for GGUF block formats; F32 where exactness matters, as in the
/// conformance checks). `[rows, cols]`, rows = output features.
pub struct CudaQuantMatrix {
    pub(super) w: CudaBuffer,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl CudaQuantMatrix {
    /// Uploads a dense `[rows, cols]` host matrix of any dtype.
    pub fn upload(b: &CudaBackend, rows: usize, cols: usize, data: HostSlice<'_>) -> Result<Self> {
        ensure(data.len() == rows * cols, "CudaQuantMatrix", || {
            format!("{} values for {rows} x {cols}", data.len())
        })?;
        Ok(Self {
            w: b.upload(data)?,
            rows,
            cols,
        })
    }

    /// Uploads f32 host values rounded to `dtype`.
    pub fn from_f32(
        b: &CudaBackend,
        rows: usize,
        cols: usize,
        data: &[f32],
        dtype: DType,
    ) -> Result<Self> {
        ensure(data.len() == rows * cols, "CudaQuantMatrix", || {
            format!("{} values for {rows} x {cols}", data.len())
        })?;
        Ok(Self {
            w: b.upload_f32_as(data, dtype)?,
            rows,
            cols,
        })
    }

    pub fn dtype(&self) -> DType {
        self.w.dtype()
    }

    pub fn into_arc(self) -> Arc<Self> {
        Arc::new(self)
    }
}

impl MatrixShape for CudaQuantMatrix {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

fn as_c_int(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Invalid {
        op,
        detail: format!("dimension {v} exceeds cuBLAS's 32-bit sizes"),
    })
}

impl CudaBackend {
    pub(super) fn matmul_impl(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        shape: MatmulShape,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "matmul";
        let (k, n) = (shape.in_features, shape.out_features);
        ensure(k > 0 && x.len().is_multiple_of(k), OP, || {
            format!("x of {} is not rows of {k}", x.len())
        })?;
        let t = x.len() / k;
        ensure(w.len() == n * k, OP, || {
            format!("weight has {}, want {n} x {k}", w.len())
        })?;
        ensure(out.len() == t * n, OP, || {
            format!("out has {}, want {t} x {n}", out.len())
        })?;
        let xs = x.f32s(OP)?;
        let os = out.f32s_mut(OP)?;
        if t == 0 || n == 0 {
            return Ok(());
        }
        let widened: CudaSlice<f32>;
        let ws: &CudaSlice<f32> = match &w.storage {
            Storage::F32(s) => s,
            Storage::Bits16(_) => {
                // SAFETY: every element is written by the widening kernel before the GEMM.
                let mut scratch = unsafe { self.stream.alloc::<f32>(w.len()) }
                    .map_err(device_err("allocating matmul scratch"))?;
                self.widen_into(w, &mut scratch)?;
                widened = scratch;
                &widened
            }
        };
        // Row-major out[t, n] = x[t, k] * W[n, k]^T is, column-major, out^T = W^T * x^T:
        // A = W viewed as a k x n column-major matrix (transposed), B = x as k x t.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: as_c_int(OP, n)?,
            n: as_c_int(OP, t)?,
            k: as_c_int(OP, k)?,
            alpha: 1.0f32,
            lda: as_c_int(OP, k)?,
            ldb: as_c_int(OP, k)?,
            beta: 0.0f32,
            ldc: as_c_int(OP, n)?,
        };
        self.ctx
            .bind_to_thread()
            .map_err(device_err("binding the GPU context"))?;
        // SAFETY: the three matrices hold n*k, t*k and t*n elements (checked above); the
        // slices may be one element longer (empty-buffer placeholder), which cuBLAS ignores.
        let blas = self
            .blas
            .lock()
            .map_err(|_| KernelError::Device("the cuBLAS handle's lock is poisoned".into()))?;
        unsafe { blas.gemm(cfg, ws, &xs.slice(..t * k), os) }
            .map_err(|e| KernelError::Device(format!("{OP}: cuBLAS SGEMM: {e:?}")))?;
        Ok(())
    }
}
