//! Device buffers: f32, or bf16 / f16 kept as raw 16-bit patterns.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, LaunchArgs, PushKernelArg};

use crate::{DType, DeviceBuffer, KernelError, Result};

pub(super) enum Storage {
    F32(CudaSlice<f32>),
    /// BF16 or F16 bits (the kernels widen them by dtype code).
    Bits16(CudaSlice<u16>),
}

/// A device allocation of `len` elements of `dtype`. Empty buffers hold one unused element,
/// since a zero-byte device allocation is not portable.
pub struct CudaBuffer {
    /// Written only through [`CudaBuffer::f32s_mut`] / [`CudaBuffer::storage_mut`], which
    /// mark the bf16 twin stale.
    pub(super) storage: Storage,
    pub(super) len: usize,
    pub(super) dtype: DType,
    /// A bf16 copy of an f32 activation, written by the kernel that produced the values
    /// (norms, gated activations) when a bf16 GEMM is to read them next: the GEMM then
    /// skips its narrowing pass (a read of the f32 values and a write of the copy).
    twin: Option<CudaSlice<u16>>,
    /// Whether `twin` holds the current values: set when a kernel is queued to write both,
    /// cleared by every other write.
    twin_current: bool,
    /// Whether `storage` holds the current values: cleared when a kernel writes the twin
    /// alone (an activation only a bf16 GEMM reads, [`CudaBuffer::twin_only_mut`]), set by
    /// every write of the values. Readers of the values get an error while it is clear.
    values_current: bool,
}

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn capacity(&self) -> usize {
        match &self.storage {
            Storage::F32(s) => s.len(),
            Storage::Bits16(s) => s.len(),
        }
    }

    fn set_len(&mut self, len: usize) -> Result<()> {
        crate::error::ensure(len <= self.capacity(), "set_len", || {
            format!("{len} elements past a capacity of {}", self.capacity())
        })?;
        if len != self.len {
            // The twin is sized by the old length.
            self.twin = None;
            self.twin_current = false;
        }
        self.len = len;
        Ok(())
    }
}

/// The null device address a kernel's optional pointer argument takes when there is none
/// (a bf16 twin, or the f32 values of a kernel writing only the twin).
pub(super) static NULL_PTR: u64 = 0;

/// Pushes a kernel's optional bf16-twin pointer argument: the twin, or null.
pub(super) fn arg_twin<'a>(l: &mut LaunchArgs<'a>, twin: Option<&'a mut CudaSlice<u16>>) {
    match twin {
        Some(b) => l.arg(b),
        None => l.arg(&NULL_PTR),
    };
}

/// The device address of an optional twin (0: none), for kernels that take it as a raw
/// pointer argument at an offset.
pub(super) fn twin_addr(stream: &Arc<CudaStream>, twin: &mut Option<&mut CudaSlice<u16>>) -> u64 {
    use cudarc::driver::DevicePtrMut;
    twin.as_mut().map_or(0, |t| t.device_ptr_mut(stream).0)
}

/// A twin's device address (from [`twin_addr`]) moved to value `first` (2 bytes a value);
/// 0, no twin, stays 0.
pub(super) fn twin_at(twin: u64, first: usize) -> u64 {
    if twin == 0 {
        0
    } else {
        twin + 2 * first as u64
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
    pub(super) fn new(storage: Storage, len: usize, dtype: DType) -> Self {
        Self {
            storage,
            len,
            dtype,
            twin: None,
            twin_current: false,
            values_current: true,
        }
    }

    /// Mutable storage for a write that does not keep the twin (it goes stale).
    pub(super) fn storage_mut(&mut self) -> &mut Storage {
        self.twin_current = false;
        self.values_current = true;
        &mut self.storage
    }

    /// An error naming `op` when the buffer's values live only in its bf16 twin.
    pub(super) fn check_values(&self, op: &'static str) -> Result<()> {
        crate::error::ensure(self.values_current, op, || {
            "the activation is held in bf16 only (written for the bf16 GEMM that reads it)".into()
        })
    }

    /// The f32 slice of an activation buffer, or a dtype error naming `op`.
    pub(super) fn f32s(&self, op: &'static str) -> Result<&CudaSlice<f32>> {
        self.check_values(op)?;
        match &self.storage {
            Storage::F32(s) => Ok(s),
            Storage::Bits16(_) => Err(KernelError::DType {
                op,
                dtype: self.dtype,
            }),
        }
    }

    /// The f32 slice for a write that does not keep the twin (it goes stale).
    pub(super) fn f32s_mut(&mut self, op: &'static str) -> Result<&mut CudaSlice<f32>> {
        self.twin_current = false;
        self.values_current = true;
        match &mut self.storage {
            Storage::F32(s) => Ok(s),
            Storage::Bits16(_) => Err(KernelError::DType {
                op,
                dtype: self.dtype,
            }),
        }
    }

    /// The f32 slice and the bf16 twin (allocated on first use) for a kernel that writes
    /// both: the twin counts as current from here on, in stream order.
    pub(super) fn f32s_and_twin_mut(
        &mut self,
        stream: &Arc<CudaStream>,
        op: &'static str,
    ) -> Result<(&mut CudaSlice<f32>, &mut CudaSlice<u16>)> {
        self.alloc_twin(stream, op)?;
        self.twin_current = true;
        self.values_current = true;
        let (Storage::F32(values), Some(twin)) = (&mut self.storage, self.twin.as_mut()) else {
            return Err(KernelError::Device(format!(
                "{op}: no bf16 copy after allocating it"
            )));
        };
        Ok((values, twin))
    }

    /// The bf16 twin (allocated on first use) for a kernel that writes it alone: from here
    /// on, in stream order, the twin holds the buffer's values and the f32 storage nothing
    /// readable (for an activation that only a bf16 GEMM reads, which then skips the f32
    /// write of its producer).
    pub(super) fn twin_only_mut(
        &mut self,
        stream: &Arc<CudaStream>,
        op: &'static str,
    ) -> Result<&mut CudaSlice<u16>> {
        self.alloc_twin(stream, op)?;
        self.twin_current = true;
        self.values_current = false;
        self.twin
            .as_mut()
            .ok_or_else(|| KernelError::Device(format!("{op}: no bf16 copy after allocating it")))
    }

    /// Allocates the twin of an f32 buffer if it has none; a dtype error naming `op` for
    /// a 16-bit buffer.
    fn alloc_twin(&mut self, stream: &Arc<CudaStream>, op: &'static str) -> Result<()> {
        if !matches!(self.storage, Storage::F32(_)) {
            return Err(KernelError::DType {
                op,
                dtype: self.dtype,
            });
        }
        if self.twin.is_none() {
            // SAFETY: the twin is read only while current, that is after a kernel that
            // writes every element of it.
            let twin = unsafe { stream.alloc::<u16>(self.len.max(1)) }.map_err(|e| {
                KernelError::Device(format!("{op}: allocating the bf16 copy: {e:?}"))
            })?;
            self.twin = Some(twin);
        }
        Ok(())
    }

    /// Whether the f32 storage holds the values (else only the twin does).
    pub(super) fn values_current(&self) -> bool {
        self.values_current
    }

    /// [`Self::f32s_and_twin_mut`] when `twin` is set, else [`Self::f32s_mut`].
    pub(super) fn f32s_maybe_twin_mut(
        &mut self,
        stream: &Arc<CudaStream>,
        twin: bool,
        op: &'static str,
    ) -> Result<(&mut CudaSlice<f32>, Option<&mut CudaSlice<u16>>)> {
        if twin {
            let (values, twin) = self.f32s_and_twin_mut(stream, op)?;
            Ok((values, Some(twin)))
        } else {
            Ok((self.f32s_mut(op)?, None))
        }
    }

    /// The bf16 twin, if it holds the buffer's current values.
    pub(super) fn current_twin(&self) -> Option<&CudaSlice<u16>> {
        self.twin.as_ref().filter(|_| self.twin_current)
    }
}
