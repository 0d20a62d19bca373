//! Strided 2-D copies between buffers of one dtype.

use super::buffer::CpuBuffer;
use crate::error::ensure;
use crate::{DeviceBuffer, KernelError, Result};

pub(crate) fn copy_strided(
    src: &CpuBuffer,
    dst: &mut CpuBuffer,
    c: crate::StridedCopy,
) -> Result<()> {
    const OP: &str = "copy_strided";
    if c.rows == 0 || c.cols == 0 {
        return Ok(());
    }
    let last = |off: usize, stride: usize| off + (c.rows - 1) * stride + c.cols;
    ensure(last(c.src_offset, c.src_stride) <= src.len(), OP, || {
        format!("source of {} too short for {c:?}", src.len())
    })?;
    ensure(last(c.dst_offset, c.dst_stride) <= dst.len(), OP, || {
        format!("destination of {} too short for {c:?}", dst.len())
    })?;
    fn rows<T: Copy>(s: &[T], d: &mut [T], c: &crate::StridedCopy) {
        for r in 0..c.rows {
            let (so, dof) = (
                c.src_offset + r * c.src_stride,
                c.dst_offset + r * c.dst_stride,
            );
            d[dof..dof + c.cols].copy_from_slice(&s[so..so + c.cols]);
        }
    }
    match (src, dst) {
        (CpuBuffer::F32(s), CpuBuffer::F32(d)) => rows(s, d, &c),
        (CpuBuffer::BF16(s), CpuBuffer::BF16(d)) => rows(s, d, &c),
        (CpuBuffer::F16(s), CpuBuffer::F16(d)) => rows(s, d, &c),
        (s, _) => {
            return Err(KernelError::DType {
                op: OP,
                dtype: s.dtype(),
            })
        }
    }
    Ok(())
}
