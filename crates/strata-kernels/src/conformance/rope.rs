//! RoPE: rotate-half and interleaved, full and proportional (partial) frequency tables.

use super::{compare, ctx, get, put, reference, CheckResult, TestData, Tolerance};
use crate::{Backend, DType, RopeParams, RopeStyle};

/// One RoPE check: `[tokens, n_heads, head_dim]` random values at random positions.
#[derive(Clone, Copy, Debug)]
pub struct RopeCase {
    /// Token rows rotated.
    pub tokens: usize,
    /// Heads a token.
    pub n_heads: usize,
    /// Elements a head.
    pub head_dim: usize,
    /// Pairs with a non-zero frequency (`theta^(-2i/head_dim)` for `i < rotated_pairs`);
    /// the rest must pass through unchanged.
    pub rotated_pairs: usize,
    /// RoPE base of the frequency table.
    pub theta: f64,
    /// Which dimensions pair up.
    pub style: RopeStyle,
    /// Positions are drawn from `0..max_position`.
    pub max_position: u32,
    /// Seed of the [`TestData`] inputs.
    pub seed: u64,
}

/// [`Backend::rope`] on case `c` against [`reference::rope`], and the pass-through pairs
/// unchanged to the bit.
pub fn check_rope_case<B: Backend>(b: &B, c: RopeCase) -> CheckResult {
    let act = b.activation_dtype();
    let tol = Tolerance::for_dtype(act);
    let mut data = TestData::new(c.seed);
    let (d, half) = (c.head_dim, c.head_dim / 2);
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| {
            if i < c.rotated_pairs {
                c.theta.powf(-(2.0 * i as f64) / d as f64) as f32
            } else {
                0.0
            }
        })
        .collect();
    let positions: Vec<u32> = (0..c.tokens)
        .map(|_| data.below(c.max_position.max(1) as usize) as u32)
        .collect();
    let x = data.normals(c.tokens * c.n_heads * d, 1.0, act);
    let what = format!("rope {c:?}");
    let mut xb = put(b, &x, act)?;
    let fb = put(b, &inv_freq, DType::F32)?;
    let p = RopeParams {
        n_heads: c.n_heads,
        head_dim: d,
        style: c.style,
    };
    ctx(&what, b.rope(&mut xb, &positions, &fb, p))?;
    let got = get(b, &xb)?;
    let (want, mag) = reference::rope(&x, &positions, &inv_freq, c.n_heads, d, c.style);
    compare(&what, &got, &want, &mag, tol)?;
    // Zero-frequency pairs are an exact identity (cos = 1, sin = 0), not merely close.
    for (i, (&g, &orig)) in got.iter().zip(&x).enumerate() {
        let j = i % d;
        let pair = match c.style {
            RopeStyle::Neox => j % half,
            RopeStyle::Interleaved => j / 2,
        };
        if pair >= c.rotated_pairs && g != orig {
            return Err(format!(
                "{what}: element {i} should pass through: {orig} -> {g}"
            ));
        }
    }
    Ok(())
}

/// Gemma-4 sliding (d 256, all pairs, theta 1e4) and full (d 512, 64 of 256 pairs,
/// theta 1e6, long positions), Llama-style interleaved, and small odd shapes.
pub fn check_rope<B: Backend>(b: &B) -> CheckResult {
    let cases = [
        (3, 4, 256, 128, 1e4, RopeStyle::Neox, 600),
        (2, 2, 512, 64, 1e6, RopeStyle::Neox, 40_000),
        (4, 3, 128, 64, 5e5, RopeStyle::Interleaved, 9_000),
        (5, 2, 64, 32, 1e4, RopeStyle::Neox, 100),
        (1, 1, 2, 1, 1e4, RopeStyle::Interleaved, 3),
        (2, 3, 16, 2, 1e4, RopeStyle::Interleaved, 50),
    ];
    for (seed, &(tokens, n_heads, head_dim, rotated_pairs, theta, style, max_position)) in
        cases.iter().enumerate()
    {
        check_rope_case(
            b,
            RopeCase {
                tokens,
                n_heads,
                head_dim,
                rotated_pairs,
                theta,
                style,
                max_position,
                seed: 100 + seed as u64,
            },
        )?;
    }
    Ok(())
}
