//! Fused ops: each must equal the chain of unfused ops it replaces, as the CPU backend runs
//! that chain (the trait's default bodies, themselves checked against the f64 references
//! by the other families), within f32 rounding.

use super::k_parts::HeadIns;
use super::{compare, ctx, get, put, CheckResult, TestData, Tolerance};
use crate::cpu::CpuBackend;
use crate::{
    Activation, Backend, DType, KvFormat, KvSlabContents, KvSlabShape, QkvPrep, ResidualStep,
    RmsNormParams, RopeAt, RopeParams, RopeStyle, TableSlice,
};

/// Runs `op` on `b` and on the CPU backend with the same host inputs and compares the
/// buffer it returns.
fn same_as_cpu<B: Backend>(
    what: &str,
    b: &B,
    run_b: impl FnOnce(&B) -> crate::Result<B::Buffer>,
    run_cpu: impl FnOnce(&CpuBackend) -> crate::Result<<CpuBackend as Backend>::Buffer>,
) -> CheckResult {
    let cpu = CpuBackend::new();
    let got = get(b, &ctx(what, run_b(b))?)?;
    let want = ctx(what, cpu.download(&ctx(what, run_cpu(&cpu))?))?;
    matches_cpu(what, &got, &want)
}

/// A backend's result against the CPU backend's, at f32 tolerance.
fn matches_cpu(what: &str, got: &[f32], want: &[f32]) -> CheckResult {
    let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
    let mag: Vec<f64> = want64.iter().map(|v| v.abs()).collect();
    compare(what, got, &want64, &mag, Tolerance::for_dtype(DType::F32))
}

fn norm_params(dim: usize, offset: f32) -> RmsNormParams {
    RmsNormParams {
        dim,
        eps: 1e-6,
        weight_offset: offset,
        parts: 1,
    }
}

/// `residual_norm`'s post-norm step, with the next norm (with and without the layer scalar)
/// and without it: both the residual and the output.
pub fn check_fused_norms<B: Backend>(b: &B) -> CheckResult {
    for (seed, &(rows, dim, w_dtype, offset)) in [
        (1usize, 1536usize, DType::BF16, 0.0f32),
        // f32 (as the model uploads its norms) and bf16 weights on the vector path: their
        // own entry points (`NORM_ENTRY_TYPED`); f16 weights the general ones.
        (3, 2560, DType::F32, 1.0),
        (5, 100, DType::F16, 0.0),
        (7, 2560, DType::BF16, 1.0),
        (2, 1000, DType::BF16, 0.0),
    ]
    .iter()
    .enumerate()
    {
        let mut data = TestData::new(40 + seed as u64);
        let r = data.normals(rows * dim, 3.0, DType::F32);
        let x = data.normals(rows * dim, 1.0, DType::F32);
        let w1 = data.normals(dim, 0.5, w_dtype);
        let w2 = data.normals(dim, 0.5, w_dtype);
        let p = norm_params(dim, offset);
        for scale in [None, Some(0.37)] {
            for want_residual in [false, true] {
                let what = format!(
                    "rms_norm_add_norm {rows}x{dim} scale={scale:?} residual={want_residual}"
                );
                let ins = NormAddNormInputs {
                    r: &r,
                    x: &x,
                    w1: &w1,
                    w2: &w2,
                    w_dtype,
                    scale,
                };
                same_as_cpu(
                    &what,
                    b,
                    |b| fused_norm_add_norm(b, &ins, p, want_residual),
                    |c| fused_norm_add_norm(c, &ins, p, want_residual),
                )?;
            }
        }
        let what = format!("rms_norm_add_scale {rows}x{dim}");
        same_as_cpu(
            &what,
            b,
            |b| fused_norm_add_scale(b, &r, &x, &w1, w_dtype, p, 0.37),
            |c| fused_norm_add_scale(c, &r, &x, &w1, w_dtype, p, 0.37),
        )?;
    }
    Ok(())
}

/// Residual, input, both norms' weights and the optional layer scalar of an add-norm step.
struct NormAddNormInputs<'a> {
    r: &'a [f32],
    x: &'a [f32],
    w1: &'a [f32],
    w2: &'a [f32],
    w_dtype: DType,
    scale: Option<f32>,
}

/// `residual_norm`'s post-norm step with the next norm (scale 1 without `i.scale`); returns
/// the residual or the output.
fn fused_norm_add_norm<B: Backend>(
    b: &B,
    i: &NormAddNormInputs<'_>,
    p: RmsNormParams,
    residual_out: bool,
) -> crate::Result<B::Buffer> {
    let mut rb = b.upload_f32_as(i.r, DType::F32)?;
    let xb = b.upload_f32_as(i.x, DType::F32)?;
    let w1b = b.upload_f32_as(i.w1, i.w_dtype)?;
    let w2b = b.upload_f32_as(i.w2, i.w_dtype)?;
    let mut out = b.zeros(i.x.len(), DType::F32)?;
    let scale = i.scale.unwrap_or(1.0);
    let step = ResidualStep::norm_add_norm(Some(&w1b), scale, Some(&w2b), &mut out);
    b.residual_norm(&mut rb, &xb, p, step)?;
    Ok(if residual_out { rb } else { out })
}

fn fused_norm_add_scale<B: Backend>(
    b: &B,
    r: &[f32],
    x: &[f32],
    w: &[f32],
    w_dtype: DType,
    p: RmsNormParams,
    scale: f32,
) -> crate::Result<B::Buffer> {
    let mut rb = b.upload_f32_as(r, DType::F32)?;
    let xb = b.upload_f32_as(x, DType::F32)?;
    let wb = b.upload_f32_as(w, w_dtype)?;
    b.residual_norm(
        &mut rb,
        &xb,
        p,
        ResidualStep::norm_then_add(Some(&wb), scale),
    )?;
    Ok(rb)
}

/// `head_norm_rope_idx` on Gemma-4's head sizes (256 sliding, 512 full with a zero-frequency
/// tail), both RoPE styles, with and without a weight, at far positions.
pub fn check_head_norm_rope<B: Backend>(b: &B) -> CheckResult {
    let cases = [
        (
            1usize,
            8usize,
            256usize,
            RopeStyle::Neox,
            Some(DType::BF16),
            0usize,
        ),
        // f32 weights or none with half-split pairs: the register path's entry points for
        // that case (`head_norm_rope_f32_d<D>`), weighted and not.
        (3, 1, 512, RopeStyle::Neox, Some(DType::F32), 192),
        (2, 3, 128, RopeStyle::Neox, None, 4),
        (2, 4, 64, RopeStyle::Interleaved, None, 0),
        (5, 2, 128, RopeStyle::Neox, Some(DType::BF16), 16),
        // Interleaved pairs across lanes at the register path's widths, and a head_dim
        // off that path (the strided loops).
        (3, 2, 256, RopeStyle::Interleaved, Some(DType::BF16), 8),
        (2, 1, 512, RopeStyle::Interleaved, Some(DType::F16), 0),
        (4, 3, 96, RopeStyle::Neox, Some(DType::BF16), 6),
        (2, 2, 80, RopeStyle::Interleaved, None, 0),
    ];
    for (seed, &(tokens, heads, d, style, w_dtype, zero_tail)) in cases.iter().enumerate() {
        let mut data = TestData::new(60 + seed as u64);
        let x = data.normals(tokens * heads * d, 2.0, DType::F32);
        let w = w_dtype.map(|dt| data.normals(d, 0.5, dt));
        let positions: Vec<u32> = (0..tokens).map(|i| (i * 977 + 5) as u32).collect();
        let inv_freq = inv_freq_with_zero_tail(d, zero_tail);
        let rope = RopeParams {
            n_heads: heads,
            head_dim: d,
            style,
        };
        let norm = norm_params(d, 0.0);
        let what = format!("head_norm_rope {tokens}x{heads}x{d} {style:?} weight={w_dtype:?}");
        let case = HeadIns {
            w: w.as_deref().zip(w_dtype),
            positions: &positions,
            inv_freq: &inv_freq,
            norm,
            rope,
        };
        let got = ctx(&what, case.run(b, &x, 1))?;
        let want = ctx(&what, case.run(&CpuBackend::new(), &x, 1))?;
        matches_cpu(&what, &got, &want)?;
    }
    Ok(())
}

/// Frequencies `10000^(-2i/d)` with the last `zero_tail` of the `d / 2` set to zero
/// (proportional RoPE).
pub(super) fn inv_freq_with_zero_tail(d: usize, zero_tail: usize) -> Vec<f32> {
    let half = d / 2;
    (0..half)
        .map(|i| {
            if i >= half - zero_tail {
                0.0
            } else {
                10000f32.powf(-(2.0 * i as f32) / d as f32)
            }
        })
        .collect()
}

/// The host inputs of one `qkv_norm_rope_idx` check.
struct QkvInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    norms: [Vec<f32>; 2],
    w_dtype: DType,
    positions: Vec<u32>,
    inv_freq: Vec<f32>,
    p: QkvPrep,
}

/// The shape of one q / k / v preparation check: `tokens` rows of `heads` query and
/// `kv_heads` KV heads of `d`, the last `zero_tail` frequencies zero (partial RoPE).
#[derive(Clone, Copy, Debug)]
struct QkvShape {
    tokens: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    style: RopeStyle,
    w_dtype: DType,
    zero_tail: usize,
    v_norm: bool,
}

/// (tokens, heads, kv_heads, d, style, w_dtype, zero_tail, v_norm), as the case lists
/// write them.
type QkvTuple = (usize, usize, usize, usize, RopeStyle, DType, usize, bool);

impl From<QkvTuple> for QkvShape {
    fn from(t: QkvTuple) -> Self {
        let (tokens, heads, kv_heads, d, style, w_dtype, zero_tail, v_norm) = t;
        Self {
            tokens,
            heads,
            kv_heads,
            d,
            style,
            w_dtype,
            zero_tail,
            v_norm,
        }
    }
}

impl QkvShape {
    /// How a failure names the case.
    fn label(&self) -> String {
        format!(
            "{}x({}+{})x{} {:?} {:?} weights v_norm={}",
            self.tokens, self.heads, self.kv_heads, self.d, self.style, self.w_dtype, self.v_norm
        )
    }
}

impl QkvInputs {
    /// Random rows and norm weights for `s`; token i at position `pos.0 * i + pos.1`.
    fn random(s: QkvShape, data: &mut TestData, pos: (usize, usize)) -> Self {
        let (t, d) = (s.tokens, s.d);
        Self {
            q: data.normals(t * s.heads * d, 2.0, DType::F32),
            k: data.normals(t * s.kv_heads * d, 2.0, DType::F32),
            v: data.normals(t * s.kv_heads * d, 2.0, DType::F32),
            norms: [
                data.normals(d, 0.5, s.w_dtype),
                data.normals(d, 0.5, s.w_dtype),
            ],
            w_dtype: s.w_dtype,
            positions: (0..t).map(|i| (i * pos.0 + pos.1) as u32).collect(),
            inv_freq: inv_freq_with_zero_tail(d, s.zero_tail),
            p: QkvPrep {
                norm: norm_params(d, 1.0),
                rope: RopeParams {
                    n_heads: s.heads,
                    head_dim: d,
                    style: s.style,
                },
                kv_heads: s.kv_heads,
                v_norm: s.v_norm,
            },
        }
    }
}

/// `QkvInputs` on a backend.
struct QkvBuffers<B: Backend> {
    qkv: [B::Buffer; 3],
    norms: [B::Buffer; 2],
    pos: B::Index,
    freqs: B::Buffer,
}

impl QkvInputs {
    fn upload<B: Backend>(&self, b: &B) -> crate::Result<QkvBuffers<B>> {
        let f32s = |x: &[f32]| b.upload_f32_as(x, DType::F32);
        let weights = |x: &[f32]| b.upload_f32_as(x, self.w_dtype);
        Ok(QkvBuffers {
            qkv: [f32s(&self.q)?, f32s(&self.k)?, f32s(&self.v)?],
            norms: [weights(&self.norms[0])?, weights(&self.norms[1])?],
            pos: b.upload_index(&self.positions)?,
            freqs: f32s(&self.inv_freq)?,
        })
    }
}

impl<B: Backend> QkvBuffers<B> {
    /// `qkv_norm_rope_idx` in place, or with `store` `qkv_norm_rope_store_idx`.
    fn prepare(
        &mut self,
        b: &B,
        p: QkvPrep,
        store: Option<(&mut B::KvSlab, &B::Index)>,
    ) -> crate::Result<()> {
        let [q, k, v] = &mut self.qkv;
        let [qn, kn] = &self.norms;
        let at = RopeAt {
            positions: &self.pos,
            inv_freq: &self.freqs,
        };
        match store {
            Some(s) => b.qkv_norm_rope_store_idx([q, k, v], [qn, kn], at, p, s),
            None => b.qkv_norm_rope_idx([q, k, v], [qn, kn], at, p),
        }
    }
}

/// Runs `qkv_norm_rope_idx` and returns q, k or v (`which` 0, 1, 2).
fn qkv_norm_rope<B: Backend>(b: &B, i: &QkvInputs, which: usize) -> crate::Result<B::Buffer> {
    let mut u = i.upload(b)?;
    u.prepare(b, i.p, None)?;
    Ok(u.qkv.into_iter().nth(which).expect("which < 3"))
}

/// `qkv_norm_rope_idx` on Gemma-4's layer shapes (8 query heads over one KV head at 256,
/// and at 512 with a zero-frequency tail), a 4-over-2 interleaved case and one without v's
/// norm: q, k and v each against the CPU's chain of separate ops.
pub fn check_qkv_norm_rope<B: Backend>(b: &B) -> CheckResult {
    let cases = [
        (
            1usize,
            8usize,
            1usize,
            256usize,
            RopeStyle::Neox,
            DType::BF16,
            0usize,
            true,
        ),
        (3, 8, 1, 512, RopeStyle::Neox, DType::F32, 192, true),
        (2, 4, 2, 64, RopeStyle::Interleaved, DType::BF16, 0, false),
        (5, 2, 2, 128, RopeStyle::Neox, DType::BF16, 16, true),
    ];
    for (seed, &case) in cases.iter().enumerate() {
        let mut data = TestData::new(90 + seed as u64);
        let shape = QkvShape::from(case);
        let inputs = QkvInputs::random(shape, &mut data, (977, 5));
        for (which, name) in ["q", "k", "v"].iter().enumerate() {
            let what = format!("qkv_norm_rope {}: {name}", shape.label());
            same_as_cpu(
                &what,
                b,
                |b| qkv_norm_rope(b, &inputs, which),
                |c| qkv_norm_rope(c, &inputs, which),
            )?;
        }
    }
    Ok(())
}

/// q, k and v after `qkv_norm_rope_store_idx` or its two ops, and the slab they left.
struct Prepared {
    qkv: Vec<Vec<f32>>,
    slab: KvSlabContents,
}

/// Prepares `i`'s q, k and v and stores k and v into a fresh `format` slab at `slots`:
/// with the fused op, or with `qkv_norm_rope_idx` then `kv_store`.
fn prepare_and_store<B: Backend>(
    b: &B,
    i: &QkvInputs,
    format: KvFormat,
    slots: &[u32],
    fused: bool,
) -> crate::Result<Prepared> {
    let mut u = i.upload(b)?;
    let mut slab = b.kv_slab(KvSlabShape {
        format,
        num_kv_heads: i.p.kv_heads,
        head_dim: i.p.rope.head_dim,
        slots: 2 * slots.len() + 3,
    })?;
    let idx = b.upload_index(slots)?;
    if fused {
        u.prepare(b, i.p, Some((&mut slab, &idx)))?;
    } else {
        u.prepare(b, i.p, None)?;
        b.kv_store(&mut slab, &u.qkv[1], &u.qkv[2], &idx)?;
    }
    let [q, k, v] = &u.qkv;
    Ok(Prepared {
        qkv: vec![b.download(q)?, b.download(k)?, b.download(v)?],
        slab: b.kv_slab_contents(&slab)?,
    })
}

/// `qkv_norm_rope_store_idx` (a KV-owning layer's q / k / v preparation and K/V store in
/// one call) against `qkv_norm_rope_idx` then `kv_store` on the same backend, bit for bit:
/// q, k, v and the slab's bytes and scales. The two ops are each checked against the CPU
/// above and in the paged family. Gemma-4's shapes on bf16 slabs (one launch on the GPU),
/// quantized slabs, bf16 norm weights and a layer without v's norm (the store after it).
pub fn check_qkv_norm_rope_store<B: Backend>(b: &B) -> CheckResult {
    use RopeStyle::Neox;
    let f32w = DType::F32;
    let cases = [
        (
            (1usize, 8usize, 1usize, 256usize, Neox, f32w, 0usize, true),
            KvFormat::Bf16,
        ),
        ((7, 8, 1, 256, Neox, f32w, 0, true), KvFormat::Bf16),
        ((3, 8, 1, 512, Neox, f32w, 192, true), KvFormat::Bf16),
        ((5, 8, 2, 128, Neox, f32w, 16, true), KvFormat::Bf16),
        (
            (4, 8, 1, 256, Neox, f32w, 0, true),
            KvFormat::Fp8E4m3PerTokenHead,
        ),
        (
            (4, 8, 1, 512, Neox, f32w, 0, true),
            KvFormat::Int8PerTokenHead,
        ),
        ((2, 4, 2, 64, Neox, DType::BF16, 0, true), KvFormat::Bf16),
        ((2, 4, 2, 64, Neox, f32w, 0, false), KvFormat::Bf16),
    ];
    for (seed, &(case, format)) in cases.iter().enumerate() {
        let mut data = TestData::new(400 + seed as u64);
        let shape = QkvShape::from(case);
        let inputs = QkvInputs::random(shape, &mut data, (613, 9));
        let tokens = shape.tokens;
        // Every other slot of the slab's 2 tokens + 3, last first: token t at 2 (tokens - t) + 2.
        let slots: Vec<u32> = (0..tokens).map(|t| (2 * (tokens - t) + 2) as u32).collect();
        let what = format!("qkv_norm_rope_store {} {format:?}", shape.label());
        let fused = ctx(&what, prepare_and_store(b, &inputs, format, &slots, true))?;
        let apart = ctx(&what, prepare_and_store(b, &inputs, format, &slots, false))?;
        for (name, (f, a)) in ["q", "k", "v"].iter().zip(fused.qkv.iter().zip(&apart.qkv)) {
            if let Some(i) = f
                .iter()
                .zip(a)
                .position(|(x, y)| x.to_bits() != y.to_bits())
            {
                return Err(format!(
                    "{what}: {name}[{i}] is {} fused, {} by the two ops",
                    f[i], a[i]
                ));
            }
        }
        if fused.slab != apart.slab {
            return Err(format!("{what}: the slab differs from kv_store's"));
        }
        if fused.slab.k.iter().all(|&x| x == 0) {
            return Err(format!("{what}: nothing was stored"));
        }
    }
    Ok(())
}

/// `act_mul_slice`: Gemma-4 E2B's per-layer-input shapes (256 columns of 35 x 256), both
/// activations, first and last slice.
pub fn check_act_mul_slice<B: Backend>(b: &B) -> CheckResult {
    let cases = [
        (1usize, 256usize, 35usize, 0usize, Activation::GeluTanh),
        (7, 256, 35, 34, Activation::GeluTanh),
        (3, 10, 4, 2, Activation::Silu),
    ];
    for (seed, &(rows, cols, layers, layer, act)) in cases.iter().enumerate() {
        let mut data = TestData::new(80 + seed as u64);
        let gate = data.normals(rows * cols, 2.0, DType::F32);
        let table = data.normals(rows * cols * layers, 1.0, DType::F32);
        let s = TableSlice {
            cols,
            offset: layer * cols,
            stride: layers * cols,
        };
        let what = format!("act_mul_slice {rows}x{cols} of {layers} layers, slice {layer} {act:?}");
        same_as_cpu(
            &what,
            b,
            |b| act_mul_slice(b, act, &gate, &table, s),
            |c| act_mul_slice(c, act, &gate, &table, s),
        )?;
    }
    // A slice reaching past the table's rows is refused.
    let g = put(b, &[0.0; 4], DType::F32)?;
    let t = put(b, &[0.0; 6], DType::F32)?;
    let mut out = put(b, &[0.0; 4], DType::F32)?;
    let bad = TableSlice {
        cols: 2,
        offset: 2,
        stride: 3,
    };
    if b.act_mul_slice(Activation::Silu, &g, &t, bad, &mut out)
        .is_ok()
    {
        return Err("act_mul_slice accepted a slice wider than its table's rows".into());
    }
    Ok(())
}

fn act_mul_slice<B: Backend>(
    b: &B,
    act: Activation,
    gate: &[f32],
    table: &[f32],
    s: TableSlice,
) -> crate::Result<B::Buffer> {
    let g = b.upload_f32_as(gate, DType::F32)?;
    let t = b.upload_f32_as(table, DType::F32)?;
    let mut out = b.zeros(gate.len(), DType::F32)?;
    b.act_mul_slice(act, &g, &t, s, &mut out)?;
    Ok(out)
}

/// Every fused op in turn: the residual norms, `head_norm_rope_idx`, `qkv_norm_rope_idx`
/// (alone and followed by the KV store) and `act_mul_slice`.
pub fn check_fused<B: Backend>(b: &B) -> CheckResult {
    check_fused_norms(b)?;
    check_head_norm_rope(b)?;
    check_qkv_norm_rope(b)?;
    check_qkv_norm_rope_store(b)?;
    check_act_mul_slice(b)
}
