//! Attention: prefill, extend and decode; causal and sliding-window masks; GQA; head_dim
//! 64..512; keys in any order (the mask goes by position, not by index).

use super::{compare, ctx, get, put, reference, CheckResult, TestData, Tolerance};
use crate::{AttentionParams, Backend};

/// One attention check: random q / k / v of these shapes at consecutive positions,
/// compared with the f64 reference.
#[derive(Clone, Copy, Debug)]
pub struct AttentionCase {
    /// Queries in this chunk: 1 = decode, all keys = prefill, otherwise extend.
    pub q_tokens: usize,
    /// Keys already cached before the chunk (the chunk's own keys come after them).
    pub cached: usize,
    /// Absolute position of the first key (a window pool may have dropped older ones).
    pub first_position: u32,
    /// Query heads ([`AttentionParams::n_heads`]).
    pub n_heads: usize,
    /// KV heads ([`AttentionParams::n_kv_heads`]).
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Sliding window ([`AttentionParams::window`]).
    pub window: Option<usize>,
    /// Causal mask ([`AttentionParams::causal`]).
    pub causal: bool,
    /// Score scale ([`AttentionParams::scale`]).
    pub scale: f32,
    /// Score softcap ([`AttentionParams::softcap`]).
    pub softcap: Option<f32>,
    /// Present the keys in a shuffled order.
    pub shuffle_keys: bool,
    /// Seed of the [`TestData`] inputs.
    pub seed: u64,
}

impl AttentionCase {
    fn params(&self) -> AttentionParams {
        AttentionParams {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            scale: self.scale,
            window: self.window,
            causal: self.causal,
            softcap: self.softcap,
        }
    }
}

/// [`Backend::attention`] on case `c` against [`reference::attention`], within the
/// activation dtype's [`Tolerance`].
pub fn check_attention_case<B: Backend>(b: &B, c: AttentionCase) -> CheckResult {
    let act = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let d = c.head_dim;
    let n_keys = c.cached + c.q_tokens;
    let mut k_pos: Vec<u32> = (0..n_keys as u32).map(|i| c.first_position + i).collect();
    let q_pos: Vec<u32> = k_pos[c.cached..].to_vec();
    if c.shuffle_keys {
        for i in (1..k_pos.len()).rev() {
            let j = data.below(i + 1);
            k_pos.swap(i, j);
        }
    }
    // Scores of a few units whatever the head dim: q . k ~ N(0, (2.5 * scale)^-2 ...).
    let std = (2.5f32 / (d as f32).sqrt() / c.scale.abs().max(1e-6)).sqrt();
    let q = data.normals(c.q_tokens * c.n_heads * d, std, act);
    let k = data.normals(n_keys * c.n_kv_heads * d, std, act);
    let v = data.normals(n_keys * c.n_kv_heads * d, 1.0, act);
    let what = format!("attention {c:?}");
    let p = c.params();
    let mut out = ctx(&what, b.zeros(q.len(), act))?;
    ctx(
        &what,
        b.attention(
            &put(b, &q, act)?,
            &put(b, &k, act)?,
            &put(b, &v, act)?,
            &q_pos,
            &k_pos,
            p,
            &mut out,
        ),
    )?;
    let (want, mag) = reference::attention(&q, &k, &v, &q_pos, &k_pos, &p);
    compare(
        &what,
        &get(b, &out)?,
        &want,
        &mag,
        Tolerance::for_dtype(act),
    )
}

/// The model's shapes: Gemma-4 sliding (d 256, window) and full (d 512) layers with a
/// single KV head, Llama/Qwen-style d 64 and 128 with `1/sqrt(d)`, decode / extend /
/// prefill, windows shorter than the chunk, shuffled keys, a softcap, and a query that
/// sees no key at all (its output must be zeros).
pub fn check_attention<B: Backend>(b: &B) -> CheckResult {
    let base = AttentionCase {
        q_tokens: 1,
        cached: 0,
        first_position: 0,
        n_heads: 8,
        n_kv_heads: 1,
        head_dim: 256,
        window: None,
        causal: true,
        scale: 1.0,
        softcap: None,
        shuffle_keys: false,
        seed: 600,
    };
    let isqrt = |d: usize| 1.0 / (d as f32).sqrt();
    let cases = [
        // Gemma-4 sliding decode with a window that cuts the cache.
        AttentionCase {
            cached: 40,
            window: Some(16),
            ..base
        },
        // Gemma-4 full-attention decode, head_dim 512.
        AttentionCase {
            cached: 30,
            head_dim: 512,
            seed: 601,
            ..base
        },
        // Extend: a chunk of 9 after 20 cached, window 5 (shorter than the chunk).
        AttentionCase {
            q_tokens: 9,
            cached: 20,
            n_heads: 4,
            n_kv_heads: 2,
            window: Some(5),
            seed: 602,
            ..base
        },
        // Prefill, GQA 4:2, d 64, shuffled keys, positions not starting at 0.
        AttentionCase {
            q_tokens: 12,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            scale: isqrt(64),
            shuffle_keys: true,
            first_position: 100,
            seed: 603,
            ..base
        },
        // Llama-style MHA d 128 with a softcap.
        AttentionCase {
            q_tokens: 3,
            cached: 5,
            n_heads: 2,
            n_kv_heads: 2,
            head_dim: 128,
            scale: isqrt(128),
            softcap: Some(50.0),
            seed: 604,
            ..base
        },
        // Window of 1: each query sees only itself.
        AttentionCase {
            q_tokens: 4,
            cached: 2,
            n_heads: 2,
            head_dim: 64,
            window: Some(1),
            seed: 605,
            ..base
        },
        // A vision tower's layer: bidirectional over 150 patches (three tiles of 64
        // queries and of keys, the last ones partial), MHA, scale 1.
        AttentionCase {
            q_tokens: 150,
            n_heads: 3,
            n_kv_heads: 3,
            head_dim: 64,
            causal: false,
            scale: 0.125,
            seed: 608,
            ..base
        },
        // A small head (d 16 < the tiled kernel's 64) in a causal, windowed chunk of 70
        // after 30 cached, GQA 4:2, with a softcap.
        AttentionCase {
            q_tokens: 70,
            cached: 30,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            window: Some(25),
            scale: 0.25,
            softcap: Some(30.0),
            seed: 609,
            ..base
        },
        // Non-causal (bidirectional) with a window.
        AttentionCase {
            q_tokens: 6,
            n_heads: 3,
            n_kv_heads: 1,
            head_dim: 64,
            causal: false,
            window: Some(3),
            seed: 606,
            ..base
        },
    ];
    for c in cases {
        check_attention_case(b, c)?;
    }
    // A query at position 0 with keys only at 5..8 sees nothing: zeros, not NaN.
    let act = b.activation_dtype();
    let p = AttentionParams {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 64,
        ..base.params()
    };
    let mut data = TestData::new(607);
    let q = put(b, &data.normals(2 * 64, 1.0, act), act)?;
    let k = put(b, &data.normals(3 * 64, 1.0, act), act)?;
    let mut out = put(b, &vec![1.0; 2 * 64], act)?;
    ctx(
        "attention (no visible key)",
        b.attention(&q, &k, &k, &[0], &[5, 6, 7], p, &mut out),
    )?;
    if get(b, &out)?.iter().any(|&v| v != 0.0) {
        return Err("attention: a query with no visible key must produce zeros".into());
    }
    if b.attention(&q, &k, &k, &[0], &[5, 6], p, &mut out).is_ok() {
        return Err("attention accepted 3 keys with 2 positions".into());
    }
    Ok(())
}
