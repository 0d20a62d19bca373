//! Weight matrices on a backend: dense (f32 / bf16 / f16) or quantized (GGUF block formats).

use std::sync::Arc;

use std::ops::Range;

use strata_kernels::cpu::{CpuBackend, PreparedInput};
use strata_kernels::{
    Activation, Backend, DType, DeviceBuffer, HostSlice, MatmulOut, MatmulShape, MatrixShape,
    RowDot, TableSlice,
};
use strata_weights::{quant, GgmlType, TensorView};

use crate::error::{ModelError, Result};

/// A `[rows, cols]` weight matrix (rows = output features) ready for `matmul`.
pub enum Linear<B: Backend> {
    /// A dense matrix in the backend's memory.
    Dense {
        /// The `rows * cols` elements, row-major.
        w: B::Buffer,
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
    },
    /// A GGUF block-quantized matrix, as the backend takes it (`QuantUpload`).
    Quant(Arc<B::QuantMatrix>),
    /// A table kept in host memory for row lookups only (`--embed-weights host`): each
    /// step's rows are gathered on the host and only they cross to the backend.
    Host(HostTable),
}

impl<B: QuantUpload> Linear<B> {
    /// Bytes of the backend's memory the matrix takes (0 for a host table).
    pub fn backend_bytes(&self) -> usize {
        match self {
            Linear::Dense { w, .. } => w.len() * w.dtype().size_bytes(),
            Linear::Quant(q) => B::quant_bytes(q),
            Linear::Host(_) => 0,
        }
    }
}

/// A `[rows, cols]` table in host memory, rows decoded to f32 on lookup.
pub struct HostTable {
    rows: usize,
    cols: usize,
    data: HostTableData,
}

enum HostTableData {
    Dense(Vec<f32>),
    Bf16(Vec<half::bf16>),
    F16(Vec<half::f16>),
    Quant(QuantWeight),
}

impl HostTable {
    /// Copies a stored tensor into host memory (f32, bf16 and f16 as they are; block formats
    /// kept as blocks).
    pub fn new(view: &TensorView<'_>) -> Result<Self> {
        let (rows, cols) = (view.rows(), view.row_len());
        let data = match view.ty {
            GgmlType::F32 => HostTableData::Dense(view.to_f32_vec()?),
            GgmlType::BF16 => HostTableData::Bf16(
                view.bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            GgmlType::F16 => HostTableData::F16(
                view.bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            _ => HostTableData::Quant(QuantWeight::new(view)?),
        };
        Ok(Self { rows, cols, data })
    }

    /// Host bytes the table holds.
    pub fn bytes(&self) -> usize {
        match &self.data {
            HostTableData::Dense(v) => v.len() * 4,
            HostTableData::Bf16(v) => v.len() * 2,
            HostTableData::F16(v) => v.len() * 2,
            HostTableData::Quant(q) => q.bytes.len(),
        }
    }

    fn row(&self, r: usize, out: &mut [f32]) {
        let span = r * self.cols..(r + 1) * self.cols;
        match &self.data {
            HostTableData::Dense(v) => out.copy_from_slice(&v[span]),
            HostTableData::Bf16(v) => {
                for (o, x) in out.iter_mut().zip(&v[span]) {
                    *o = x.to_f32();
                }
            }
            HostTableData::F16(v) => {
                for (o, x) in out.iter_mut().zip(&v[span]) {
                    *o = x.to_f32();
                }
            }
            HostTableData::Quant(q) => q.dequant_row(r, out),
        }
    }

    /// `[ids.len(), cols]` rows times `scale`, as f32 (the multiply in f32 after widening,
    /// as the backends' embedding ops do).
    pub fn gather(&self, ids: &[u32], scale: f32) -> Result<Vec<f32>> {
        let mut out = vec![0f32; ids.len() * self.cols];
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.cols.max(1))) {
            if id as usize >= self.rows {
                return Err(ModelError::Invalid(format!(
                    "token id {id} outside a table of {} rows",
                    self.rows
                )));
            }
            self.row(id as usize, o);
            for v in o.iter_mut() {
                *v *= scale;
            }
        }
        Ok(out)
    }
}

impl<B: Backend> Linear<B> {
    /// Output features.
    pub fn rows(&self) -> usize {
        match self {
            Linear::Dense { rows, .. } => *rows,
            Linear::Quant(q) => q.rows(),
            Linear::Host(t) => t.rows,
        }
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            Linear::Dense { cols, .. } => *cols,
            Linear::Quant(q) => q.cols(),
            Linear::Host(t) => t.cols,
        }
    }

    /// The matmul shape: `cols` inputs, `rows` outputs.
    pub fn shape(&self) -> MatmulShape {
        MatmulShape {
            in_features: self.cols(),
            out_features: self.rows(),
        }
    }

    /// `out [T, rows] = x [T, cols] * W^T`.
    pub fn forward(&self, b: &B, x: &B::Buffer, out: &mut B::Buffer) -> Result<()> {
        match self {
            Linear::Dense { w, .. } => b.matmul(x, w, self.shape(), out)?,
            Linear::Quant(q) => b.matmul_quant(x, q, out)?,
            Linear::Host(_) => {
                return Err(ModelError::Invalid(
                    "a host-resident table serves lookups only, not matmuls".into(),
                ))
            }
        }
        Ok(())
    }

    /// `out_i = x * W_i^T` for matrices that all read `x` (a layer's q, k and v): dense
    /// ones go to the backend together, so it can prepare `x` once and launch once.
    pub fn forward_shared(
        b: &B,
        x: &B::Buffer,
        mats: &mut [(&Self, &mut B::Buffer)],
    ) -> Result<()> {
        let mut dense = Vec::with_capacity(mats.len());
        let mut quant = Vec::with_capacity(mats.len());
        for (m, out) in mats.iter_mut() {
            match m {
                Linear::Dense { w, .. } => dense.push(MatmulOut {
                    w,
                    shape: m.shape(),
                    out: &mut **out,
                }),
                Linear::Quant(q) => quant.push((&**q, &mut **out)),
                _ => m.forward(b, x, out)?,
            }
        }
        b.matmul_shared_input(x, &mut dense)?;
        b.matmul_quant_shared_input(x, &mut quant)?;
        Ok(())
    }

    /// `out = act(x * gate^T) * (x * up^T)`: one backend op when both are dense matrices of
    /// one shape (a backend may fuse it), else the two products and `act_mul`.
    pub fn forward_gated(
        b: &B,
        act: Activation,
        gate: &Self,
        up: &Self,
        x: &B::Buffer,
        out: &mut B::Buffer,
    ) -> Result<()> {
        if gate.shape() == up.shape() {
            match (gate, up) {
                (Linear::Dense { w: wg, .. }, Linear::Dense { w: wu, .. }) => {
                    b.gated_matmul(act, x, wg, wu, gate.shape(), out)?;
                    return Ok(());
                }
                (Linear::Quant(g), Linear::Quant(u)) => {
                    b.gated_matmul_quant(act, x, g, u, out)?;
                    return Ok(());
                }
                _ => {}
            }
        }
        let dt = b.activation_dtype();
        let mut g = b.scratch(out.len(), dt)?;
        let mut u = b.scratch(out.len(), dt)?;
        gate.forward(b, x, &mut g)?;
        up.forward(b, x, &mut u)?;
        b.act_mul(act, &g, &u, out)?;
        Ok(())
    }

    /// `out = act(x * W^T) * table[slice]` (Gemma-4's per-layer-input gate): one backend op
    /// for a dense matrix (a backend may fuse it), else the product and `act_mul_slice`.
    pub fn forward_gated_slice(
        &self,
        b: &B,
        act: Activation,
        x: &B::Buffer,
        table: &B::Buffer,
        slice: TableSlice,
        out: &mut B::Buffer,
    ) -> Result<()> {
        if let Linear::Dense { w, .. } = self {
            b.gated_slice_matmul(act, x, w, self.shape(), table, slice, out)?;
            return Ok(());
        }
        let mut g = b.scratch(out.len(), b.activation_dtype())?;
        self.forward(b, x, &mut g)?;
        b.act_mul_slice(act, &g, table, slice, out)?;
        Ok(())
    }

    /// As [`Linear::embed`] with the ids also in backend memory (`ids` stays the host
    /// copy, which only a host-resident table reads).
    pub fn embed_idx(
        &self,
        b: &B,
        ids: &[u32],
        ids_dev: &B::Index,
        scale: f32,
        out: &mut B::Buffer,
    ) -> Result<()> {
        match self {
            Linear::Dense { w, cols, .. } => b.embedding_idx(ids_dev, w, *cols, scale, out)?,
            Linear::Quant(q) => b.embedding_quant_idx(ids_dev, q, scale, out)?,
            Linear::Host(_) => self.embed(b, ids, scale, out)?,
        }
        Ok(())
    }

    /// Whether this is a host-memory lookup table ([`Linear::Host`]).
    pub fn is_host(&self) -> bool {
        matches!(self, Linear::Host(_))
    }

    /// Rows of the matrix as embeddings: `out[t] = W[ids[t]] * scale`.
    pub fn embed(&self, b: &B, ids: &[u32], scale: f32, out: &mut B::Buffer) -> Result<()> {
        match self {
            Linear::Dense { w, cols, .. } => b.embedding(ids, w, *cols, scale, out)?,
            Linear::Quant(q) => b.embedding_quant(ids, q, scale, out)?,
            Linear::Host(t) => {
                *out = b.upload_f32_as(&t.gather(ids, scale)?, b.activation_dtype())?;
            }
        }
        Ok(())
    }
}

/// A quantized matrix in host memory, decoded block by block as rows are used.
pub struct QuantWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    bytes: Vec<u8>,
}

impl QuantWeight {
    /// Copies a block-quantized tensor into host memory; fails if its format cannot be
    /// decoded.
    pub fn new(view: &TensorView<'_>) -> Result<Self> {
        let (rows, cols) = (view.rows(), view.row_len());
        let row_bytes = view.row_bytes();
        let w = Self {
            ty: view.ty,
            rows,
            cols,
            row_bytes,
            bytes: view.bytes.to_vec(),
        };
        // Decoding one row proves the format is supported, so later calls cannot fail.
        let mut probe = vec![0.0; cols];
        quant::dequantize(w.ty, &w.bytes[..row_bytes], &mut probe)
            .map_err(|e| ModelError::Invalid(format!("{}: {e}", view.name)))?;
        Ok(w)
    }
}

impl QuantWeight {
    /// Blocks made on the host (`quantize::at_load`): `bytes` holds `rows` rows of `cols`
    /// values in `ty`.
    pub(crate) fn from_blocks(ty: GgmlType, rows: usize, cols: usize, bytes: Vec<u8>) -> Self {
        Self {
            ty,
            rows,
            cols,
            row_bytes: bytes.len() / rows.max(1),
            bytes,
        }
    }

    /// The block format.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// The blocks of every row, as the file stores them.
    pub fn raw_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl MatrixShape for QuantWeight {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

impl RowDot for QuantWeight {
    fn stored_bytes(&self) -> usize {
        self.bytes.len()
    }

    fn dot_row(&self, row: usize, x: &[f32]) -> f32 {
        let r = &self.bytes[row * self.row_bytes..(row + 1) * self.row_bytes];
        quant::dot_bytes(self.ty, r, x).unwrap_or(f32::NAN)
    }

    fn dequant_row(&self, row: usize, out: &mut [f32]) {
        let r = &self.bytes[row * self.row_bytes..(row + 1) * self.row_bytes];
        if quant::dequantize(self.ty, r, out).is_err() {
            out.fill(f32::NAN);
        }
    }

    /// Quantizes the activations to the 8-bit blocks this format's integer dot pairs with,
    /// once per matmul (see `strata_weights::quant::Q8Input` for the error bound).
    fn prepare(&self, xs: &[f32], input: &mut PreparedInput) -> bool {
        if !quant::has_q8_path(self.ty) {
            return false;
        }
        if !input
            .state
            .as_ref()
            .is_some_and(|s| s.is::<quant::Q8Input>())
        {
            input.state = Some(Box::new(quant::Q8Input::new()));
        }
        match input
            .state
            .as_mut()
            .and_then(|s| s.downcast_mut::<quant::Q8Input>())
        {
            Some(q) => q.quantize(self.ty, xs, self.cols),
            None => false,
        }
    }

    fn prepared_key(&self) -> Option<u64> {
        quant::q8_family(self.ty).map(u64::from)
    }

    fn dot_prepared(
        &self,
        rows: Range<usize>,
        input: &PreparedInput,
        tokens: Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        match input
            .state
            .as_ref()
            .and_then(|s| s.downcast_ref::<quant::Q8Input>())
        {
            Some(q) => quant::dot_rows_q8(
                self.ty,
                &self.bytes,
                self.row_bytes,
                rows,
                q,
                tokens,
                out,
                stride,
            ),
            None => {
                for i in 0..rows.len() {
                    out[i * stride..i * stride + tokens.len()].fill(f32::NAN);
                }
            }
        }
    }
}

/// How a backend takes quantized weights.
pub trait QuantUpload: Backend {
    /// Uploads `w` as the backend's quantized matrix. `None` keeps the blocks where the
    /// backend computes with them (CUDA, for its formats); `Some(dtype)` asks for a dense
    /// matrix there (CUDA decodes to bf16). The CPU always computes on the blocks.
    fn upload_quant(&self, w: QuantWeight, dense: Option<DType>) -> Result<Arc<Self::QuantMatrix>>;

    /// Uploads a bitsandbytes 4-bit matrix: the CPU keeps its codes and decodes them in
    /// each product; CUDA decodes it to a dense matrix of the state's dtype (bf16; f32 for
    /// f32 and f16 states, which bf16 does not hold exactly).
    fn upload_bnb4(&self, w: crate::bnb4::Bnb4Weight) -> Result<Arc<Self::QuantMatrix>>;

    /// Bytes of the backend's memory a quantized matrix takes.
    fn quant_bytes(m: &Self::QuantMatrix) -> usize;
}

impl QuantUpload for CpuBackend {
    fn upload_quant(
        &self,
        w: QuantWeight,
        _dense: Option<DType>,
    ) -> Result<Arc<Self::QuantMatrix>> {
        Ok(Arc::new(w))
    }

    fn upload_bnb4(&self, w: crate::bnb4::Bnb4Weight) -> Result<Arc<Self::QuantMatrix>> {
        Ok(Arc::new(w))
    }

    fn quant_bytes(m: &Self::QuantMatrix) -> usize {
        m.stored_bytes()
    }
}

/// Whether `ty` is a block-quantized format (not F32 / BF16 / F16).
pub fn is_block_format(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::BF16 | GgmlType::F16)
}

/// Uploads a stored matrix: dense types as they are, block formats through `QuantUpload`
/// (decoded to a dense matrix where the backend has the choice).
pub fn upload_linear<B: QuantUpload>(b: &B, view: &TensorView<'_>) -> Result<Linear<B>> {
    upload_linear_as(b, view, None)
}

/// As [`upload_linear`], converting a dense matrix to `dtype` when one is given (f32 for
/// the exact reference path, bf16 for the fast path). Block formats ignore it.
pub fn upload_linear_as<B: QuantUpload>(
    b: &B,
    view: &TensorView<'_>,
    dtype: Option<strata_kernels::DType>,
) -> Result<Linear<B>> {
    let (rows, cols) = (view.rows(), view.row_len());
    let dense = |w| Ok(Linear::Dense { w, rows, cols });
    let stored = match view.ty {
        GgmlType::F32 => Some(strata_kernels::DType::F32),
        GgmlType::BF16 => Some(strata_kernels::DType::BF16),
        GgmlType::F16 => Some(strata_kernels::DType::F16),
        _ => None,
    };
    if let (Some(want), Some(have)) = (dtype, stored) {
        if want != have {
            return dense(b.upload_f32_as(&view.to_f32_vec()?, want)?);
        }
    }
    match view.ty {
        GgmlType::F32 => match view.as_f32() {
            Some(s) => dense(b.upload(HostSlice::F32(s))?),
            None => dense(b.upload(HostSlice::F32(&view.to_f32_vec()?))?),
        },
        GgmlType::BF16 => match view.as_bf16() {
            Some(s) => dense(b.upload(HostSlice::BF16(s))?),
            None => {
                let v: Vec<half::bf16> = view
                    .bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                    .collect();
                dense(b.upload(HostSlice::BF16(&v))?)
            }
        },
        GgmlType::F16 => match view.as_f16() {
            Some(s) => dense(b.upload(HostSlice::F16(s))?),
            None => {
                let v: Vec<half::f16> = view
                    .bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect();
                dense(b.upload(HostSlice::F16(&v))?)
            }
        },
        // Dense where the backend has the choice (bf16 unless another dtype is asked
        // for): blocks stay blocks on a GPU only when the caller passes `None` to
        // `upload_quant` itself (`--gguf-weights blocks`, `--quantize`).
        _ => Ok(Linear::Quant(b.upload_quant(
            QuantWeight::new(view)?,
            Some(dtype.unwrap_or(strata_kernels::DType::BF16)),
        )?)),
    }
}

/// A small vector (norm weight, scalar) decoded to f32 on the backend.
pub fn upload_vector<B: Backend>(b: &B, view: &TensorView<'_>) -> Result<B::Buffer> {
    Ok(b.upload(HostSlice::F32(&view.to_f32_vec()?))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rows x cols` matrix of `ty` from random bytes, each block's f16 scale fields
    /// (`scale_at`) set to small normal values so every product is finite.
    fn random_quant(
        ty: GgmlType,
        (block_bytes, scale_at): (usize, &[usize]),
        rows: usize,
        cols: usize,
        seed: u64,
    ) -> Linear<CpuBackend> {
        let mut s = seed;
        let row_bytes = cols / ty.block_size() as usize * block_bytes;
        let mut bytes: Vec<u8> = (0..rows * row_bytes)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 33) as u8
            })
            .collect();
        for b in bytes.chunks_exact_mut(block_bytes) {
            for &o in scale_at {
                b[o..o + 2].copy_from_slice(&0x2000u16.to_le_bytes());
            }
        }
        let w: Arc<dyn RowDot> = Arc::new(QuantWeight::from_blocks(ty, rows, cols, bytes));
        Linear::Quant(w)
    }

    fn bits(b: &CpuBackend, buf: &<CpuBackend as Backend>::Buffer) -> Vec<u32> {
        b.download(buf)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    }

    /// A layer's q, k and v (and gate and up) through the shared-input and gated forms
    /// give each product's own bits, whether the formats share their prepared input
    /// (Q4_1 / Q5_0 / Q8_0) or not (Q4_K beside Q8_0), for one token and for several.
    #[test]
    fn shared_and_gated_products_equal_each_alone() {
        const Q4_1: (usize, &[usize]) = (20, &[0, 2]);
        const Q5_0: (usize, &[usize]) = (22, &[0]);
        const Q8_0: (usize, &[usize]) = (34, &[0]);
        const Q4_K: (usize, &[usize]) = (144, &[0, 2]);
        let b = CpuBackend::with_threads(2).unwrap();
        let cols = 512;
        for (q_ty, kv_ty) in [
            ((GgmlType::Q4_1, Q4_1), (GgmlType::Q4_1, Q4_1)),
            ((GgmlType::Q5_0, Q5_0), (GgmlType::Q8_0, Q8_0)),
            ((GgmlType::Q4_K, Q4_K), (GgmlType::Q8_0, Q8_0)),
        ] {
            let q = random_quant(q_ty.0, q_ty.1, 200, cols, 1);
            let k = random_quant(kv_ty.0, kv_ty.1, 72, cols, 2);
            let v = random_quant(kv_ty.0, kv_ty.1, 72, cols, 3);
            let gate = random_quant(q_ty.0, q_ty.1, 300, cols, 4);
            let up = random_quant(q_ty.0, q_ty.1, 300, cols, 5);
            for tokens in [1, 3] {
                let xs: Vec<f32> = (0..tokens * cols)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                    .collect();
                let x = b.upload(HostSlice::F32(&xs)).unwrap();
                let out = |n: usize| b.upload(HostSlice::F32(&vec![f32::NAN; tokens * n]));
                let (mut qs, mut ks, mut vs) =
                    (out(200).unwrap(), out(72).unwrap(), out(72).unwrap());
                Linear::forward_shared(&b, &x, &mut [(&q, &mut qs), (&k, &mut ks), (&v, &mut vs)])
                    .unwrap();
                for (m, shared) in [(&q, &qs), (&k, &ks), (&v, &vs)] {
                    let mut alone = out(m.rows()).unwrap();
                    m.forward(&b, &x, &mut alone).unwrap();
                    assert_eq!(
                        bits(&b, shared),
                        bits(&b, &alone),
                        "{q_ty:?}, {tokens} tokens"
                    );
                }
                for act in [Activation::GeluTanh, Activation::Silu] {
                    let mut fused = out(300).unwrap();
                    Linear::forward_gated(&b, act, &gate, &up, &x, &mut fused).unwrap();
                    let (mut g, mut u, mut want) =
                        (out(300).unwrap(), out(300).unwrap(), out(300).unwrap());
                    gate.forward(&b, &x, &mut g).unwrap();
                    up.forward(&b, &x, &mut u).unwrap();
                    b.act_mul(act, &g, &u, &mut want).unwrap();
                    assert!(bits(&b, &want).iter().all(|w| !f32::from_bits(*w).is_nan()));
                    assert_eq!(
                        bits(&b, &fused),
                        bits(&b, &want),
                        "{q_ty:?}, {tokens} tokens"
                    );
                }
            }
        }
    }
}
