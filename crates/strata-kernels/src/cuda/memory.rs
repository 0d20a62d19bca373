//! Uploads, downloads, zero-filled buffers and strided copies.

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg, ValidAsZeroBits};

use super::buffer::{CudaBuffer, Storage};
use super::{device_err, grid_for, CudaBackend};
use crate::error::ensure;
use crate::{DType, DeviceBuffer, HostSlice, Result, StridedCopy};

impl CudaBackend {
    /// A device copy of `data`; an empty slice gets one zeroed placeholder element.
    pub(super) fn to_device<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        data: &[T],
    ) -> Result<CudaSlice<T>> {
        let r = if data.is_empty() {
            self.stream.alloc_zeros::<T>(1)
        } else {
            self.stream.clone_htod(data)
        };
        r.map_err(device_err("copying to the GPU"))
    }

    pub(super) fn upload_impl(&self, data: HostSlice<'_>) -> Result<CudaBuffer> {
        let (storage, len, dtype) = match data {
            HostSlice::F32(s) => (Storage::F32(self.to_device(s)?), s.len(), DType::F32),
            HostSlice::BF16(s) => (
                Storage::Bits16(self.to_device(bytemuck::cast_slice::<_, u16>(s))?),
                s.len(),
                DType::BF16,
            ),
            HostSlice::F16(s) => (
                Storage::Bits16(self.to_device(bytemuck::cast_slice::<_, u16>(s))?),
                s.len(),
                DType::F16,
            ),
        };
        Ok(CudaBuffer::new(storage, len, dtype))
    }

    pub(super) fn zeros_impl(&self, len: usize, dtype: DType) -> Result<CudaBuffer> {
        self.alloc_buffer(len, dtype, true)
    }

    /// As `zeros_impl` without the fill: the caller writes every element before reading.
    pub(super) fn scratch_impl(&self, len: usize, dtype: DType) -> Result<CudaBuffer> {
        self.alloc_buffer(len, dtype, false)
    }

    /// A buffer of `len` elements (at least one, so every buffer has a pointer to pass),
    /// zero-filled when `zero` is set.
    fn alloc_buffer(&self, len: usize, dtype: DType, zero: bool) -> Result<CudaBuffer> {
        let n = len.max(1);
        let err = device_err("allocating GPU memory");
        // SAFETY (alloc without zeroing): device memory; `Backend::scratch`'s contract is that
        // it is written before it is read (reading it first gives unspecified values, not UB
        // on the host side).
        let storage = match (dtype, zero) {
            (DType::F32, true) => Storage::F32(self.stream.alloc_zeros::<f32>(n).map_err(&err)?),
            (DType::F32, false) => {
                // SAFETY: see above; uninitialised device memory is only handed out as
                // scratch, which is written before it is read.
                Storage::F32(unsafe { self.stream.alloc::<f32>(n) }.map_err(&err)?)
            }
            (DType::BF16 | DType::F16, true) => {
                Storage::Bits16(self.stream.alloc_zeros::<u16>(n).map_err(&err)?)
            }
            (DType::BF16 | DType::F16, false) => {
                // SAFETY: as for the f32 case above.
                Storage::Bits16(unsafe { self.stream.alloc::<u16>(n) }.map_err(&err)?)
            }
        };
        Ok(CudaBuffer::new(storage, len, dtype))
    }

    pub(super) fn download_impl(&self, buf: &CudaBuffer) -> Result<Vec<f32>> {
        let len = buf.len();
        if len == 0 {
            self.synchronize()?;
            return Ok(Vec::new());
        }
        let err = device_err("copying from the GPU");
        let widen = |bits: Vec<u16>, dtype: DType| -> Vec<f32> {
            match dtype {
                DType::F16 => bits
                    .iter()
                    .map(|&b| half::f16::from_bits(b).to_f32())
                    .collect(),
                _ => bits
                    .iter()
                    .map(|&b| half::bf16::from_bits(b).to_f32())
                    .collect(),
            }
        };
        let out = match &buf.storage {
            Storage::F32(s) if buf.values_current() => {
                self.stream.clone_dtoh(&s.slice(..len)).map_err(&err)?
            }
            // An activation held in bf16 only: its values are the twin's.
            Storage::F32(_) => {
                let twin = buf.current_twin().ok_or_else(|| {
                    crate::KernelError::Device(
                        "download: an activation with no current values".into(),
                    )
                })?;
                widen(
                    self.stream.clone_dtoh(&twin.slice(..len)).map_err(&err)?,
                    DType::BF16,
                )
            }
            Storage::Bits16(s) => widen(
                self.stream.clone_dtoh(&s.slice(..len)).map_err(&err)?,
                buf.dtype(),
            ),
        };
        // Surfaces any error of the queued kernels, not only of the copy.
        self.synchronize()?;
        Ok(out)
    }

    pub(super) fn copy_strided_impl(
        &self,
        src: &CudaBuffer,
        dst: &mut CudaBuffer,
        c: StridedCopy,
    ) -> Result<()> {
        const OP: &str = "copy_strided";
        src.check_values(OP)?;
        ensure(src.dtype() == dst.dtype(), OP, || {
            format!("src is {:?}, dst is {:?}", src.dtype(), dst.dtype())
        })?;
        if c.rows == 0 || c.cols == 0 {
            return Ok(());
        }
        let last = |offset: usize, stride: usize| offset + (c.rows - 1) * stride + c.cols;
        ensure(last(c.src_offset, c.src_stride) <= src.len(), OP, || {
            format!("{c:?} reads past the source's {} elements", src.len())
        })?;
        ensure(last(c.dst_offset, c.dst_stride) <= dst.len(), OP, || {
            format!("{c:?} writes past the destination's {} elements", dst.len())
        })?;
        let args = [
            c.rows as u64,
            c.cols as u64,
            c.src_offset as u64,
            c.src_stride as u64,
            c.dst_offset as u64,
            c.dst_stride as u64,
        ];
        let cfg = grid_for(c.rows * c.cols);
        let launched = match (&src.storage, dst.storage_mut()) {
            (Storage::F32(s), Storage::F32(d)) => {
                let f = self.kernels.get("copy_strided_b32")?;
                let mut l = self.stream.launch_builder(f);
                l.arg(s).arg(d);
                for a in &args {
                    l.arg(a);
                }
                // SAFETY: bounds checked above; the kernel touches only those elements.
                unsafe { l.launch(cfg) }
            }
            (Storage::Bits16(s), Storage::Bits16(d)) => {
                let f = self.kernels.get("copy_strided_b16")?;
                let mut l = self.stream.launch_builder(f);
                l.arg(s).arg(d);
                for a in &args {
                    l.arg(a);
                }
                // SAFETY: as above.
                unsafe { l.launch(cfg) }
            }
            _ => unreachable!("dtypes were checked equal"),
        };
        launched.map_err(device_err(OP))?;
        Ok(())
    }
}
