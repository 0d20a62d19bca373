//! LoRA products by slot ([`crate::Backend::lora_bgmv`]): each row dots its adapter's
//! matrices, picked out of the stacks by the row's slot.

use super::buffer::CpuBuffer;
use super::dot::{dot, DotWith};
use super::par::for_each_row_mut;
use crate::error::ensure;
use crate::{DeviceBuffer, KernelError, LoraShape, LoraStacks, Result};

const OP: &str = "lora_bgmv";

pub(crate) fn lora_bgmv(
    x: &CpuBuffer,
    stacks: LoraStacks<'_, CpuBuffer>,
    slots: &[u32],
    s: LoraShape,
    out: &mut CpuBuffer,
) -> Result<()> {
    let x = x.f32s(OP)?;
    let out = out.f32s_mut(OP)?;
    let (a, b) = (stacks.a, stacks.b);
    let scales = stacks.scales.f32s(OP)?;
    check(
        x.len(),
        (a.len(), b.len(), scales.len()),
        slots.len(),
        s,
        out.len(),
    )?;
    match (a, b) {
        (CpuBuffer::F32(a), CpuBuffer::F32(b)) => run(x, (a, b, scales), slots, s, out),
        (CpuBuffer::BF16(a), CpuBuffer::BF16(b)) => run(x, (a, b, scales), slots, s, out),
        (a, _) => {
            return Err(KernelError::DType {
                op: OP,
                dtype: a.dtype(),
            })
        }
    }
    Ok(())
}

/// Length checks shared by the backends.
pub(crate) fn check(
    x: usize,
    (a, b, scales): (usize, usize, usize),
    slots: usize,
    s: LoraShape,
    out: usize,
) -> Result<()> {
    ensure(x == s.rows * s.cols && out == s.rows * s.out, OP, || {
        format!(
            "x has {x} and out {out} elements, want {} rows of {} and of {}",
            s.rows, s.cols, s.out
        )
    })?;
    ensure(
        a == s.slots * s.rank * s.cols && b == s.slots * s.out * s.rank && scales == s.slots,
        OP,
        || {
            format!(
                "stacks of {a}, {b} and {scales} elements, want {} slots of [{}, {}], [{}, {}] \
                 and a scale",
                s.slots, s.rank, s.cols, s.out, s.rank
            )
        },
    )?;
    ensure(slots >= 3 * s.rows, OP, || {
        format!(
            "an index of {slots} for {} rows, want `lora_slot_index`'s (3 a row)",
            s.rows
        )
    })
}

fn run<W: DotWith + Sync>(
    x: &[f32],
    (a, b, scales): (&[W], &[W], &[f32]),
    slots: &[u32],
    s: LoraShape,
    out: &mut [f32],
) {
    if s.out == 0 || s.rows == 0 {
        return;
    }
    for_each_row_mut(out, s.out, |r, o| {
        let slot = slots[r] as usize;
        if slot >= s.slots {
            return;
        }
        let xr = &x[r * s.cols..(r + 1) * s.cols];
        let a = &a[slot * s.rank * s.cols..(slot + 1) * s.rank * s.cols];
        let h: Vec<f32> = a
            .chunks_exact(s.cols.max(1))
            .map(|ak| dot(ak, xr))
            .collect();
        let b = &b[slot * s.out * s.rank..(slot + 1) * s.out * s.rank];
        let scale = scales[slot];
        for (j, oj) in o.iter_mut().enumerate() {
            *oj += scale * dot(&b[j * s.rank..(j + 1) * s.rank], &h);
        }
    });
}
