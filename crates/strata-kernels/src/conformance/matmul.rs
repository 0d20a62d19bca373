//! Dense and quantized matmul, and the embedding gather that shares their weight types.

use super::{compare, ctx, get, put, reference, CheckResult, TestData, Tolerance};
use crate::{Backend, DType, MatmulShape, MatrixShape, RowDot};

/// A minimal quantized format for the checks: int8 values with one f32 scale per row
/// (`w = scale * q`). Real formats (GGUF blocks) live in the weights crate; this one only
/// has to exercise the [`RowDot`] path.
#[derive(Clone, Debug)]
pub struct RowScaledQ8 {
    pub rows: usize,
    pub cols: usize,
    pub scales: Vec<f32>,
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
}

#[derive(Clone, Copy, Debug)]
pub struct MatmulCase {
    pub tokens: usize,
    pub in_features: usize,
    pub out_features: usize,
    pub weight: DType,
    pub seed: u64,
}

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

#[derive(Clone, Copy, Debug)]
pub struct EmbeddingCase {
    pub vocab: usize,
    pub hidden: usize,
    pub tokens: usize,
    pub table: DType,
    pub scale: f32,
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
