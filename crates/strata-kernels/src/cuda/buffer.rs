//! Device buffers: f32, or bf16 / f16 kept as raw 16-bit patterns.

use cudarc::driver::CudaSlice;

use crate::{DType, DeviceBuffer, KernelError, Result};

pub(super) enum Storage {
    F32(CudaSlice<f32>),
    /// BF16 or F16 bits (the kernels widen them by dtype code).
    Bits16(CudaSlice<u16>),
}

/// A device allocation of `len` elements of `dtype`. Empty buffers hold one unused element,
/// since a zero-byte device allocation is not portable.
pub struct CudaBuffer {
    pub(super) storage: Storage,
    pub(super) len: usize,
    pub(super) dtype: DType,
}

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

/// The dtype codes the kernels switch on (`STRATA_F32` ... in `kernels/common.cuh`).
pub(super) fn dtype_code(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
    }
}

impl CudaBuffer {
    /// The f32 slice of an activation buffer, or a dtype error naming `op`.
    pub(super) fn f32s(&self, op: &'static str) -> Result<&CudaSlice<f32>> {
        match &self.storage {
            Storage::F32(s) => Ok(s),
            Storage::Bits16(_) => Err(KernelError::DType {
                op,
                dtype: self.dtype,
            }),
        }
    }

    pub(super) fn f32s_mut(&mut self, op: &'static str) -> Result<&mut CudaSlice<f32>> {
        match &mut self.storage {
            Storage::F32(s) => Ok(s),
            Storage::Bits16(_) => Err(KernelError::DType {
                op,
                dtype: self.dtype,
            }),
        }
    }
}
