//! Launcher for `kernels/small_gemm.cu`: bf16 products of a small weight (one of its
//! dimensions at most 512: Gemma-4's per-layer-input gate and projection) over 3 to 128
//! rows, a block per 16 tokens and 16 or 64 features (eight or four warps splitting k), the
//! gate's activation and table product in the epilogue. One or two rows go to the GEMV,
//! more than 128 to cuBLAS; larger weights to the skinny GEMM or cuBLAS (on the o
//! projection this kernel was slower).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::fused::{too_big, GemvSlice};
use super::{device_err, CudaBackend};
use crate::params::Activation;
use crate::Result;

/// Rows of the kernel's token tile.
const TOKENS: usize = 16;
/// The longest short side a weight may have (its other side is not bounded here).
const SHORT_SIDE: usize = 512;
/// The largest weight, in elements (4 MB of bf16).
const MAX_ELEMENTS: usize = 1 << 21;
/// Warps a block of the 16-feature tile (long k) and of the 64-feature tile (short k); each
/// takes an equal part of k in steps of 32, so k must be a multiple of 32 x warps.
const WARPS_N16: usize = 8;
const WARPS_N64: usize = 4;

/// The row range the kernel takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SmallRows {
    pub(super) min: usize,
    pub(super) max: usize,
}

impl SmallRows {
    pub(super) const OFF: Self = Self { min: 1, max: 0 };

    /// From [`crate::CudaTuning::small_gemm_min_rows`] to 128 rows on sm_80 and later.
    pub(super) fn from_tuning(arch: u32, tuning: &crate::CudaTuning) -> Self {
        if arch < 80 {
            return Self::OFF;
        }
        Self {
            min: tuning.small_gemm_min_rows,
            max: 128,
        }
    }
}

/// The feature tile for a `[n, k]` weight, if the kernel takes it: 64 features for short k
/// (every warp's share of k in one or two steps), else 16.
pub(super) fn feature_tile(n: usize, k: usize) -> Option<usize> {
    if n * k > MAX_ELEMENTS || (n > SHORT_SIDE && k > SHORT_SIDE) {
        return None;
    }
    if k <= SHORT_SIDE && n.is_multiple_of(64) && k.is_multiple_of(32 * WARPS_N64) {
        Some(64)
    } else if n.is_multiple_of(16) && k.is_multiple_of(32 * WARPS_N16) {
        Some(16)
    } else {
        None
    }
}

/// What the kernel writes: the products, or act(product) * a table slice.
pub(super) enum SmallOut {
    Plain,
    Slice(Activation, GemvSlice),
}

impl CudaBackend {
    /// `y [t, n]` (and its bf16 copy `yb` when not 0) from `xb [t, k]` and the weight at
    /// `w`; callers check the shapes and `PathLimits::small_gemm`.
    pub(super) fn small_gemm_launch(
        &self,
        xb: &CudaSlice<u16>,
        w: u64,
        (t, k, n): (usize, usize, usize),
        y: u64,
        yb: u64,
        mode: SmallOut,
    ) -> Result<()> {
        const OP: &str = "matmul (small gemm)";
        let Some(bn) = feature_tile(n, k) else {
            return Err(crate::KernelError::Invalid {
                op: OP,
                detail: format!("a {n} x {k} weight"),
            });
        };
        let (name, act, slice) = match (&mode, bn) {
            (SmallOut::Plain, 16) => ("small_gemm_plain_n16", 0, None),
            (SmallOut::Plain, _) => ("small_gemm_plain_n64", 0, None),
            (SmallOut::Slice(a, s), 16) => {
                ("small_gemm_slice_n16", super::ops::act_code(*a), Some(*s))
            }
            (SmallOut::Slice(a, s), _) => {
                ("small_gemm_slice_n64", super::ops::act_code(*a), Some(*s))
            }
        };
        let slice = slice.unwrap_or(GemvSlice {
            table: 0,
            offset: 0,
            stride: 0,
        });
        let cfg = LaunchConfig {
            grid_dim: (
                (n / bn) as u32,
                u32::try_from(t.div_ceil(TOKENS)).map_err(|_| too_big(OP, t))?,
                1,
            ),
            block_dim: (
                32 * if bn == 16 { WARPS_N16 } else { WARPS_N64 } as u32,
                1,
                1,
            ),
            shared_mem_bytes: 0,
        };
        let (t_i, k_i, n_i) = (
            i32::try_from(t).map_err(|_| too_big(OP, t))?,
            i32::try_from(k).map_err(|_| too_big(OP, k))?,
            i32::try_from(n).map_err(|_| too_big(OP, n))?,
        );
        let mut l = self.stream.launch_builder(self.kernels.get(name)?);
        l.arg(xb)
            .arg(&w)
            .arg(&y)
            .arg(&yb)
            .arg(&t_i)
            .arg(&k_i)
            .arg(&n_i)
            .arg(&act)
            .arg(&slice);
        // SAFETY: xb holds t*k, the weight n*k and y (and yb) t*n elements (checked by the
        // callers; a slice's table reaches every row it is read at); n is a multiple of the
        // feature tile and k of 32 x the tile's warps, and every buffer starts an
        // allocation, so the 16-byte loads align.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma-4's per-layer-input products take the kernel (E2B and E4B); larger weights and
    /// shapes the tiles do not divide do not.
    #[test]
    fn small_weights_pick_their_feature_tile() {
        assert_eq!(feature_tile(256, 1536), Some(16), "E2B gate");
        assert_eq!(feature_tile(1536, 256), Some(64), "E2B projection");
        assert_eq!(feature_tile(256, 2560), Some(16), "E4B gate");
        assert_eq!(feature_tile(2560, 256), Some(64), "E4B projection");
        assert_eq!(
            feature_tile(1536, 2048),
            None,
            "o projection: no short side"
        );
        assert_eq!(feature_tile(256, 1000), None, "k not a multiple of 256");
        assert_eq!(feature_tile(256, 640), None, "long k not a multiple of 256");
        assert_eq!(
            feature_tile(1536, 384),
            Some(64),
            "short k a multiple of 128"
        );
        assert_eq!(feature_tile(200, 1536), None, "n not a multiple of 16");
        assert_eq!(feature_tile(256, 16384), None, "more than 4 MB");
    }
}
