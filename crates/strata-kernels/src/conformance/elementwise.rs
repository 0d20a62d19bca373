//! Gated activations, the bare activation, softcap, add / mul / scale.

use super::{compare, ctx, get, put, reference, CheckResult, TestData, Tolerance};
use crate::{Activation, Backend};

/// One elementwise check: `len` random inputs.
#[derive(Clone, Copy, Debug)]
pub struct ElementwiseCase {
    /// Elements of each input.
    pub len: usize,
    /// Inputs are `N(0, spread^2)`; large spreads reach the saturated tails.
    pub spread: f32,
    /// Seed of the [`TestData`] inputs.
    pub seed: u64,
}

const ACTIVATIONS: [Activation; 3] = [Activation::GeluTanh, Activation::Silu, Activation::Sigmoid];

/// gelu's `1 + tanh(..)` cancels for negative inputs, leaving an error of a few ulps of
/// `|x|` rather than of the (tiny) result. That is not an accumulation, so only a twentieth
/// of [`Tolerance::accum`] applies (about 16 ulps of `|x|` in f32).
fn cancellation(x: f32) -> f64 {
    0.05 * (x as f64).abs()
}

/// Lengths around the parallel split and vector tails, spreads up to the saturated range.
fn cases() -> Vec<ElementwiseCase> {
    [
        (1, 1.0),
        (7, 3.0),
        (1000, 2.0),
        (20_001, 4.0),
        (70_000, 1.0),
        (64, 30.0),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(len, spread))| ElementwiseCase {
        len,
        spread,
        seed: 500 + i as u64,
    })
    .collect()
}

/// [`Backend::act_mul`] (`act(gate) * up`) on case `c` against the f64 reference.
pub fn check_act_mul_case<B: Backend>(b: &B, act: Activation, c: ElementwiseCase) -> CheckResult {
    let dt = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let gate = data.normals(c.len, c.spread, dt);
    let up = data.normals(c.len, 1.0, dt);
    let what = format!("act_mul {act:?} {c:?}");
    let mut out = ctx(&what, b.zeros(c.len, dt))?;
    ctx(
        &what,
        b.act_mul(act, &put(b, &gate, dt)?, &put(b, &up, dt)?, &mut out),
    )?;
    let want: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| reference::activation(act, g as f64) * u as f64)
        .collect();
    let mag: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| cancellation(g) * (u as f64).abs())
        .collect();
    compare(&what, &get(b, &out)?, &want, &mag, Tolerance::for_dtype(dt))
}

/// [`Backend::act_mul`] for both activations over every length and spread, and that it
/// refuses gate and up of different lengths.
pub fn check_act_mul<B: Backend>(b: &B) -> CheckResult {
    for act in ACTIVATIONS {
        for c in cases() {
            check_act_mul_case(b, act, c)?;
        }
    }
    let dt = b.activation_dtype();
    let mut out = put(b, &[0.0; 3], dt)?;
    if b.act_mul(
        Activation::Silu,
        &put(b, &[1.0; 3], dt)?,
        &put(b, &[1.0; 2], dt)?,
        &mut out,
    )
    .is_ok()
    {
        return Err("act_mul accepted gate and up of different lengths".into());
    }
    Ok(())
}

/// [`Backend::activation`] for both activations over every length and spread.
pub fn check_activation<B: Backend>(b: &B) -> CheckResult {
    let dt = b.activation_dtype();
    for act in ACTIVATIONS {
        for c in cases() {
            let x = TestData::new(c.seed).normals(c.len, c.spread, dt);
            let what = format!("activation {act:?} {c:?}");
            let mut out = ctx(&what, b.zeros(c.len, dt))?;
            ctx(&what, b.activation(act, &put(b, &x, dt)?, &mut out))?;
            let want: Vec<f64> = x
                .iter()
                .map(|&v| reference::activation(act, v as f64))
                .collect();
            let mag: Vec<f64> = x.iter().map(|&v| cancellation(v)).collect();
            compare(&what, &get(b, &out)?, &want, &mag, Tolerance::for_dtype(dt))?;
        }
    }
    Ok(())
}

/// [`Backend::softcap`] (`cap * tanh(x / cap)`) for caps 30, 50 and 1, and that it refuses
/// cap 0.
pub fn check_softcap<B: Backend>(b: &B) -> CheckResult {
    let dt = b.activation_dtype();
    for cap in [30.0f32, 50.0, 1.0] {
        for c in cases() {
            let x = TestData::new(c.seed).normals(c.len, c.spread * cap, dt);
            let what = format!("softcap {cap} {c:?}");
            let mut xb = put(b, &x, dt)?;
            ctx(&what, b.softcap(&mut xb, cap))?;
            let want: Vec<f64> = x
                .iter()
                .map(|&v| cap as f64 * (v as f64 / cap as f64).tanh())
                .collect();
            compare(&what, &get(b, &xb)?, &want, &[], Tolerance::for_dtype(dt))?;
        }
    }
    let mut xb = put(b, &[1.0], dt)?;
    if b.softcap(&mut xb, 0.0).is_ok() {
        return Err("softcap accepted cap 0".into());
    }
    Ok(())
}

/// `add`, `mul` and `scale`.
pub fn check_arith<B: Backend>(b: &B) -> CheckResult {
    let dt = b.activation_dtype();
    let tol = Tolerance::for_dtype(dt);
    for c in cases() {
        let mut data = TestData::new(c.seed);
        let x = data.normals(c.len, c.spread, dt);
        let y = data.normals(c.len, 1.0, dt);
        let yb = put(b, &y, dt)?;
        let what = format!("arith {c:?}");

        let mut acc = put(b, &x, dt)?;
        ctx(&what, b.add(&mut acc, &yb))?;
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(&a, &b)| a as f64 + b as f64)
            .collect();
        let mag: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(&a, &b)| (a as f64).abs() + (b as f64).abs())
            .collect();
        compare(&format!("add {what}"), &get(b, &acc)?, &want, &mag, tol)?;

        let mut acc = put(b, &x, dt)?;
        ctx(&what, b.mul(&mut acc, &yb))?;
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(&a, &b)| a as f64 * b as f64)
            .collect();
        compare(&format!("mul {what}"), &get(b, &acc)?, &want, &[], tol)?;

        let s = std::f32::consts::FRAC_1_SQRT_2;
        let mut acc = put(b, &x, dt)?;
        ctx(&what, b.scale(&mut acc, s))?;
        let want: Vec<f64> = x.iter().map(|&a| a as f64 * s as f64).collect();
        compare(&format!("scale {what}"), &get(b, &acc)?, &want, &[], tol)?;
    }
    Ok(())
}
