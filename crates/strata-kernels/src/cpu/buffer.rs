//! The CPU backend's buffer: a plain vector of one of the supported dtypes.

use crate::{DType, DeviceBuffer, KernelError, Result};
use half::{bf16, f16};

/// Host memory buffer. Activations are `F32`; weights may be any variant.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuBuffer {
    /// f32 values (every activation).
    F32(Vec<f32>),
    /// bf16 values (weights).
    BF16(Vec<bf16>),
    /// f16 values (weights).
    F16(Vec<f16>),
}

impl DeviceBuffer for CpuBuffer {
    fn len(&self) -> usize {
        match self {
            CpuBuffer::F32(v) => v.len(),
            CpuBuffer::BF16(v) => v.len(),
            CpuBuffer::F16(v) => v.len(),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            CpuBuffer::F32(_) => DType::F32,
            CpuBuffer::BF16(_) => DType::BF16,
            CpuBuffer::F16(_) => DType::F16,
        }
    }

    fn capacity(&self) -> usize {
        match self {
            CpuBuffer::F32(v) => v.capacity(),
            CpuBuffer::BF16(v) => v.capacity(),
            CpuBuffer::F16(v) => v.capacity(),
        }
    }

    fn set_len(&mut self, len: usize) -> Result<()> {
        crate::error::ensure(len <= self.capacity(), "set_len", || {
            format!("{len} elements past a capacity of {}", self.capacity())
        })?;
        // Within the capacity a resize does not reallocate.
        match self {
            CpuBuffer::F32(v) => v.resize(len, 0.0),
            CpuBuffer::BF16(v) => v.resize(len, bf16::ZERO),
            CpuBuffer::F16(v) => v.resize(len, f16::ZERO),
        }
        Ok(())
    }
}

impl CpuBuffer {
    /// The f32 contents, or a dtype error naming `op` (activations must be f32 here).
    pub fn f32s(&self, op: &'static str) -> Result<&[f32]> {
        match self {
            CpuBuffer::F32(v) => Ok(v),
            other => Err(KernelError::DType {
                op,
                dtype: other.dtype(),
            }),
        }
    }

    /// The f32 contents, mutable, or a dtype error naming `op`.
    pub fn f32s_mut(&mut self, op: &'static str) -> Result<&mut [f32]> {
        match self {
            CpuBuffer::F32(v) => Ok(v),
            other => Err(KernelError::DType {
                op,
                dtype: other.dtype(),
            }),
        }
    }

    /// The whole buffer widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            CpuBuffer::F32(v) => v.clone(),
            CpuBuffer::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuBuffer::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }

    /// Widens `len` elements starting at `start` into `out`.
    pub fn widen_range(&self, start: usize, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        let end = start + out.len();
        match self {
            CpuBuffer::F32(v) => out.copy_from_slice(&v[start..end]),
            CpuBuffer::BF16(v) => v[start..end].convert_to_f32_slice(out),
            CpuBuffer::F16(v) => v[start..end].convert_to_f32_slice(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_len_moves_within_the_allocation_and_refuses_past_it() {
        let mut b = CpuBuffer::F32(vec![1.0; 8]);
        let at = |b: &CpuBuffer| match b {
            CpuBuffer::F32(v) => v.as_ptr(),
            _ => unreachable!(),
        };
        let first = at(&b);
        b.set_len(3).unwrap();
        assert_eq!((b.len(), b.capacity()), (3, 8));
        b.set_len(8).unwrap();
        assert_eq!(b.len(), 8);
        assert_eq!(at(&b), first, "the same allocation");
        let err = b.set_len(9).unwrap_err();
        assert!(matches!(err, KernelError::Shape { .. }), "{err}");
        assert_eq!(b.len(), 8, "unchanged by the refused call");
    }
}
