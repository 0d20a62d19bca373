//! Token embedding gather, with the model's embedding scale applied in f32.

use super::buffer::CpuBuffer;
use super::par::for_each_row_mut;
use crate::error::ensure;
use crate::quant::RowDot;
use crate::{DeviceBuffer, KernelError, Result};

fn check_ids(op: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(id) => Err(KernelError::Invalid {
            op,
            detail: format!("token id {id} >= vocab {vocab}"),
        }),
        None => Ok(()),
    }
}

pub(crate) fn embedding(
    ids: &[u32],
    table: &CpuBuffer,
    hidden: usize,
    scale: f32,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "embedding";
    let out = out.f32s_mut(OP)?;
    ensure(hidden > 0 && table.len().is_multiple_of(hidden), OP, || {
        format!("table of {} is not rows of {hidden}", table.len())
    })?;
    ensure(out.len() == ids.len() * hidden, OP, || {
        format!("out {} != {} ids x {hidden}", out.len(), ids.len())
    })?;
    check_ids(OP, ids, table.len() / hidden)?;
    for_each_row_mut(out, hidden, |t, row| {
        table.widen_range(ids[t] as usize * hidden, row);
        for v in row.iter_mut() {
            *v *= scale;
        }
    });
    Ok(())
}

pub(crate) fn embedding_quant(
    ids: &[u32],
    table: &dyn RowDot,
    scale: f32,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "embedding_quant";
    let hidden = table.cols();
    let out = out.f32s_mut(OP)?;
    ensure(hidden > 0 && out.len() == ids.len() * hidden, OP, || {
        format!("out {} != {} ids x {hidden}", out.len(), ids.len())
    })?;
    check_ids(OP, ids, table.rows())?;
    for_each_row_mut(out, hidden, |t, row| {
        table.dequant_row(ids[t] as usize, row);
        for v in row.iter_mut() {
            *v *= scale;
        }
    });
    Ok(())
}
