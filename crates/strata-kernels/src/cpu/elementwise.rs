//! Activations, gated products, softcap and the small arithmetic helpers.
//!
//! Everything is computed in f32, as PyTorch's opmath does for these ops.

use super::buffer::CpuBuffer;
use super::par::{for_each_row_mut, zip_apply};
use crate::error::ensure;
use crate::{Activation, Result};

/// `sqrt(2 / pi)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, the tanh approximation of GELU.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// `x * sigmoid(x)`, written as `x / (1 + e^-x)` (finite for every finite x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
fn apply(act: Activation, x: f32) -> f32 {
    match act {
        Activation::GeluTanh => gelu_tanh(x),
        Activation::Silu => silu(x),
    }
}

fn same_len(op: &'static str, a: usize, b: usize) -> Result<()> {
    ensure(a == b, op, || format!("lengths {a} and {b} differ"))
}

/// Rows for the parallel helpers on flat data.
const FLAT_CHUNK: usize = 4096;

pub(crate) fn act_mul(
    act: Activation,
    gate: &CpuBuffer,
    up: &CpuBuffer,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "act_mul";
    let (gate, up, out) = (gate.f32s(OP)?, up.f32s(OP)?, out.f32s_mut(OP)?);
    same_len(OP, gate.len(), up.len())?;
    same_len(OP, gate.len(), out.len())?;
    for_each_row_mut(out, FLAT_CHUNK, |i, o| {
        let base = i * FLAT_CHUNK;
        for (j, o) in o.iter_mut().enumerate() {
            *o = apply(act, gate[base + j]) * up[base + j];
        }
    });
    Ok(())
}

pub(crate) fn activation(act: Activation, x: &CpuBuffer, out: &mut CpuBuffer) -> Result<()> {
    const OP: &str = "activation";
    let (x, out) = (x.f32s(OP)?, out.f32s_mut(OP)?);
    same_len(OP, x.len(), out.len())?;
    zip_apply(out, x, |o, v| *o = apply(act, v));
    Ok(())
}

pub(crate) fn softcap(x: &mut CpuBuffer, cap: f32) -> Result<()> {
    const OP: &str = "softcap";
    let x = x.f32s_mut(OP)?;
    if !(cap > 0.0 && cap.is_finite()) {
        return Err(crate::KernelError::Invalid {
            op: OP,
            detail: format!("cap {cap} must be positive and finite"),
        });
    }
    for_each_row_mut(x, FLAT_CHUNK, |_, r| {
        for v in r {
            *v = cap * (*v / cap).tanh();
        }
    });
    Ok(())
}

pub(crate) fn add(acc: &mut CpuBuffer, x: &CpuBuffer) -> Result<()> {
    const OP: &str = "add";
    let (acc, x) = (acc.f32s_mut(OP)?, x.f32s(OP)?);
    same_len(OP, acc.len(), x.len())?;
    zip_apply(acc, x, |a, b| *a += b);
    Ok(())
}

pub(crate) fn mul(acc: &mut CpuBuffer, x: &CpuBuffer) -> Result<()> {
    const OP: &str = "mul";
    let (acc, x) = (acc.f32s_mut(OP)?, x.f32s(OP)?);
    same_len(OP, acc.len(), x.len())?;
    zip_apply(acc, x, |a, b| *a *= b);
    Ok(())
}

pub(crate) fn scale(x: &mut CpuBuffer, s: f32) -> Result<()> {
    let x = x.f32s_mut("scale")?;
    for_each_row_mut(x, FLAT_CHUNK, |_, r| {
        for v in r {
            *v *= s;
        }
    });
    Ok(())
}
