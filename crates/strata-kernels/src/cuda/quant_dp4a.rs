//! Block-quantized products with x quantized to 8 bits (`kernels/quant_dp4a.cu`): x is
//! quantized once a product (`quant_x8`: blocks of 32 int8 codes, a scale d and s = d times
//! the codes' sum), then `quant_dot_<format>_<T>` takes integer dot products of the weight's
//! codes with x's, 8 rows a pass.
//!
//! The result is the product of the decoded weight with x quantized and dequantized, not
//! with x: the bf16 mode runs it ([`CudaBackend::with_quant_dp4a`] turns it off there), the
//! exact mode keeps the f32-decoding GEMV of `quant.rs`.

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use super::buffer::CudaBuffer;
use super::quant::BlockFormat;
use super::{device_err, CudaBackend};
use crate::Result;

/// Warps of a `quant_dot_*` block (`DOT_WARPS` in `kernels/quant_dp4a.cu`).
const DOT_WARPS: u32 = 4;

/// The entry points of `kernels/quant_dp4a.cu`: x's quantizer, then each format's GEMV
/// for tiles of 1, 2, 4 and 8 rows in [`BlockFormat::ALL`]'s order.
pub(crate) const DP4A_KERNELS: [&str; 25] = [
    "quant_x8",
    "quant_dot_q4_0_1",
    "quant_dot_q4_0_2",
    "quant_dot_q4_0_4",
    "quant_dot_q4_0_8",
    "quant_dot_q5_0_1",
    "quant_dot_q5_0_2",
    "quant_dot_q5_0_4",
    "quant_dot_q5_0_8",
    "quant_dot_q8_0_1",
    "quant_dot_q8_0_2",
    "quant_dot_q8_0_4",
    "quant_dot_q8_0_8",
    "quant_dot_q4_k_1",
    "quant_dot_q4_k_2",
    "quant_dot_q4_k_4",
    "quant_dot_q4_k_8",
    "quant_dot_q5_k_1",
    "quant_dot_q5_k_2",
    "quant_dot_q5_k_4",
    "quant_dot_q5_k_8",
    "quant_dot_q6_k_1",
    "quant_dot_q6_k_2",
    "quant_dot_q6_k_4",
    "quant_dot_q6_k_8",
];

/// `format`'s four GEMV entries (tiles of 1, 2, 4 and 8 rows).
fn dot_kernels(format: BlockFormat) -> &'static [&'static str] {
    let i = BlockFormat::ALL
        .iter()
        .position(|&f| f == format)
        .unwrap_or(0);
    &DP4A_KERNELS[1 + 4 * i..5 + 4 * i]
}

impl CudaBackend {
    /// `out [t, n] = x [t, k] * W^T` for W's blocks (`row_bytes` a row), x quantized to 8
    /// bits first; the caller has checked the shapes (x t x k f32 values, out t x n, k a
    /// multiple of 32 and of the format's block).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_quant_dp4a(
        &self,
        x: &CudaBuffer,
        format: BlockFormat,
        data: &CudaSlice<u8>,
        row_bytes: usize,
        (t, k, n): (usize, usize, usize),
        n_i: i32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "matmul_quant_dp4a";
        let blocks = t * k / 32;
        // Codes (t k bytes, a multiple of 32, so the (d, s) pairs after them are 16-byte
        // aligned for the kernels' float4 reads), then 8 bytes a block.
        // SAFETY: scratch, written in full by `quant_x8` below before the GEMV reads it.
        let x8 = unsafe { self.stream.alloc::<u8>(t * k + 8 * blocks) }
            .map_err(device_err("allocating the 8-bit x"))?;
        let (xq, _gq) = x8.device_ptr(&self.stream);
        let xds = xq + (t * k) as u64;
        {
            let xp = x.f32s(OP)?;
            let blocks64 = blocks as u64;
            let threads = 8 * blocks;
            let mut l = self.stream.launch_builder(self.kernels.get("quant_x8")?);
            l.arg(xp).arg(&blocks64).arg(&xq).arg(&xds);
            let cfg = LaunchConfig {
                grid_dim: (threads.div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: x holds `blocks` runs of 32 f32 values (16-byte aligned: a device
            // allocation); x8 holds 32 bytes and 8 bytes a block as laid out above.
            unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        }
        let (wp, _gw) = data.device_ptr(&self.stream);
        let yp = super::fused::f32_ptr_mut(self, out, OP)?;
        let (k_i, rb) = (k as i32, row_bytes as u64);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(DOT_WARPS as usize) as u32, 1, 1),
            block_dim: (DOT_WARPS * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        for t0 in (0..t).step_by(8) {
            let rows = (t - t0).min(8);
            let name = dot_kernels(format)[rows.next_power_of_two().trailing_zeros() as usize];
            let xqt = xq + (t0 * k) as u64;
            let xdst = xds + (t0 * k / 32 * 8) as u64;
            let yt = yp + (t0 * n * 4) as u64;
            let rows_i = rows as i32;
            let mut l = self.stream.launch_builder(self.kernels.get(name)?);
            l.arg(&wp)
                .arg(&rb)
                .arg(&k_i)
                .arg(&n_i)
                .arg(&xqt)
                .arg(&xdst)
                .arg(&rows_i)
                .arg(&yt);
            // SAFETY: W holds n rows of `row_bytes`; the pass reads rows t0..t0 + rows of the
            // 8-bit x (written above) and writes the same rows of out (t x n f32 values).
            // Row starts keep the kernels' alignments: k is a multiple of 32, and of 256 for
            // the K-quants whose (d, s) pairs are read two at a time.
            unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        }
        Ok(())
    }
}
