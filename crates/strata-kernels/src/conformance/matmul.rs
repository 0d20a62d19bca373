//! Dense and quantized matmul, and the embedding gather that shares their weight types.

use super::{compare, ctx, get, put, reference, CheckResult, TestData, Tolerance};
use crate::quant::PreparedInput;
use crate::{Activation, Backend, DType, MatmulOut, MatmulShape, MatrixShape, RowDot, TableSlice};

/// A minimal quantized format for the checks: int8 values with one f32 scale per row
/// (`w = scale * q`). Real formats (GGUF blocks) live in the weights crate; this one only
/// has to exercise the [`RowDot`] path.
#[derive(Clone, Debug)]
pub struct RowScaledQ8 {
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features).
    pub cols: usize,
    /// One scale per row.
    pub scales: Vec<f32>,
    /// The int8 values, `[rows, cols]` row-major.
    pub q: Vec<i8>,
}

impl RowScaledQ8 {
    /// Quantizes `w [rows, cols]` with a per-row absmax scale.
    pub fn quantize(w: &[f32], rows: usize, cols: usize) -> Self {
        let mut scales = Vec::with_capacity(rows);
        let mut q = Vec::with_capacity(w.len());
        for row in w.chunks(cols) {
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
            scales.push(scale);
            q.extend(
                row.iter()
                    .map(|v| (v / scale).round().clamp(-127.0, 127.0) as i8),
            );
        }
        Self {
            rows,
            cols,
            scales,
            q,
        }
    }

    /// The exact f32 weights this matrix stands for.
    pub fn dequantized(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, o) in out.chunks_mut(self.cols).enumerate() {
            self.dequant_row(r, o);
        }
        out
    }
}

impl MatrixShape for RowScaledQ8 {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

impl RowDot for RowScaledQ8 {
    fn dot_row(&self, row: usize, x: &[f32]) -> f32 {
        let q = &self.q[row * self.cols..(row + 1) * self.cols];
        let s: f32 = q.iter().zip(x).map(|(&q, &x)| q as f32 * x).sum();
        s * self.scales[row]
    }

    fn dequant_row(&self, row: usize, out: &mut [f32]) {
        let q = &self.q[row * self.cols..(row + 1) * self.cols];
        for (o, &q) in out.iter_mut().zip(q) {
            *o = self.scales[row] * q as f32;
        }
    }

    /// The inputs kept as they are, so a backend's prepared-input paths (one conversion
    /// shared by several products) run in the checks too.
    fn prepare(&self, xs: &[f32], input: &mut PreparedInput) -> bool {
        input.state = Some(Box::new(xs.to_vec()));
        true
    }

    fn prepared_key(&self) -> Option<u64> {
        Some(u64::from_le_bytes(*b"rowq8\0\0\0"))
    }

    fn dot_prepared(
        &self,
        rows: std::ops::Range<usize>,
        input: &PreparedInput,
        tokens: std::ops::Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        let xs = input
            .state
            .as_ref()
            .and_then(|s| s.downcast_ref::<Vec<f32>>());
        for (i, r) in rows.enumerate() {
            for (j, t) in tokens.clone().enumerate() {
                out[i * stride + j] = match xs {
                    Some(xs) => self.dot_row(r, &xs[t * self.cols..(t + 1) * self.cols]),
                    None => f32::NAN,
                };
            }
        }
    }
}

/// One matmul check: random `x [tokens, in_features]` times a random weight
/// `[out_features, in_features]` transposed.
#[derive(Clone, Copy, Debug)]
pub struct MatmulCase {
    /// Rows of `x`.
    pub tokens: usize,
    /// Length of each row of `x` (columns of the weight).
    pub in_features: usize,
    /// Rows of the weight (columns of the output).
    pub out_features: usize,
    /// The weight's dtype (F32 only for the quantized checks, which quantize it).
    pub weight: DType,
    /// Seed of the [`TestData`] inputs.
    pub seed: u64,
}

/// [`Backend::matmul`] on case `c` against [`reference::matmul`].
pub fn check_matmul_case<B: Backend>(b: &B, c: MatmulCase) -> CheckResult {
    let act = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let (k, n) = (c.in_features, c.out_features);
    let x = data.normals(c.tokens * k, 1.0, act);
    let w = data.normals(n * k, 0.05, c.weight);
    let what = format!("matmul {c:?}");
    let xb = put(b, &x, act)?;
    let wb = put(b, &w, c.weight)?;
    let mut out = ctx(&what, b.zeros(c.tokens * n, act))?;
    let shape = MatmulShape {
        in_features: k,
        out_features: n,
    };
    ctx(&what, b.matmul(&xb, &wb, shape, &mut out))?;
    let (want, mag) = reference::matmul(&x, &w, k, n);
    compare(
        &what,
        &get(b, &out)?,
        &want,
        &mag,
        Tolerance::for_dtype(act),
    )
}

/// GEMV and GEMM on the real projection sizes (576 x 1536, 640 x 2048), odd sizes that
/// leave vector tails, and every weight dtype; plus a shape error.
pub fn check_matmul<B: Backend>(b: &B) -> CheckResult {
    let shapes = [
        (1, 576, 1536),
        (1, 640, 2048),
        (7, 576, 300),
        (13, 100, 37),
        (1, 17, 1),
        (9, 1, 5),
        (40, 64, 70),
        // Row counts 2..8 with k % 8 == 0: the GEMV path of a device backend.
        (2, 1536, 33),
        (3, 256, 130),
        (5, 64, 17),
        (8, 2048, 40),
        (6, 24, 3),
    ];
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    for (i, &(tokens, in_features, out_features)) in shapes.iter().enumerate() {
        for (j, &weight) in dtypes.iter().enumerate() {
            check_matmul_case(
                b,
                MatmulCase {
                    tokens,
                    in_features,
                    out_features,
                    weight,
                    seed: (i * 3 + j) as u64,
                },
            )?;
        }
    }
    let act = b.activation_dtype();
    let x = put(b, &[1.0; 6], act)?;
    let w = put(b, &[1.0; 6], DType::F32)?;
    let mut out = put(b, &[0.0; 5], act)?;
    let bad = MatmulShape {
        in_features: 3,
        out_features: 2,
    };
    if b.matmul(&x, &w, bad, &mut out).is_ok() {
        return Err("matmul accepted out of 5 for 2 tokens x 2 outputs".into());
    }
    Ok(())
}

/// Products that share one x (`matmul_shared_input`): `tokens` rows of `in_features`
/// against one weight of each of `outs` output features, all of dtype `weight`.
#[derive(Clone, Debug)]
pub struct SharedMatmulCase {
    /// Rows of `x`.
    pub tokens: usize,
    /// Length of each row of `x` (columns of the weight).
    pub in_features: usize,
    /// Output features of each weight, one product each.
    pub outs: Vec<usize>,
    /// The weights' dtype.
    pub weight: DType,
    /// Seed of the [`TestData`] inputs.
    pub seed: u64,
}

/// [`Backend::matmul_shared_input`] on case `c`: each output against
/// [`reference::matmul`], within `tol`.
pub fn check_shared_matmul_case<B: Backend>(
    b: &B,
    c: &SharedMatmulCase,
    tol: Tolerance,
) -> CheckResult {
    let act = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let k = c.in_features;
    let x = data.normals(c.tokens * k, 1.0, act);
    let ws: Vec<Vec<f32>> = c
        .outs
        .iter()
        .map(|&n| data.normals(n * k, 0.05, c.weight))
        .collect();
    let what = format!("matmul_shared_input {c:?}");
    let xb = put(b, &x, act)?;
    let wbs = ws
        .iter()
        .map(|w| put(b, w, c.weight))
        .collect::<Result<Vec<_>, _>>()?;
    let mut outs = c
        .outs
        .iter()
        .map(|&n| ctx(&what, b.zeros(c.tokens * n, act)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut mats: Vec<MatmulOut<'_, B::Buffer>> = wbs
        .iter()
        .zip(outs.iter_mut())
        .zip(&c.outs)
        .map(|((w, out), &n)| MatmulOut {
            w,
            shape: MatmulShape {
                in_features: k,
                out_features: n,
            },
            out,
        })
        .collect();
    ctx(&what, b.matmul_shared_input(&xb, &mut mats))?;
    drop(mats);
    for (i, (w, out)) in ws.iter().zip(&outs).enumerate() {
        let (want, mag) = reference::matmul(&x, w, k, c.outs[i]);
        compare(
            &format!("{what} output {i}"),
            &get(b, out)?,
            &want,
            &mag,
            tol,
        )?;
    }
    Ok(())
}

/// The gated MLP product (`gated_matmul`): `act(x gate^T) * (x up^T)`.
#[derive(Clone, Copy, Debug)]
pub struct GatedMatmulCase {
    /// Rows of `x`.
    pub tokens: usize,
    /// Length of each row of `x` (columns of the weight).
    pub in_features: usize,
    /// Rows of each of gate and up (columns of the output).
    pub out_features: usize,
    /// Dtype of gate and up.
    pub weight: DType,
    /// The activation applied to the gate product.
    pub act: Activation,
    /// Seed of the [`TestData`] inputs; odd seeds upload up before gate.
    pub seed: u64,
}

/// [`Backend::gated_matmul`] on case `c` against the f64 definition, within `tol`.
pub fn check_gated_matmul_case<B: Backend>(
    b: &B,
    c: GatedMatmulCase,
    tol: Tolerance,
) -> CheckResult {
    let dt = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let (k, n) = (c.in_features, c.out_features);
    let x = data.normals(c.tokens * k, 1.0, dt);
    let gate = data.normals(n * k, 0.05, c.weight);
    let up = data.normals(n * k, 0.05, c.weight);
    let what = format!("gated_matmul {c:?}");
    let mut out = ctx(&what, b.zeros(c.tokens * n, dt))?;
    let shape = MatmulShape {
        in_features: k,
        out_features: n,
    };
    // Odd seeds put up on the backend before gate, so a backend that orders the two by
    // their addresses (the CUDA backend's batched pair) meets both orders.
    let xb = put(b, &x, dt)?;
    let (gb, ub) = if c.seed % 2 == 1 {
        let ub = put(b, &up, c.weight)?;
        (put(b, &gate, c.weight)?, ub)
    } else {
        let gb = put(b, &gate, c.weight)?;
        (gb, put(b, &up, c.weight)?)
    };
    ctx(&what, b.gated_matmul(c.act, &xb, &gb, &ub, shape, &mut out))?;
    let (want, mag) = gated_reference(c.act, &x, (&gate, &up), k, n);
    compare(&what, &get(b, &out)?, &want, &mag, tol)
}

/// `act(x gate^T) * (x up^T)` in f64 and each value's error scale: an error e in the gate
/// moves act(g) by at most 1.13 e (the activations' steepest slope) and one in up moves the
/// product by |act(g)| <= |g| times it; the gelu cancellation of act_mul's check comes on
/// top.
fn gated_reference(
    act: Activation,
    x: &[f32],
    (gate, up): (&[f32], &[f32]),
    k: usize,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (g, g_mag) = reference::matmul(x, gate, k, n);
    let (u, u_mag) = reference::matmul(x, up, k, n);
    let f = |v: f64| reference::activation(act, v);
    let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| f(g) * u).collect();
    let mag: Vec<f64> = (0..want.len())
        .map(|i| {
            1.13 * g_mag[i] * u[i].abs() + g[i].abs() * u_mag[i] + 0.05 * g[i].abs() * u[i].abs()
        })
        .collect();
    (want, mag)
}

/// `matmul_shared_input` on a layer's q / k / v shapes (GEMV and GEMM row counts, a
/// one-feature weight, more weights than one GEMV launch takes, k not a multiple of 8) and
/// `gated_matmul` on MLP shapes, for both activations; at `tol`.
pub fn check_fused_matmuls_within<B: Backend>(b: &B, tol: Tolerance) -> CheckResult {
    let shared = [
        (1, 1536, vec![2048, 256, 256], DType::BF16),
        (2, 1536, vec![4096, 512, 512], DType::BF16),
        (1, 64, vec![17, 1, 5], DType::BF16),
        (3, 256, vec![130, 64], DType::BF16),
        (9, 64, vec![40, 8, 8], DType::F32),
        (1, 20, vec![7, 3], DType::BF16),
        (2, 64, vec![33], DType::BF16),
        (1, 64, vec![8, 8, 8, 8], DType::BF16),
        (5, 128, vec![24, 16, 9], DType::BF16),
    ];
    for (i, (tokens, in_features, outs, weight)) in shared.into_iter().enumerate() {
        let c = SharedMatmulCase {
            tokens,
            in_features,
            outs,
            weight,
            seed: 700 + i as u64,
        };
        check_shared_matmul_case(b, &c, tol)?;
    }
    let gated = [
        (1, 1536, 6144, DType::BF16),
        (2, 2048, 4096, DType::BF16),
        (3, 256, 130, DType::BF16),
        (1, 24, 5, DType::F32),
        (5, 64, 17, DType::BF16),
        (1, 1536, 1, DType::BF16),
        (8, 128, 40, DType::BF16),
    ];
    for (i, (tokens, in_features, out_features, weight)) in gated.into_iter().enumerate() {
        for act in [Activation::GeluTanh, Activation::Silu] {
            let c = GatedMatmulCase {
                tokens,
                in_features,
                out_features,
                weight,
                act,
                seed: 800 + i as u64,
            };
            check_gated_matmul_case(b, c, tol)?;
        }
    }
    // Gemma-4's per-layer-input gate: E2B's shapes (256 of 35 x 256 columns, first and
    // last slice) and small odd ones.
    let sliced = [
        (1, 1536, 256, 35, 34, DType::BF16),
        (2, 1536, 256, 35, 0, DType::BF16),
        (3, 64, 40, 4, 2, DType::BF16),
        (5, 24, 7, 3, 1, DType::F32),
    ];
    for (i, (tokens, k, n, layers, layer, weight)) in sliced.into_iter().enumerate() {
        for act in [Activation::GeluTanh, Activation::Silu] {
            let c = GatedSliceCase {
                tokens,
                in_features: k,
                out_features: n,
                layers,
                layer,
                weight,
                act,
                seed: 900 + i as u64,
            };
            check_gated_slice_matmul_case(b, c, tol)?;
        }
    }
    let dt = b.activation_dtype();
    let x = put(b, &[1.0; 8], dt)?;
    let w = put(b, &[1.0; 8], DType::BF16)?;
    let table = put(b, &[1.0; 6], DType::F32)?;
    let wide = TableSlice {
        cols: 2,
        offset: 2,
        stride: 3,
    };
    let mut two = put(b, &[0.0; 4], dt)?;
    let shape = MatmulShape {
        in_features: 4,
        out_features: 2,
    };
    if b.gated_slice_matmul(Activation::Silu, &x, &w, shape, &table, wide, &mut two)
        .is_ok()
    {
        return Err("gated_slice_matmul accepted a slice wider than its table's rows".into());
    }
    let mut out = put(b, &[0.0; 3], dt)?;
    let shape = MatmulShape {
        in_features: 4,
        out_features: 2,
    };
    if b.gated_matmul(Activation::Silu, &x, &w, &w, shape, &mut out)
        .is_ok()
    {
        return Err("gated_matmul accepted out of 3 for 2 tokens x 2 outputs".into());
    }
    Ok(())
}

/// The gated product with a table slice as the up side (`gated_slice_matmul`):
/// `act(x w^T) * table[t, layer slice]`.
#[derive(Clone, Copy, Debug)]
pub struct GatedSliceCase {
    /// Rows of `x`.
    pub tokens: usize,
    /// Length of each row of `x` (columns of the weight).
    pub in_features: usize,
    /// Rows of the weight, and columns of each table slice and of the output.
    pub out_features: usize,
    /// The table holds `layers` slices of `out_features` columns a row; `layer` is used.
    pub layers: usize,
    /// Which slice of each table row is read.
    pub layer: usize,
    /// The weight's dtype.
    pub weight: DType,
    /// The activation applied to the product.
    pub act: Activation,
    /// Seed of the [`TestData`] inputs.
    pub seed: u64,
}

/// `gated_slice_matmul` against the f64 definition.
pub fn check_gated_slice_matmul_case<B: Backend>(
    b: &B,
    c: GatedSliceCase,
    tol: Tolerance,
) -> CheckResult {
    let dt = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let (k, n) = (c.in_features, c.out_features);
    let x = data.normals(c.tokens * k, 1.0, dt);
    let w = data.normals(n * k, 0.05, c.weight);
    let table = data.normals(c.tokens * n * c.layers, 1.0, DType::F32);
    let s = TableSlice {
        cols: n,
        offset: c.layer * n,
        stride: c.layers * n,
    };
    let what = format!("gated_slice_matmul {c:?}");
    let mut out = ctx(&what, b.zeros(c.tokens * n, dt))?;
    let shape = MatmulShape {
        in_features: k,
        out_features: n,
    };
    ctx(
        &what,
        b.gated_slice_matmul(
            c.act,
            &put(b, &x, dt)?,
            &put(b, &w, c.weight)?,
            shape,
            &put(b, &table, DType::F32)?,
            s,
            &mut out,
        ),
    )?;
    let (g, g_mag) = reference::matmul(&x, &w, k, n);
    let act = |v: f64| reference::activation(c.act, v);
    let tab = |i: usize| table[(i / n) * s.stride + s.offset + i % n] as f64;
    let want: Vec<f64> = (0..g.len()).map(|i| act(g[i]) * tab(i)).collect();
    // As for gated_matmul: an error e in the product moves act by at most 1.13 e.
    let mag: Vec<f64> = (0..g.len())
        .map(|i| (1.13 * g_mag[i] + 0.05 * g[i].abs()) * tab(i).abs())
        .collect();
    compare(&what, &get(b, &out)?, &want, &mag, tol)
}

/// [`check_fused_matmuls_within`] at the activation dtype's tolerance.
pub fn check_fused_matmuls<B: Backend>(b: &B) -> CheckResult {
    check_fused_matmuls_within(b, Tolerance::for_dtype(b.activation_dtype()))
}

/// [`Backend::matmul_quant`] on case `c` with a [`RowScaledQ8`] weight (turned into the
/// backend's form by `prepare`) against [`reference::matmul`] of the dequantized weight.
pub fn check_matmul_quant_case<B: Backend>(
    b: &B,
    c: MatmulCase,
    prepare: &dyn Fn(&RowScaledQ8) -> Box<B::QuantMatrix>,
) -> CheckResult {
    let act = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let (k, n) = (c.in_features, c.out_features);
    let x = data.normals(c.tokens * k, 1.0, act);
    let q = RowScaledQ8::quantize(&data.normals(n * k, 0.05, DType::F32), n, k);
    let what = format!("matmul_quant {c:?}");
    let xb = put(b, &x, act)?;
    let wq = prepare(&q);
    let mut out = ctx(&what, b.zeros(c.tokens * n, act))?;
    ctx(&what, b.matmul_quant(&xb, &wq, &mut out))?;
    let (want, mag) = reference::matmul(&x, &q.dequantized(), k, n);
    compare(
        &what,
        &get(b, &out)?,
        &want,
        &mag,
        Tolerance::for_dtype(act),
    )
}

/// [`check_matmul_quant_case`] on three shapes (1, 6 and 33 tokens).
pub fn check_matmul_quant<B: Backend>(
    b: &B,
    prepare: &dyn Fn(&RowScaledQ8) -> Box<B::QuantMatrix>,
) -> CheckResult {
    for (seed, &(tokens, in_features, out_features)) in [(1, 576, 300), (6, 256, 129), (33, 64, 17)]
        .iter()
        .enumerate()
    {
        let c = MatmulCase {
            tokens,
            in_features,
            out_features,
            weight: DType::F32,
            seed: 200 + seed as u64,
        };
        check_matmul_quant_case(b, c, prepare)?;
    }
    Ok(())
}

/// [`Backend::matmul_quant_shared_input`] (q, k and v shapes) and
/// [`Backend::gated_matmul_quant`] (both activations) with [`RowScaledQ8`] weights, for one
/// token and for several, against the f64 definitions.
pub fn check_fused_matmuls_quant<B: Backend>(
    b: &B,
    prepare: &dyn Fn(&RowScaledQ8) -> Box<B::QuantMatrix>,
) -> CheckResult {
    let dt = b.activation_dtype();
    let tol = Tolerance::for_dtype(dt);
    for (seed, tokens) in [(1u64, 1usize), (2, 5)] {
        let mut data = TestData::new(300 + seed);
        let k = 192;
        let x = data.normals(tokens * k, 1.0, dt);
        let xb = put(b, &x, dt)?;
        let outs = [160, 48, 48];
        let ws: Vec<RowScaledQ8> = outs
            .iter()
            .map(|&n| RowScaledQ8::quantize(&data.normals(n * k, 0.05, DType::F32), n, k))
            .collect();
        let what = format!("matmul_quant_shared_input, {tokens} tokens");
        let wqs: Vec<Box<B::QuantMatrix>> = ws.iter().map(prepare).collect();
        let mut bufs = outs
            .iter()
            .map(|&n| ctx(&what, b.zeros(tokens * n, dt)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut mats: Vec<(&B::QuantMatrix, &mut B::Buffer)> =
            wqs.iter().map(|w| &**w).zip(bufs.iter_mut()).collect();
        ctx(&what, b.matmul_quant_shared_input(&xb, &mut mats))?;
        drop(mats);
        for (i, (w, out)) in ws.iter().zip(&bufs).enumerate() {
            let (want, mag) = reference::matmul(&x, &w.dequantized(), k, w.rows);
            compare(
                &format!("{what} output {i}"),
                &get(b, out)?,
                &want,
                &mag,
                tol,
            )?;
        }
        let n = 96;
        let (gate, up) = (
            RowScaledQ8::quantize(&data.normals(n * k, 0.05, DType::F32), n, k),
            RowScaledQ8::quantize(&data.normals(n * k, 0.05, DType::F32), n, k),
        );
        let (gq, uq) = (prepare(&gate), prepare(&up));
        let (gate_w, up_w) = (gate.dequantized(), up.dequantized());
        for act in [Activation::GeluTanh, Activation::Silu] {
            let what = format!("gated_matmul_quant {act:?}, {tokens} tokens");
            let mut out = ctx(&what, b.zeros(tokens * n, dt))?;
            ctx(&what, b.gated_matmul_quant(act, &xb, &gq, &uq, &mut out))?;
            let (want, mag) = gated_reference(act, &x, (&gate_w, &up_w), k, n);
            compare(&what, &get(b, &out)?, &want, &mag, tol)?;
        }
    }
    Ok(())
}

/// One embedding check: `tokens` random ids gathered from a `[vocab, hidden]` table.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingCase {
    /// Rows of the table.
    pub vocab: usize,
    /// Values a row.
    pub hidden: usize,
    /// Ids looked up.
    pub tokens: usize,
    /// The table's dtype.
    pub table: DType,
    /// Multiplies every gathered value.
    pub scale: f32,
    /// Seed of the [`TestData`] inputs.
    pub seed: u64,
}

fn random_ids(data: &mut TestData, c: &EmbeddingCase) -> Vec<u32> {
    (0..c.tokens).map(|_| data.below(c.vocab) as u32).collect()
}

fn gathered(table: &[f32], ids: &[u32], hidden: usize, scale: f32) -> Vec<f64> {
    ids.iter()
        .flat_map(|&id| table[id as usize * hidden..][..hidden].iter())
        .map(|&v| v as f64 * scale as f64)
        .collect()
}

/// [`Backend::embedding`] on case `c`: the scaled rows of the ids.
pub fn check_embedding_case<B: Backend>(b: &B, c: EmbeddingCase) -> CheckResult {
    let act = b.activation_dtype();
    let mut data = TestData::new(c.seed);
    let table = data.normals(c.vocab * c.hidden, 1.0, c.table);
    let ids = random_ids(&mut data, &c);
    let what = format!("embedding {c:?}");
    let tb = put(b, &table, c.table)?;
    let mut out = ctx(&what, b.zeros(c.tokens * c.hidden, act))?;
    ctx(&what, b.embedding(&ids, &tb, c.hidden, c.scale, &mut out))?;
    let want = gathered(&table, &ids, c.hidden, c.scale);
    compare(&what, &get(b, &out)?, &want, &[], Tolerance::for_dtype(act))
}

/// Gemma's rounded scales (39.25 in bf16 for H = 1536), repeated ids, every table dtype;
/// an out-of-range id must be refused.
pub fn check_embedding<B: Backend>(b: &B) -> CheckResult {
    let cases = [
        (300, 1536, 5, DType::BF16, 39.25),
        (50, 64, 9, DType::F32, 8.0f32.sqrt()),
        (7, 33, 20, DType::F16, 1.0),
        (1, 8, 3, DType::F32, 16.0),
        // Rows of several blocks (2,048 values each): a per-layer-input table's 8,960, a
        // partial last slice, and the f32 and unaligned paths past one slice.
        (40, 8960, 3, DType::BF16, 16.0),
        (20, 4104, 2, DType::F16, 0.5),
        (10, 2056, 2, DType::F32, 2.0),
        (6, 2051, 4, DType::BF16, 1.0),
    ];
    for (seed, &(vocab, hidden, tokens, table, scale)) in cases.iter().enumerate() {
        let c = EmbeddingCase {
            vocab,
            hidden,
            tokens,
            table,
            scale,
            seed: 300 + seed as u64,
        };
        check_embedding_case(b, c)?;
    }
    let tb = put(b, &[0.0; 8], DType::F32)?;
    let mut out = put(b, &[0.0; 4], b.activation_dtype())?;
    if b.embedding(&[2], &tb, 4, 1.0, &mut out).is_ok() {
        return Err("embedding accepted id 2 with a vocab of 2".into());
    }
    Ok(())
}

/// [`Backend::embedding_quant`] on a [`RowScaledQ8`] table: the scaled dequantized rows.
pub fn check_embedding_quant<B: Backend>(
    b: &B,
    prepare: &dyn Fn(&RowScaledQ8) -> Box<B::QuantMatrix>,
) -> CheckResult {
    let act = b.activation_dtype();
    let c = EmbeddingCase {
        vocab: 40,
        hidden: 96,
        tokens: 11,
        table: DType::F32,
        scale: 16.0,
        seed: 400,
    };
    let mut data = TestData::new(c.seed);
    let q = RowScaledQ8::quantize(
        &data.normals(c.vocab * c.hidden, 1.0, DType::F32),
        c.vocab,
        c.hidden,
    );
    let ids = random_ids(&mut data, &c);
    let what = format!("embedding_quant {c:?}");
    let mut out = ctx(&what, b.zeros(c.tokens * c.hidden, act))?;
    ctx(
        &what,
        b.embedding_quant(&ids, &prepare(&q), c.scale, &mut out),
    )?;
    let want = gathered(&q.dequantized(), &ids, c.hidden, c.scale);
    compare(&what, &get(b, &out)?, &want, &[], Tolerance::for_dtype(act))
}
