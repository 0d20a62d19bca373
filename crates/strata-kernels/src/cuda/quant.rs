//! Quantized weights on the GPU (`kernels/quant.cu`): GGUF block formats kept in device
//! memory in the file's own layout, at their 4.5 to 8.5 bits a weight, or a dense matrix
//! (bf16 / f32) for a weight uploaded that way.
//!
//! The file's layout is kept rather than a repacked one: it needs no load-time pass, the
//! host decoder (`strata-weights`) is the kernels' definition byte for byte, and every
//! format's 32-value sub-blocks are independent, which is all the kernels need.
//!
//! Products: up to [`QUANT_GEMV_MAX_ROWS`] rows (by default) of activations run as the GEMV, 8 rows a
//! pass: in the bf16 mode with x quantized to 8 bits and integer dot products
//! (`quant_dp4a.rs`), in the exact mode (or with [`CudaBackend::with_quant_dp4a`] off) as
//! `quant_gemv_<format>_<T>`, the weight decoded to f32 in registers; more rows
//! decode the weight (in slices of at most [`DEQUANT_SLICE_VALUES`] values) into a dense
//! scratch matrix that the dense matmul reads (bf16 in the bf16 mode, f32 in the exact one).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use super::buffer::{CudaBuffer, Storage};
use super::{device_err, grid_for, CudaBackend};
use crate::error::ensure;
use crate::{
    Backend, DType, DeviceBuffer, HostSlice, KernelError, MatmulShape, MatrixShape, Result,
};

/// Rows of activations up to which a block-quantized product runs as the GEMV kernel by
/// default (`STRATA_QUANT_GEMV_MAX_ROWS` moves it).
pub const QUANT_GEMV_MAX_ROWS: usize = crate::tuning::defaults::QUANT_GEMV_MAX_ROWS;

/// The most weight values decoded at once into the dense scratch of a product past the GEMV's
/// rows (64 MiB in bf16): a large output projection is decoded in slices.
pub const DEQUANT_SLICE_VALUES: usize = 32 << 20;

/// Warps of a `quant_gemv_*` block (`QUANT_GEMV_WARPS` in `kernels/quant.cu`).
const GEMV_WARPS: u32 = 4;

/// The GGUF block formats the GPU computes with directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// 32 values: f16 scale, 4-bit codes minus 8.
    Q4_0,
    /// 32 values: f16 scale, 5-bit codes minus 16.
    Q5_0,
    /// 32 values: f16 scale, 8-bit codes.
    Q8_0,
    /// 256 values: 8 sub-blocks with 6-bit scales and mins, 4-bit codes.
    Q4K,
    /// 256 values: as Q4_K with a fifth code bit.
    Q5K,
    /// 256 values: 16 groups with 8-bit scales, 6-bit codes minus 32.
    Q6K,
    /// bitsandbytes 4-bit (NF4 / FP4, [`CudaQuantMatrix::bnb4`]): a row's 68-byte head
    /// (the 16 values a code stands for, the rounding), then 32 values in 20 bytes (their
    /// block's f32 absmax, 16 bytes of codes). Not a GGUF format.
    Bnb4,
}

impl BlockFormat {
    /// Every GGUF format, in the kernels' code order ([`BlockFormat::Bnb4`] comes after).
    pub const ALL: [BlockFormat; 6] = [
        Self::Q4_0,
        Self::Q5_0,
        Self::Q8_0,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
    ];

    /// The format for ggml's type name (`"Q4_K"`), if the GPU computes with it directly.
    pub fn from_ggml_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.ggml_name().eq_ignore_ascii_case(name))
    }

    /// ggml's name of the format.
    pub fn ggml_name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q5_0 => "Q5_0",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Bnb4 => "BNB4",
        }
    }

    /// Values a block holds.
    pub fn block_values(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q5_0 | Self::Q8_0 | Self::Bnb4 => 32,
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
        }
    }

    /// Bytes a block takes.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Bnb4 => 20,
        }
    }

    /// The format's five entries in [`QUANT_KERNELS`]: the GEMV for tiles of 1, 2, 4 and 8
    /// rows, then the row decoder.
    fn kernels(self) -> &'static [&'static str] {
        let i = Self::ALL
            .iter()
            .position(|&f| f == self)
            .unwrap_or(Self::ALL.len());
        &QUANT_KERNELS[5 * i..5 * i + 5]
    }

    /// Whether the 8-bit-x integer GEMV (`quant_dp4a.cu`) has kernels for the format: the
    /// GGUF ones, whose codes are integers on a scale; bitsandbytes' are looked up.
    fn has_dp4a(self) -> bool {
        self != Self::Bnb4
    }
}

/// The entry points of `kernels/quant.cu`, for the kernel table.
pub(crate) const QUANT_KERNELS: [&str; 36] = [
    "quant_gemv_q4_0_1",
    "quant_gemv_q4_0_2",
    "quant_gemv_q4_0_4",
    "quant_gemv_q4_0_8",
    "quant_rows_q4_0",
    "quant_gemv_q5_0_1",
    "quant_gemv_q5_0_2",
    "quant_gemv_q5_0_4",
    "quant_gemv_q5_0_8",
    "quant_rows_q5_0",
    "quant_gemv_q8_0_1",
    "quant_gemv_q8_0_2",
    "quant_gemv_q8_0_4",
    "quant_gemv_q8_0_8",
    "quant_rows_q8_0",
    "quant_gemv_q4_k_1",
    "quant_gemv_q4_k_2",
    "quant_gemv_q4_k_4",
    "quant_gemv_q4_k_8",
    "quant_rows_q4_k",
    "quant_gemv_q5_k_1",
    "quant_gemv_q5_k_2",
    "quant_gemv_q5_k_4",
    "quant_gemv_q5_k_8",
    "quant_rows_q5_k",
    "quant_gemv_q6_k_1",
    "quant_gemv_q6_k_2",
    "quant_gemv_q6_k_4",
    "quant_gemv_q6_k_8",
    "quant_rows_q6_k",
    "quant_gemv_bnb4_1",
    "quant_gemv_bnb4_2",
    "quant_gemv_bnb4_4",
    "quant_gemv_bnb4_8",
    "quant_rows_bnb4",
    "quant_scatter_cols",
];

/// A bitsandbytes 4-bit matrix as [`CudaQuantMatrix::bnb4`] takes it (the parts of
/// `strata_weights::bnb::Bnb4`).
#[derive(Clone, Copy, Debug)]
pub struct Bnb4Parts<'a> {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Values a block (one absmax each).
    pub blocksize: usize,
    /// The codes, two a byte, value `2i` in the high nibble.
    pub codes: &'a [u8],
    /// One absmax a block.
    pub absmax: &'a [f32],
    /// The 16 values a code stands for.
    pub quant_map: &'a [f32; 16],
    /// What each value `map[code] * absmax` is rounded to (bitsandbytes' state dtype).
    pub round_to: DType,
}

/// How a quantized weight lives on the device.
enum QuantStore {
    /// Dequantized on upload (a dense bf16 or f32 matrix).
    Dense(CudaBuffer),
    /// The file's blocks, `row_bytes` a row.
    Blocks {
        format: BlockFormat,
        data: CudaSlice<u8>,
        row_bytes: usize,
    },
}

/// A quantized weight as CUDA computes with it, `[rows, cols]` (rows = output features):
/// its GGUF blocks ([`CudaQuantMatrix::blocks`]) or a dense matrix
/// ([`CudaQuantMatrix::upload`], [`CudaQuantMatrix::from_f32`]).
pub struct CudaQuantMatrix {
    store: QuantStore,
    rows: usize,
    cols: usize,
}

impl CudaQuantMatrix {
    /// Uploads a dense `[rows, cols]` host matrix of any dtype.
    pub fn upload(b: &CudaBackend, rows: usize, cols: usize, data: HostSlice<'_>) -> Result<Self> {
        ensure(data.len() == rows * cols, "CudaQuantMatrix", || {
            format!("{} values for {rows} x {cols}", data.len())
        })?;
        Ok(Self {
            store: QuantStore::Dense(b.upload(data)?),
            rows,
            cols,
        })
    }

    /// Uploads f32 host values rounded to `dtype`, as a dense matrix.
    pub fn from_f32(
        b: &CudaBackend,
        rows: usize,
        cols: usize,
        data: &[f32],
        dtype: DType,
    ) -> Result<Self> {
        ensure(data.len() == rows * cols, "CudaQuantMatrix", || {
            format!("{} values for {rows} x {cols}", data.len())
        })?;
        Ok(Self {
            store: QuantStore::Dense(b.upload_f32_as(data, dtype)?),
            rows,
            cols,
        })
    }

    /// Uploads `rows` rows of `cols` values in `format`'s blocks, as the GGUF file stores
    /// them (`bytes` holds exactly the rows' blocks).
    pub fn blocks(
        b: &CudaBackend,
        format: BlockFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self> {
        const OP: &str = "CudaQuantMatrix::blocks";
        ensure(cols.is_multiple_of(format.block_values()), OP, || {
            format!(
                "rows of {cols} values are not whole {} blocks",
                format.ggml_name()
            )
        })?;
        ensure(i32::try_from(cols).is_ok(), OP, || {
            format!("{cols} columns")
        })?;
        let row_bytes = cols / format.block_values() * format.block_bytes();
        ensure(bytes.len() == rows * row_bytes, OP, || {
            format!(
                "{} bytes for {rows} rows of {row_bytes} ({})",
                bytes.len(),
                format.ggml_name()
            )
        })?;
        Ok(Self {
            store: QuantStore::Blocks {
                format,
                data: b.to_device(bytes)?,
                row_bytes,
            },
            rows,
            cols,
        })
    }

    /// A bitsandbytes 4-bit matrix kept 4-bit ([`BlockFormat::Bnb4`]): the same values as
    /// its host decoder (`Bnb4::decode`, bit for bit), at 20 bytes a 32 values plus 68 a
    /// row (0.63 bytes a weight for 1,536 columns). Needs whole 32-value sub-blocks in
    /// every block and row (`cols` and the block size multiples of 32).
    pub fn bnb4(b: &CudaBackend, w: Bnb4Parts<'_>) -> Result<Self> {
        const OP: &str = "CudaQuantMatrix::bnb4";
        let (rows, cols, bs) = (w.rows, w.cols, w.blocksize);
        ensure(cols.is_multiple_of(32) && bs.is_multiple_of(32), OP, || {
            format!("rows of {cols} values in blocks of {bs} are not whole 32-value runs")
        })?;
        ensure(i32::try_from(cols).is_ok(), OP, || {
            format!("{cols} columns")
        })?;
        let n = rows * cols;
        ensure(
            w.codes.len() == n / 2 && w.absmax.len() == n.div_ceil(bs),
            OP,
            || {
                format!(
                    "{} code bytes and {} absmax values for {rows} x {cols} in blocks of {bs}",
                    w.codes.len(),
                    w.absmax.len()
                )
            },
        )?;
        let rounding: u32 = match w.round_to {
            DType::F32 => 0,
            DType::BF16 => 1,
            DType::F16 => 2,
        };
        let subs = cols / 32;
        let row_bytes = 68 + 20 * subs;
        let mut head = Vec::with_capacity(68);
        for v in w.quant_map {
            head.extend_from_slice(&v.to_le_bytes());
        }
        head.extend_from_slice(&rounding.to_le_bytes());
        let (codes, absmax) = (w.codes, w.absmax);
        let mut bytes = Vec::with_capacity(rows * row_bytes);
        for r in 0..rows {
            bytes.extend_from_slice(&head);
            for s in 0..subs {
                let first = r * cols + 32 * s;
                bytes.extend_from_slice(&absmax[first / bs].to_le_bytes());
                bytes.extend_from_slice(&codes[first / 2..first / 2 + 16]);
            }
        }
        Ok(Self {
            store: QuantStore::Blocks {
                format: BlockFormat::Bnb4,
                data: b.to_device(&bytes)?,
                row_bytes,
            },
            rows,
            cols,
        })
    }

    /// The block format the device holds, or `None` for a dense matrix.
    pub fn format(&self) -> Option<BlockFormat> {
        match &self.store {
            QuantStore::Dense(_) => None,
            QuantStore::Blocks { format, .. } => Some(*format),
        }
    }

    /// Bytes of device memory the weight takes.
    pub fn device_bytes(&self) -> usize {
        match &self.store {
            QuantStore::Dense(w) => w.len() * w.dtype().size_bytes(),
            QuantStore::Blocks { row_bytes, .. } => row_bytes * self.rows,
        }
    }

    /// The matrix in an `Arc`, to be shared without copying the device memory.
    pub fn into_arc(self) -> Arc<Self> {
        Arc::new(self)
    }
}

impl MatrixShape for CudaQuantMatrix {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

impl CudaBackend {
    /// `out [t, rows] = x [t, cols] * W^T` for a quantized weight.
    pub(super) fn matmul_quant_impl(
        &self,
        x: &CudaBuffer,
        w: &CudaQuantMatrix,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "matmul_quant";
        let shape = MatmulShape {
            in_features: w.cols,
            out_features: w.rows,
        };
        let (format, data, row_bytes) = match &w.store {
            QuantStore::Dense(d) => return self.matmul_impl(x, d, shape, out),
            QuantStore::Blocks {
                format,
                data,
                row_bytes,
            } => (*format, data, *row_bytes),
        };
        let (k, n) = (w.cols, w.rows);
        let t = super::matmul::product_rows(OP, x, k, out, n)?;
        if t == 0 || n == 0 {
            return Ok(());
        }
        if t > self.quant_gemv_max_rows {
            return self.matmul_decoded(x, w, format, data, row_bytes, t, out);
        }
        let n_i = as_i32(OP, n)?;
        if self.bf16_gemm && self.quant_dp4a && format.has_dp4a() {
            return self.matmul_quant_dp4a(x, format, data, row_bytes, (t, k, n), n_i, out);
        }
        let (wp, _gw) = data.device_ptr(&self.stream);
        let (xp, _gx) = x.f32s(OP)?.device_ptr(&self.stream);
        let yp = super::fused::f32_ptr_mut(self, out, OP)?;
        let k_i = k as i32;
        let rb = row_bytes as u64;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(GEMV_WARPS as usize) as u32, 1, 1),
            block_dim: (GEMV_WARPS * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        for t0 in (0..t).step_by(8) {
            let rows = (t - t0).min(8);
            // The tile of 1, 2, 4 or 8 rows that covers `rows`.
            let name = format.kernels()[rows.next_power_of_two().trailing_zeros() as usize];
            let (xt, yt) = (xp + (t0 * k * 4) as u64, yp + (t0 * n * 4) as u64);
            let rows_i = rows as i32;
            let mut l = self.stream.launch_builder(self.kernels.get(name)?);
            l.arg(&wp)
                .arg(&rb)
                .arg(&k_i)
                .arg(&n_i)
                .arg(&xt)
                .arg(&rows_i)
                .arg(&yt);
            // SAFETY: W holds n rows of `row_bytes` (checked at upload), x holds t rows of k
            // f32 values and out t rows of n (checked above); the pass reads rows t0..t0 +
            // rows of x and writes the same rows of out. k is a multiple of 32, so each row
            // of x starts 16-byte aligned for the kernel's float4 loads.
            unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        }
        Ok(())
    }

    /// A product past the GEMV's rows: W decoded slice by slice into a dense scratch that
    /// the dense matmul reads.
    #[allow(clippy::too_many_arguments)]
    fn matmul_decoded(
        &self,
        x: &CudaBuffer,
        w: &CudaQuantMatrix,
        format: BlockFormat,
        data: &CudaSlice<u8>,
        row_bytes: usize,
        t: usize,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        let (k, n) = (w.cols, w.rows);
        let dtype = if self.bf16_gemm {
            DType::BF16
        } else {
            DType::F32
        };
        let slice_rows = (DEQUANT_SLICE_VALUES / k).clamp(1, n);
        let mut dense = self.scratch_impl(slice_rows * k, dtype)?;
        let mut part = if slice_rows < n {
            Some(self.scratch_impl(t * slice_rows, DType::F32)?)
        } else {
            None
        };
        for first in (0..n).step_by(slice_rows) {
            let rows = slice_rows.min(n - first);
            dense.set_len(rows * k)?;
            self.decode_rows(
                format, data, row_bytes, k, None, first, rows, 1.0, &mut dense,
            )?;
            let shape = MatmulShape {
                in_features: k,
                out_features: rows,
            };
            match part.as_mut() {
                None => self.matmul_impl(x, &dense, shape, out)?,
                Some(p) => {
                    p.set_len(t * rows)?;
                    self.matmul_impl(x, &dense, shape, p)?;
                    self.scatter_cols(p, t, rows, out, n, first)?;
                }
            }
        }
        Ok(())
    }

    /// `out[t, first + j] = part[t, j]`.
    fn scatter_cols(
        &self,
        part: &CudaBuffer,
        t: usize,
        cols: usize,
        out: &mut CudaBuffer,
        out_cols: usize,
        first: usize,
    ) -> Result<()> {
        const OP: &str = "quant_scatter_cols";
        let (t64, c64, oc64, f64_) = (t as u64, cols as u64, out_cols as u64, first as u64);
        let src = part.f32s(OP)?;
        let dst = out.f32s_mut(OP)?;
        let mut l = self.stream.launch_builder(self.kernels.get(OP)?);
        l.arg(src)
            .arg(&t64)
            .arg(&c64)
            .arg(dst)
            .arg(&oc64)
            .arg(&f64_);
        // SAFETY: part holds t x cols values, out t x out_cols with first + cols <= out_cols
        // (the caller's slice of the weight's rows).
        unsafe { l.launch(grid_for(t * cols)) }.map_err(device_err(OP))?;
        Ok(())
    }

    /// Decodes `rows` rows of a block matrix (`ids[i]`, or `first + i`) times `scale` into
    /// `out` (f32 or bf16), `k` values a row.
    #[allow(clippy::too_many_arguments)]
    fn decode_rows(
        &self,
        format: BlockFormat,
        data: &CudaSlice<u8>,
        row_bytes: usize,
        k: usize,
        ids: Option<&CudaSlice<u32>>,
        first: usize,
        rows: usize,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "quant_rows";
        ensure(out.len() == rows * k, OP, || {
            format!("out has {}, want {rows} x {k}", out.len())
        })?;
        if rows == 0 {
            return Ok(());
        }
        let out_bf16: i32 = match out.dtype() {
            DType::F32 => 0,
            DType::BF16 => 1,
            other => {
                return Err(KernelError::Invalid {
                    op: OP,
                    detail: format!("decoding into {other:?}"),
                })
            }
        };
        let name = format.kernels()[4];
        let (k_i, rb, first64, stride) = (k as i32, row_bytes as u64, first as u64, k as u64);
        // Through `storage_mut`, which marks any bf16 twin of `out` stale.
        let op = match out.storage_mut() {
            Storage::F32(s) => s.device_ptr(&self.stream).0,
            Storage::Bits16(s) => s.device_ptr(&self.stream).0,
        };
        let idp = ids.map_or(0u64, |s| s.device_ptr(&self.stream).0);
        let mut l = self.stream.launch_builder(self.kernels.get(name)?);
        l.arg(data)
            .arg(&rb)
            .arg(&k_i)
            .arg(&idp)
            .arg(&first64)
            .arg(&scale)
            .arg(&op)
            .arg(&out_bf16)
            .arg(&stride);
        let subs = (k / 32) as u32;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, subs.div_ceil(128), 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every source row (first + i, or ids[i], below the weight's rows: checked
        // by the callers) holds row_bytes bytes; out holds rows x k values of its dtype.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }

    /// `out[i] = W[ids[i]] * scale` for device ids (each below the weight's rows).
    pub(super) fn embedding_quant_dev(
        &self,
        n: usize,
        ids: &CudaSlice<u32>,
        table: &CudaQuantMatrix,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        match &table.store {
            QuantStore::Dense(d) => self.embedding_dev(n, ids, d, table.cols, scale, out),
            QuantStore::Blocks {
                format,
                data,
                row_bytes,
            } => {
                ensure(out.dtype() == DType::F32, "embedding", || {
                    format!("an embedding into {:?}", out.dtype())
                })?;
                self.decode_rows(
                    *format,
                    data,
                    *row_bytes,
                    table.cols,
                    Some(ids),
                    0,
                    n,
                    scale,
                    out,
                )
            }
        }
    }

    /// As [`Self::embedding_quant_dev`] for host ids, checked against the table's rows.
    pub(super) fn embedding_quant_host(
        &self,
        ids: &[u32],
        table: &CudaQuantMatrix,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        if let QuantStore::Dense(d) = &table.store {
            return self.embedding_impl(ids, d, table.cols, scale, out);
        }
        super::ops::check_ids("embedding", ids, table.rows)?;
        let dev = self.to_device(ids)?;
        self.embedding_quant_dev(ids.len(), &dev, table, scale, out)
    }
}

fn as_i32(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Invalid {
        op,
        detail: format!("dimension {v} past 32 bits"),
    })
}
