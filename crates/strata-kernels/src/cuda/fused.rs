//! Launchers for the fused decode kernels: the bf16 GEMV (`kernels/gemv.cu`), the per-head
//! norm + RoPE and the gated slice product. Each replaces a chain of the small kernels in
//! `ops.rs` whose launches, not their bytes, dominated a decode step.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::buffer::{dtype_code, CudaBuffer, Storage};
use super::sources::GEMV_KERNELS;
use super::{device_err, grid_for, CudaBackend};
use crate::error::ensure;
use crate::{
    Activation, DType, DeviceBuffer, KernelError, Result, RmsNormParams, RopeParams, RopeStyle,
    TableSlice,
};

/// Rows of x up to which a bf16 matmul runs as a GEMV (one kernel per row count).
pub(super) const GEMV_MAX_ROWS: usize = GEMV_KERNELS.len();

/// The default row limit of the GEMV path (measured on an H200: `docs/perf-notes.md`).
pub(super) const GEMV_DEFAULT_MAX_ROWS: usize = 2;

/// Output features each warp of `gemv_bf16_<t>` computes (`GEMV_ENTRY` in `gemv.cu`).
const GEMV_FEATURES_PER_WARP: [u32; GEMV_MAX_ROWS] = [1, 1, 2, 2, 4, 4, 4, 4];

/// Warps per GEMV block (`GEMV_BLOCK_WARPS` in `gemv.cu`).
const GEMV_WARPS: u32 = 8;

/// Warps that share each output feature group: enough that the grid holds about 4096
/// warps (31 per multiprocessor on an H200), while every warp keeps at least 32 chunks of
/// 8 inputs (one per lane) and the split divides the block.
fn gemv_split(features: usize, groups_of: usize, k: usize) -> u32 {
    let groups = features.div_ceil(groups_of).max(1);
    let mut split = 1usize;
    while split < GEMV_WARPS as usize && groups * split < 4096 && k / 8 / (split * 2) >= 32 {
        split *= 2;
    }
    split as u32
}

/// Whether `matmul` takes the GEMV path for `t` rows of `k` against a weight of `dtype`,
/// given the backend's row limit (`STRATA_GEMV_MAX_ROWS`, at most 8; 0 turns it off).
pub(super) fn gemv_applies(dtype: DType, t: usize, k: usize, max_rows: usize) -> bool {
    dtype == DType::BF16 && t >= 1 && t <= max_rows.min(GEMV_MAX_ROWS) && k.is_multiple_of(8)
}

/// The GEMV row limit: `STRATA_GEMV_MAX_ROWS` if set and valid, else `default`.
pub(super) fn gemv_max_rows_from_env(default: usize) -> usize {
    std::env::var("STRATA_GEMV_MAX_ROWS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(default, |v| v.min(GEMV_MAX_ROWS))
}

impl CudaBackend {
    /// `out [t, n] = x [t, k] * W^T` for a bf16 `W [n, k]`, `t <= 8`, `k % 8 == 0`
    /// (shapes checked by `matmul_impl`).
    pub(super) fn gemv_bf16(
        &self,
        xs: &CudaSlice<f32>,
        w: &CudaBuffer,
        t: usize,
        k: usize,
        n: usize,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "matmul (gemv)";
        let Storage::Bits16(ws) = &w.storage else {
            unreachable!("a BF16 buffer holds 16-bit storage")
        };
        let os = out.f32s_mut(OP)?;
        let (k_i, n_i) = (
            i32::try_from(k).map_err(|_| too_big(OP, k))?,
            i32::try_from(n).map_err(|_| too_big(OP, n))?,
        );
        let per_warp = GEMV_FEATURES_PER_WARP[t - 1];
        let split = gemv_split(n, per_warp as usize, k);
        let split_i = split as i32;
        let mut l = self
            .stream
            .launch_builder(self.kernels.get(GEMV_KERNELS[t - 1])?);
        l.arg(xs).arg(ws).arg(os).arg(&k_i).arg(&n_i).arg(&split_i);
        let features_per_block = (GEMV_WARPS / split) * per_warp;
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(features_per_block), 1, 1),
            block_dim: (32 * GEMV_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x holds t*k, W n*k and out t*n elements (checked by the caller); k is a
        // multiple of 8 and every buffer starts an allocation, so the 16-byte loads align.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn head_norm_rope_dev(
        &self,
        x: &mut CudaBuffer,
        weight: Option<&CudaBuffer>,
        norm: RmsNormParams,
        n_tokens: usize,
        pos: &CudaSlice<u32>,
        inv_freq: &CudaBuffer,
        rope: RopeParams,
    ) -> Result<()> {
        const OP: &str = "head_norm_rope";
        let d = rope.head_dim;
        ensure(
            norm.dim == d && d > 0 && x.len() == n_tokens * rope.n_heads * d,
            OP,
            || {
                format!(
                    "x has {}, want {n_tokens} tokens x {} heads x {d} (norm dim {})",
                    x.len(),
                    rope.n_heads,
                    norm.dim
                )
            },
        )?;
        ensure(inv_freq.len() == d / 2, OP, || {
            format!("{} frequencies for head_dim {d}", inv_freq.len())
        })?;
        if let Some(w) = weight {
            ensure(w.len() == d, OP, || {
                format!("weight has {} elements, head_dim is {d}", w.len())
            })?;
        }
        let rows = n_tokens * rope.n_heads;
        if rows == 0 {
            return Ok(());
        }
        let freqs = inv_freq.f32s(OP)?;
        let xs = x.f32s_mut(OP)?;
        let w_dtype = weight.map_or(-1, |w| dtype_code(w.dtype));
        let (rows_i, heads, d_i) = (rows as i32, rope.n_heads as i32, d as i32);
        let interleaved = i32::from(rope.style == RopeStyle::Interleaved);
        let f = self.kernels.get("head_norm_rope")?;
        let mut l = self.stream.launch_builder(f);
        l.arg(xs).arg(pos).arg(freqs);
        match weight {
            Some(w) => match &w.storage {
                Storage::F32(s) => l.arg(s),
                Storage::Bits16(s) => l.arg(s),
            },
            // Never dereferenced with w_dtype < 0.
            None => l.arg(freqs),
        };
        l.arg(&w_dtype)
            .arg(&norm.weight_offset)
            .arg(&norm.eps)
            .arg(&rows_i)
            .arg(&heads)
            .arg(&d_i)
            .arg(&interleaved);
        const WARPS: u32 = 8;
        let cfg = LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(WARPS), 1, 1),
            block_dim: (32 * WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x holds rows x head_dim, positions n_tokens, inv_freq head_dim / 2 and
        // the weight head_dim elements (checked above and by the caller).
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }

    pub(super) fn act_mul_slice_impl(
        &self,
        act: Activation,
        gate: &CudaBuffer,
        table: &CudaBuffer,
        s: TableSlice,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "act_mul_slice";
        let n = gate.len();
        ensure(
            out.len() == n && s.cols > 0 && n.is_multiple_of(s.cols),
            OP,
            || {
                format!(
                    "gate of {n}, out of {}, slice of {} columns",
                    out.len(),
                    s.cols
                )
            },
        )?;
        let rows = n / s.cols;
        let needed = if rows == 0 {
            0
        } else {
            (rows - 1) * s.stride + s.offset + s.cols
        };
        ensure(
            s.offset + s.cols <= s.stride && needed <= table.len(),
            OP,
            || {
                format!(
                    "slice {}..{} of rows of {} beyond a table of {}",
                    s.offset,
                    s.offset + s.cols,
                    s.stride,
                    table.len()
                )
            },
        )?;
        if n == 0 {
            return Ok(());
        }
        let (g, tb, o) = (gate.f32s(OP)?, table.f32s(OP)?, out.f32s_mut(OP)?);
        let (n64, cols, offset, stride) =
            (n as u64, s.cols as u64, s.offset as u64, s.stride as u64);
        let code = match act {
            Activation::GeluTanh => 0i32,
            Activation::Silu => 1,
        };
        let mut l = self
            .stream
            .launch_builder(self.kernels.get("act_mul_slice")?);
        l.arg(g)
            .arg(tb)
            .arg(o)
            .arg(&n64)
            .arg(&cols)
            .arg(&offset)
            .arg(&stride)
            .arg(&code);
        // SAFETY: lengths and the slice's reach into the table checked above.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(OP))?;
        Ok(())
    }
}

fn too_big(op: &'static str, v: usize) -> KernelError {
    KernelError::Invalid {
        op,
        detail: format!("dimension {v} exceeds 32 bits"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split fills the grid for few long rows, stays 1 for many rows, divides the
    /// block, and never leaves a lane without a chunk of k.
    #[test]
    fn gemv_split_fills_the_grid_without_starving_lanes() {
        // (features, k) of E2B's matrices: output projection, q, k/v, o, MLP, PLE proj.
        let cases = [
            ((262144, 1536), 1),
            ((2048, 1536), 2),
            ((256, 1536), 4),
            ((1536, 2048), 4),
            ((1536, 12288), 4),
            ((6144, 1536), 1),
            ((1536, 256), 1),
        ];
        for ((n, k), want) in cases {
            assert_eq!(gemv_split(n, 1, k), want, "{n} x {k}");
        }
        for n in [1, 7, 100, 1000, 5000] {
            for k in [8, 64, 256, 512, 4096, 16384] {
                let s = gemv_split(n, 1, k) as usize;
                assert!(
                    (GEMV_WARPS as usize).is_multiple_of(s),
                    "{n} x {k}: split {s}"
                );
                assert!(
                    s == 1 || k / 8 / s >= 32,
                    "{n} x {k}: split {s} starves lanes"
                );
            }
        }
    }

    #[test]
    fn gemv_applies_to_bf16_rows_within_the_limit() {
        assert!(gemv_applies(DType::BF16, 1, 1536, 2));
        assert!(gemv_applies(DType::BF16, 2, 1536, 2));
        assert!(!gemv_applies(DType::BF16, 3, 1536, 2));
        assert!(gemv_applies(DType::BF16, 8, 1536, 8));
        assert!(!gemv_applies(DType::BF16, 9, 1536, 9));
        assert!(!gemv_applies(DType::BF16, 1, 1537, 2));
        assert!(!gemv_applies(DType::F32, 1, 1536, 2));
        assert!(!gemv_applies(DType::BF16, 1, 1536, 0));
    }
}
