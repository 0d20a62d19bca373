//! RMSNorm and its fused residual forms.
//!
//! The mean of squares is accumulated in f64 (cheap next to a matmul, and it makes the CPU
//! path a tight reference); the scaling itself follows transformers' order in f32:
//! `(x * inv_rms) * (w + offset)`, one rounding per product.

use std::borrow::Cow;

use super::buffer::CpuBuffer;
use super::par::PAR_MIN_ELEMS;
use crate::error::ensure;
use crate::{DeviceBuffer, Result, RmsNormParams};
use rayon::prelude::*;

/// The effective per-element multiplier `w + offset`, or None for the scale-free norm.
fn effective_weight(
    op: &'static str,
    weight: Option<&CpuBuffer>,
    p: &RmsNormParams,
) -> Result<Option<Vec<f32>>> {
    let Some(w) = weight else { return Ok(None) };
    ensure(w.len() == p.dim, op, || {
        format!("weight has {} elements, dim is {}", w.len(), p.dim)
    })?;
    // Widened whole, then offset in one pass: both loops vectorize (an element-at-a-time
    // read dispatches on the dtype per element, and this runs for every norm of a step).
    let mut v = w.to_f32_vec();
    v.iter_mut().for_each(|x| *x += p.weight_offset);
    Ok(Some(v))
}

fn check_rows(op: &'static str, len: usize, p: &RmsNormParams) -> Result<()> {
    ensure(p.parts > 0, op, || "an input of zero parts".to_string())?;
    ensure(p.dim > 0 && len.is_multiple_of(p.dim * p.parts), op, || {
        format!(
            "length {len} is not rows of {} parts of dim {}",
            p.parts, p.dim
        )
    })
}

/// `x` (checked by [`check_rows`]) as whole rows: each row's `p.parts` parts added in
/// order, in f32 (`((x0 + x1) + x2) + ...`, as the CUDA norms add them).
fn whole_rows<'a>(x: &'a [f32], p: &RmsNormParams) -> Cow<'a, [f32]> {
    if p.parts <= 1 {
        return Cow::Borrowed(x);
    }
    let mut out = vec![0f32; x.len() / p.parts];
    for (o, row) in out
        .chunks_exact_mut(p.dim)
        .zip(x.chunks_exact(p.dim * p.parts))
    {
        o.copy_from_slice(&row[..p.dim]);
        for part in row[p.dim..].chunks_exact(p.dim) {
            for (a, &b) in o.iter_mut().zip(part) {
                *a += b;
            }
        }
    }
    Cow::Owned(out)
}

#[inline]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32
}

/// `out = normalised(x)`, one row.
#[inline]
fn norm_row(x: &[f32], w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let inv = inv_rms(x, eps);
    match w {
        Some(w) => {
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
                *o = (v * inv) * g;
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * inv;
            }
        }
    }
}

/// Runs `f` over matching rows of two mutable-or-shared slices, in parallel when large.
fn rows2<F>(a: &mut [f32], b: &[f32], dim: usize, f: F)
where
    F: Fn(&mut [f32], &[f32]) + Sync + Send,
{
    if a.len() >= PAR_MIN_ELEMS {
        a.par_chunks_mut(dim)
            .zip(b.par_chunks(dim))
            .for_each(|(a, b)| f(a, b));
    } else {
        a.chunks_mut(dim)
            .zip(b.chunks(dim))
            .for_each(|(a, b)| f(a, b));
    }
}

pub(crate) fn rms_norm(
    x: &CpuBuffer,
    weight: Option<&CpuBuffer>,
    p: RmsNormParams,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "rms_norm";
    let x = x.f32s(OP)?;
    let out = out.f32s_mut(OP)?;
    check_rows(OP, x.len(), &p)?;
    let x = whole_rows(x, &p);
    let x = &x[..];
    ensure(out.len() == x.len(), OP, || {
        format!("out {} != x {}", out.len(), x.len())
    })?;
    let w = effective_weight(OP, weight, &p)?;
    rows2(out, x, p.dim, |o, x| norm_row(x, w.as_deref(), p.eps, o));
    Ok(())
}

pub(crate) fn add_rms_norm(
    residual: &mut CpuBuffer,
    x: &CpuBuffer,
    weight: Option<&CpuBuffer>,
    p: RmsNormParams,
    out: &mut CpuBuffer,
) -> Result<()> {
    const OP: &str = "add_rms_norm";
    let residual = residual.f32s_mut(OP)?;
    let x = x.f32s(OP)?;
    let out = out.f32s_mut(OP)?;
    check_rows(OP, x.len(), &p)?;
    let x = whole_rows(x, &p);
    let x = &x[..];
    ensure(
        residual.len() == x.len() && out.len() == x.len(),
        OP,
        || {
            format!(
                "residual {}, x {}, out {} must match",
                residual.len(),
                x.len(),
                out.len()
            )
        },
    )?;
    let w = effective_weight(OP, weight, &p)?;
    let step = |(r, x, o): (&mut [f32], &[f32], &mut [f32])| {
        for (r, &v) in r.iter_mut().zip(x) {
            *r += v;
        }
        norm_row(r, w.as_deref(), p.eps, o);
    };
    if x.len() >= PAR_MIN_ELEMS {
        residual
            .par_chunks_mut(p.dim)
            .zip(x.par_chunks(p.dim))
            .zip(out.par_chunks_mut(p.dim))
            .for_each(|((r, x), o)| step((r, x, o)));
    } else {
        residual
            .chunks_mut(p.dim)
            .zip(x.chunks(p.dim))
            .zip(out.chunks_mut(p.dim))
            .for_each(|((r, x), o)| step((r, x, o)));
    }
    Ok(())
}

pub(crate) fn rms_norm_add(
    residual: &mut CpuBuffer,
    x: &CpuBuffer,
    weight: Option<&CpuBuffer>,
    p: RmsNormParams,
) -> Result<()> {
    const OP: &str = "rms_norm_add";
    let residual = residual.f32s_mut(OP)?;
    let x = x.f32s(OP)?;
    check_rows(OP, x.len(), &p)?;
    let x = whole_rows(x, &p);
    let x = &x[..];
    ensure(residual.len() == x.len(), OP, || {
        format!("residual {} != x {}", residual.len(), x.len())
    })?;
    let w = effective_weight(OP, weight, &p)?;
    rows2(residual, x, p.dim, |r, x| {
        let inv = inv_rms(x, p.eps);
        match w.as_deref() {
            Some(w) => {
                for ((r, &v), &g) in r.iter_mut().zip(x).zip(w) {
                    *r += (v * inv) * g;
                }
            }
            None => {
                for (r, &v) in r.iter_mut().zip(x) {
                    *r += v * inv;
                }
            }
        }
    });
    Ok(())
}
