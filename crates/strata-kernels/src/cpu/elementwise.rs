//! Activations, gated products, softcap and the small arithmetic helpers.
//!
//! Everything is computed in f32, as PyTorch's opmath does for these ops.

use super::buffer::CpuBuffer;
use super::par::{for_each_row_mut, zip_apply};
use crate::error::ensure;
use crate::{Activation, Result};

/// `sqrt(2 / pi)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `e^x` in f32 without a library call, so that loops over it vectorise: `x = n ln2 + r`
/// with `|r| <= ln2 / 2` (n rounded by adding and subtracting 1.5 * 2^23), `e^r` by Cephes'
/// degree-7 polynomial, `2^n` from exponent bits. Within 2 ulp of `f32::exp` on
/// `[-87, 88]`; inputs outside are clamped there (e^-87 is still a normal f32); NaN stays NaN.
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, the tanh approximation of GELU,
/// computed as `x / (1 + e^(-2u))` (the same value: `(1 + tanh u) / 2` is the logistic of
/// `2u`), which needs no `tanh` call and does not cancel for negative x.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    x / (1.0 + exp_f32(-2.0 * u))
}

/// `x * sigmoid(x)`, written as `x / (1 + e^-x)` (finite for every finite x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp_f32(-x))
}

/// `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

#[inline]
fn apply(act: Activation, x: f32) -> f32 {
    match act {
        Activation::GeluTanh => gelu_tanh(x),
        Activation::Silu => silu(x),
        Activation::Sigmoid => sigmoid(x),
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
        gated(
            act,
            &gate[base..base + o.len()],
            &up[base..base + o.len()],
            o,
        );
    });
    Ok(())
}

/// `out[j] = act(gate[j]) * up[j]`: one loop per activation, which the compiler vectorises,
/// AVX2-wide where the CPU has it (the same IEEE operations lane by lane, no contraction
/// into FMA, so the same bits as the scalar code).
pub(crate) fn gated(act: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { gated_avx2(act, gate, up, out) };
    }
    gated_loops(act, gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gated_avx2(act: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    gated_loops(act, gate, up, out)
}

#[inline(always)]
fn gated_loops(act: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    let (gate, up, out) = (&gate[..n], &up[..n], &mut out[..n]);
    match act {
        Activation::GeluTanh => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = gelu_tanh(g) * u;
            }
        }
        Activation::Silu => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = silu(g) * u;
            }
        }
        Activation::Sigmoid => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = sigmoid(g) * u;
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::exp_f32;

    #[test]
    fn exp_is_within_2_ulp_of_the_library_exp() {
        let mut x = -87.0f32;
        while x <= 88.0 {
            let (got, want) = (exp_f32(x), x.exp());
            let ulp = got.to_bits().abs_diff(want.to_bits());
            assert!(ulp <= 2, "exp({x}) = {got}, want {want} ({ulp} ulp)");
            x += 0.000_731;
        }
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(-1000.0), exp_f32(-87.0));
        assert_eq!(exp_f32(1000.0), exp_f32(88.0));
    }
}
