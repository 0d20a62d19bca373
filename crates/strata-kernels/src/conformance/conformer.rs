//! The audio conformer's ops: clamp, causal depthwise convolution and chunked attention
//! with relative positions, against f64 definitions (all f32 ops, whatever the backend's
//! activation dtype).

use super::{compare, ctx, get, put, CheckResult, TestData, Tolerance};
use crate::{Backend, ChunkedAttentionParams, DType, DepthwiseConv};

/// [`Backend::clamp`]: exact, NaN kept, and `lo > hi` refused.
pub fn check_clamp<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(900);
    for (n, lo, hi) in [
        (1, -1.0f32, 1.0f32),
        (1000, -4.0, 4.0),
        (70_001, 0.0, 8.0),
        (5, 2.0, 2.0),
    ] {
        let mut x = data.normals(n, 5.0, DType::F32);
        x[0] = f32::NAN;
        let what = format!("clamp {n} [{lo}, {hi}]");
        let mut buf = put(b, &x, DType::F32)?;
        ctx(&what, b.clamp(&mut buf, lo, hi))?;
        let got = get(b, &buf)?;
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            let want = v.clamp(lo, hi);
            if g.to_bits() != want.to_bits() && !(g.is_nan() && want.is_nan()) {
                return Err(format!("{what}: element {i}: got {g}, want {want}"));
            }
        }
    }
    let mut buf = put(b, &[0.0; 3], DType::F32)?;
    if b.clamp(&mut buf, 1.0, -1.0).is_ok() {
        return Err("clamp: bounds 1 > -1 were taken".into());
    }
    Ok(())
}

/// [`Backend::depthwise_conv1d_causal`] against the definition in f64, over frame counts
/// shorter and longer than the filter; and refused sizes.
pub fn check_depthwise_conv<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(901);
    for (frames, channels, kernel) in [(1, 4, 5), (3, 8, 5), (40, 32, 5), (17, 1024, 5), (9, 6, 1)]
    {
        let p = DepthwiseConv { channels, kernel };
        let x = data.normals(frames * channels, 1.0, DType::F32);
        let w = data.normals(channels * kernel, 0.5, DType::F32);
        let what = format!("depthwise_conv1d_causal {frames}x{channels}, {kernel} taps");
        let mut out = ctx(&what, b.zeros(frames * channels, DType::F32))?;
        ctx(
            &what,
            b.depthwise_conv1d_causal(
                &put(b, &x, DType::F32)?,
                &put(b, &w, DType::F32)?,
                p,
                &mut out,
            ),
        )?;
        let (mut want, mut mag) = (vec![0f64; x.len()], vec![0f64; x.len()]);
        for t in 0..frames {
            for c in 0..channels {
                for j in 0..kernel {
                    let src = t as isize + j as isize - (kernel as isize - 1);
                    if src >= 0 {
                        let v = w[c * kernel + j] as f64 * x[src as usize * channels + c] as f64;
                        want[t * channels + c] += v;
                        mag[t * channels + c] += v.abs();
                    }
                }
            }
        }
        compare(
            &what,
            &get(b, &out)?,
            &want,
            &mag,
            Tolerance::for_dtype(DType::F32),
        )?;
    }
    let p = DepthwiseConv {
        channels: 4,
        kernel: 3,
    };
    let (x, w) = (
        put(b, &[0.0; 8], DType::F32)?,
        put(b, &[0.0; 11], DType::F32)?,
    );
    let mut out = put(b, &[0.0; 8], DType::F32)?;
    if b.depthwise_conv1d_causal(&x, &w, p, &mut out).is_ok() {
        return Err("depthwise_conv1d_causal: a filter of the wrong size was taken".into());
    }
    Ok(())
}

/// The chunked attention in f64, as `cpu::chunked_attention_rows` defines it; with each
/// output's magnitude: the sum of `p_j |v_j|` times (1 + the largest `sum |q k| + sum |q
/// rel|` of its logits), which bounds how far f32 rounding of the logits moves it.
fn chunked_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    rel_k: &[f32],
    p: ChunkedAttentionParams,
) -> (Vec<f64>, Vec<f64>) {
    let (heads, d) = (p.n_heads, p.head_dim);
    let h = heads * d;
    let frames = q.len() / h;
    let (chunk, ctx, positions, past) = (p.chunk, p.context(), p.positions(), p.left - 1);
    let dot = |a: &[f32], b: &[f32]| -> (f64, f64) {
        a.iter().zip(b).fold((0.0, 0.0), |(s, m), (&x, &y)| {
            let t = x as f64 * y as f64;
            (s + t, m + t.abs())
        })
    };
    let (mut out, mut mag) = (vec![0f64; q.len()], vec![0f64; q.len()]);
    for hd in 0..heads {
        let at = |t: usize| t * h + hd * d..t * h + (hd + 1) * d;
        for i in 0..frames {
            let (b, u) = (i / chunk, i % chunk);
            let mut logits = vec![0f64; ctx];
            let mut size = 0f64;
            for (c, logit) in logits.iter_mut().enumerate() {
                let j = (b * chunk + c) as isize - past as isize;
                let inside = j >= 0 && (j as usize) < frames;
                let (ac, am) = if inside {
                    dot(&q[at(i)], &k[at(j as usize)])
                } else {
                    (0.0, 0.0)
                };
                let flat = u * ctx + c;
                let (row, col) = (flat / (ctx + 1), flat % (ctx + 1));
                let qr = b * chunk + row;
                let (rel, rm) = if col < positions && qr < frames {
                    dot(&q[at(qr)], &rel_k[col * h + hd * d..col * h + (hd + 1) * d])
                } else {
                    (0.0, 0.0)
                };
                size = size.max(am + rm);
                let cap = p.logit_cap as f64;
                let dist = i as isize - j;
                let seen =
                    (dist >= 0 && dist < past as isize) || (dist < 0 && -dist < p.right as isize);
                *logit = if inside && seen {
                    ((ac + rel) / cap).tanh() * cap
                } else {
                    p.invalid_logit as f64
                };
            }
            let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f64 = e.iter().sum();
            for (c, &w) in e.iter().enumerate() {
                let j = (b * chunk + c) as isize - past as isize;
                if j < 0 || j as usize >= frames {
                    continue;
                }
                for (e_, &vv) in v[at(j as usize)].iter().enumerate() {
                    out[i * h + hd * d + e_] += w / total * vv as f64;
                    mag[i * h + hd * d + e_] += w / total * (vv as f64).abs() * (1.0 + size);
                }
            }
        }
    }
    (out, mag)
}

/// [`Backend::chunked_attention`] against the f64 definition: the tiny fixture's shape
/// (frames past the last block, a right context), E2B's (blocks of 12, 13 frames of left
/// context, d 128), a clip shorter than a block; and refused sizes.
pub fn check_chunked_attention<B: Backend>(b: &B) -> CheckResult {
    let mut data = TestData::new(902);
    for (frames, heads, d, chunk, left, right) in [
        (9, 2, 16, 4, 5, 1),
        (30, 2, 128, 12, 13, 0),
        (3, 1, 8, 4, 5, 0),
        (25, 3, 32, 12, 13, 2),
    ] {
        let p = ChunkedAttentionParams {
            n_heads: heads,
            head_dim: d,
            chunk,
            left,
            right,
            logit_cap: 50.0,
            invalid_logit: -1e9,
        };
        let n = frames * heads * d;
        let scale = (d as f32).powf(-0.25);
        let q = data.normals(n, scale, DType::F32);
        let k = data.normals(n, scale, DType::F32);
        let v = data.normals(n, 1.0, DType::F32);
        let rel_k = data.normals(p.positions() * heads * d, scale, DType::F32);
        let what = format!("chunked_attention {frames} frames, {heads}x{d}, chunk {chunk}, left {left}, right {right}");
        let mut out = ctx(&what, b.zeros(n, DType::F32))?;
        let up = |x: &[f32]| put(b, x, DType::F32);
        ctx(
            &what,
            b.chunked_attention(&up(&q)?, &up(&k)?, &up(&v)?, &up(&rel_k)?, p, &mut out),
        )?;
        let (want, mag) = chunked_reference(&q, &k, &v, &rel_k, p);
        compare(
            &what,
            &get(b, &out)?,
            &want,
            &mag,
            Tolerance::for_dtype(DType::F32),
        )?;
    }
    let p = ChunkedAttentionParams {
        n_heads: 1,
        head_dim: 4,
        chunk: 2,
        left: 3,
        right: 0,
        logit_cap: 50.0,
        invalid_logit: -1e9,
    };
    let x = put(b, &[0.0; 8], DType::F32)?;
    let short = put(b, &[0.0; 4], DType::F32)?;
    let mut out = put(b, &[0.0; 8], DType::F32)?;
    if b.chunked_attention(&x, &x, &x, &short, p, &mut out).is_ok() {
        return Err("chunked_attention: a relative table of the wrong size was taken".into());
    }
    Ok(())
}
