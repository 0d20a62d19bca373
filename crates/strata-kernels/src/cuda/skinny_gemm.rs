//! Launcher for `kernels/skinny_gemm.cu`: bf16 products over 3 to 32 rows of x on tensor
//! cores (sm_90), one launch for a layer's q / k / v and the MLP's gate and up with their
//! activation, split-K partial sums added inside the launch by thread-block clusters. Past
//! 32 rows cuBLAS is faster (the kernel file says why).

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::fused::{too_big, GemvOut, GemvSlice};
use super::module::Kernels;
use super::sources::SKINNY_KERNELS;
use super::{device_err, CudaBackend};
use crate::error::ensure;
use crate::{DType, Result};

/// Rows of x the token tile holds (`SG_BT`).
pub(super) const SKINNY_MAX_ROWS: usize = 32;
/// Weight rows a tile (`SG_BN`; a gated tile is half gate, half up).
const TILE_ROWS: usize = 128;
/// k a pipeline stage (`SG_BK`): k must be a multiple.
const STAGE_K: usize = 64;
const STAGES: usize = 4;
const THREADS: u32 = 256;
/// Dynamic shared memory: `SG_STAGES` stages of a weight tile and a token tile (bf16).
const SMEM_BYTES: usize = STAGES * (TILE_ROWS + SKINNY_MAX_ROWS) * STAGE_K * 2;
/// Cluster sizes there are entry points for (`SKINNY_GEMM_KERNELS` in the kernel file).
const CLUSTERS: [usize; 4] = [1, 2, 4, 8];
/// Blocks resident on a multiprocessor (`__launch_bounds__(SG_THREADS, 2)`).
const BLOCKS_PER_SM: usize = 2;

// Two blocks fit a multiprocessor's 228 KB, and a split's partial tiles (four float4 a
// thread) fit the stages' memory they reuse.
const _: () = assert!(BLOCKS_PER_SM * SMEM_BYTES <= 228 * 1024);
const _: () = assert!(4 * 16 * THREADS as usize <= SMEM_BYTES);

/// Weights one launch takes (`SG_MAX_MATS`).
pub(super) const SKINNY_MAX_MATS: usize = 3;

/// `SkinnyMats` in the kernel file, same layout.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SkinnyMats {
    w: [u64; SKINNY_MAX_MATS],
    y: [u64; SKINNY_MAX_MATS],
    yb: [u64; SKINNY_MAX_MATS],
    n: [i32; SKINNY_MAX_MATS],
    tile_end: [i32; SKINNY_MAX_MATS],
}

// SAFETY: plain integers in the kernel parameter's C layout.
unsafe impl cudarc::driver::DeviceRepr for SkinnyMats {}

/// One weight of a launch: its address and features, the f32 output and its optional bf16
/// copy (0: none).
#[derive(Clone, Copy)]
pub(super) struct SkinnyMat {
    pub(super) w: u64,
    pub(super) n: usize,
    pub(super) y: u64,
    pub(super) yb: u64,
}

/// Whether the device runs the kernel: sm_90 or later (clusters), its entry points loaded
/// and granted their shared memory; `STRATA_SKINNY_GEMM=0` turns it off.
pub(super) fn probe(arch: u32, kernels: &Kernels) -> bool {
    if arch < 90 || std::env::var("STRATA_SKINNY_GEMM").is_ok_and(|v| v == "0") {
        return false;
    }
    SKINNY_KERNELS.iter().all(|&name| {
        kernels.get(name).is_ok_and(|f| {
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                SMEM_BYTES as i32,
            )
            .is_ok()
        })
    })
}

/// The cluster (k split) for `tiles` tiles over `stages` stages of k: the largest that keeps
/// the grid within one wave of resident blocks and gives every block a stage.
fn cluster_size(tiles: usize, stages: usize, sm_count: usize) -> usize {
    let wave = BLOCKS_PER_SM * sm_count;
    CLUSTERS
        .into_iter()
        .filter(|&c| c == 1 || (c <= stages && tiles * c <= wave))
        .max()
        .unwrap_or(1)
}

impl CudaBackend {
    /// Whether a bf16 product over `t` rows of `k` takes the kernel.
    pub(super) fn skinny_applies(&self, dtype: DType, t: usize, k: usize) -> bool {
        self.skinny_gemm
            && self.bf16_gemm
            && dtype == DType::BF16
            && t > self.gemv_max_rows
            && t <= SKINNY_MAX_ROWS
            && k >= STAGE_K
            && k.is_multiple_of(STAGE_K)
    }

    /// One launch over `mats` (1 to 3 bf16 weights `[n_i, k]` sharing `xb [t, k]`), or,
    /// gated, over an MLP's gate and up (`mats[0]`, `mats[1]`, one shape) writing
    /// `act(gate) * up` to `mats[0]`'s outputs, or, sliced, over one weight. Callers check
    /// the shapes, the slice's reach and `skinny_applies`.
    pub(super) fn skinny_launch(
        &self,
        xb: &CudaSlice<u16>,
        t: usize,
        k: usize,
        mats: &[SkinnyMat],
        mode: GemvOut,
    ) -> Result<()> {
        const OP: &str = "matmul (skinny gemm)";
        let (family, wants) = match mode {
            GemvOut::Plain => (0, None),
            GemvOut::Gated(_) => (1, Some(2)),
            GemvOut::Slice(..) => (2, Some(1)),
        };
        ensure(
            !mats.is_empty()
                && mats.len() <= SKINNY_MAX_MATS
                && wants.is_none_or(|w| mats.len() == w)
                && t <= SKINNY_MAX_ROWS
                && k.is_multiple_of(STAGE_K),
            OP,
            || format!("{} weights, {t} rows of {k}", mats.len()),
        )?;
        let gated = family == 1;
        let per_tile = if gated { TILE_ROWS / 2 } else { TILE_ROWS };
        let mut p = SkinnyMats::default();
        let mut tiles = 0usize;
        for slot in 0..SKINNY_MAX_MATS {
            let m = mats[slot.min(mats.len() - 1)];
            // A gated launch's tiles are the gate's features; the up rows ride along.
            if slot < mats.len() && (!gated || slot == 0) {
                tiles += m.n.div_ceil(per_tile);
            }
            p.w[slot] = m.w;
            p.y[slot] = m.y;
            p.yb[slot] = m.yb;
            p.n[slot] = i32::try_from(m.n).map_err(|_| too_big(OP, m.n))?;
            p.tile_end[slot] = i32::try_from(tiles).map_err(|_| too_big(OP, tiles))?;
        }
        if tiles == 0 || t == 0 {
            return Ok(());
        }
        let cluster = cluster_size(tiles, k / STAGE_K, self.sm_count);
        let name = SKINNY_KERNELS[CLUSTERS.len() * family + cluster.trailing_zeros() as usize];
        let f = self.kernels.get(name)?;
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(tiles).map_err(|_| too_big(OP, tiles))?,
                cluster as u32,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: SMEM_BYTES as u32,
        };
        let (t_i, k_i) = (t as i32, i32::try_from(k).map_err(|_| too_big(OP, k))?);
        let mut l = self.stream.launch_builder(f);
        l.arg(xb).arg(&t_i).arg(&k_i).arg(&p);
        let act;
        let slice: GemvSlice;
        match mode {
            GemvOut::Plain => {}
            GemvOut::Gated(a) => {
                act = super::ops::act_code(a);
                l.arg(&act);
            }
            GemvOut::Slice(a, s) => {
                act = super::ops::act_code(a);
                slice = s;
                l.arg(&act).arg(&slice);
            }
        }
        // SAFETY: xb holds t*k, each W n_i*k and each output (and copy) t*n_i elements
        // (checked by the callers; a slice's table reaches every row it is read at); k is
        // a multiple of 64 and every buffer starts an allocation, so the 16-byte copies
        // align; the grid's y is the kernel's compiled cluster size.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E2B's products at 132 multiprocessors: one wave of blocks at most, the k split only
    /// where tiles are few, never more splits than stages.
    #[test]
    fn cluster_fills_one_wave_without_empty_splits() {
        // (tiles, stages): q/k/v, o, gate/up, down, per-layer gate, per-layer projection,
        // output projection.
        let cases = [
            ((20, 24), 8),
            ((12, 32), 8),
            ((96, 24), 2),
            ((12, 96), 8),
            ((2, 24), 8),
            ((12, 4), 4),
            ((2048, 24), 1),
            ((300, 1), 1),
            ((1, 3), 2),
        ];
        for ((tiles, stages), want) in cases {
            assert_eq!(cluster_size(tiles, stages, 132), want, "{tiles} x {stages}");
        }
    }

    /// The launcher's index into `SKINNY_KERNELS` names the entry point of that mode and
    /// cluster.
    #[test]
    fn kernel_index_names_mode_and_cluster() {
        for (family, mode) in ["plain", "gated", "slice"].into_iter().enumerate() {
            for c in CLUSTERS {
                let index = CLUSTERS.len() * family + c.trailing_zeros() as usize;
                assert_eq!(SKINNY_KERNELS[index], format!("skinny_gemm_{mode}_c{c}"));
            }
        }
    }
}
