//! Launcher for `kernels/skinny_gemm.cu`: bf16 products over 3 to 128 rows of x on tensor
//! cores (sm_90), one launch for a layer's q / k / v and the MLP's gate and up with their
//! activation, split-K partial sums added inside the launch by thread-block clusters. Up to
//! 32 rows the tile is 32 tokens of mma.sync; past that 64 or 128 tokens of wgmma, on
//! sm_90 only (Hopper's arch-specific instruction). Past 128 rows cuBLAS takes the product.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::fused::{too_big, GemvOut, GemvSlice};
use super::module::Kernels;
use super::sources::SKINNY_KERNELS;
use super::{device_err, CudaBackend};
use crate::error::ensure;
use crate::Result;

/// Weight rows a tile (`SG_BN`; a gated tile is half gate, half up).
const TILE_ROWS: usize = 128;
/// k a pipeline stage (`SG_BK`): k must be a multiple.
pub(super) const STAGE_K: usize = 64;
const THREADS: u32 = 256;
/// Cluster sizes there are entry points for (`SG_KERNELS` in the kernel file).
const CLUSTERS: [usize; 4] = [1, 2, 4, 8];

/// A token tile of the kernel file: its tokens, pipeline stages, the blocks resident on a
/// multiprocessor (`__launch_bounds__`) and whether it needs sm_90 exactly (wgmma).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tile {
    tokens: usize,
    stages: usize,
    blocks_per_sm: usize,
    wgmma: bool,
}

/// `SG_BT` / `SG_STAGES` and `WG_STAGES` / `WG_BLOCKS` in the kernel file, in entry-point
/// order.
const TILES: [Tile; 3] = [
    Tile {
        tokens: 32,
        stages: 4,
        blocks_per_sm: 2,
        wgmma: false,
    },
    Tile {
        tokens: 64,
        stages: 4,
        blocks_per_sm: 2,
        wgmma: true,
    },
    Tile {
        tokens: 128,
        stages: 3,
        blocks_per_sm: 2,
        wgmma: true,
    },
];

// The default row limit is the most rows any tile takes.
const _: () =
    assert!(crate::tuning::defaults::SKINNY_GEMM_MAX_ROWS == TILES[TILES.len() - 1].tokens);

/// The most rows a launch of one weight takes the kernel for. Past 64 rows cuBLAS is
/// faster on a single product (the 128-token tile's split-K blocks are short: an H200 step at
/// 128 rows took a layer's o projection in 9.0 us against cuBLAS's 7.6, the per-layer-input
/// projection in 6.7 against 4.2), while a fused launch still wins (q / k / v 11.3 against
/// 19.0 us in three launches; gate and up with the activation 18.9 against 22.0).
pub(super) const SINGLE_MAX_ROWS: usize = 64;

impl Tile {
    /// Dynamic shared memory: the stages of a weight tile and a token tile (bf16); the
    /// wgmma tiles ask 1 KB more, to start the stages on a 1024-byte boundary.
    const fn smem_bytes(self) -> usize {
        self.stages * (TILE_ROWS + self.tokens) * STAGE_K * 2 + if self.wgmma { 1024 } else { 0 }
    }
}

// Each tile's resident blocks fit a multiprocessor's 228 KB (1 KB of it reserved a block),
// and a split's partial tiles (tokens / 8 float4 a thread) fit the stages' memory they reuse.
const _: () = {
    let mut i = 0;
    while i < TILES.len() {
        let t = TILES[i];
        assert!(t.blocks_per_sm * (t.smem_bytes() + 1024) <= 228 * 1024);
        assert!(
            t.tokens / 8 * 16 * THREADS as usize <= t.stages * (TILE_ROWS + t.tokens) * STAGE_K * 2
        );
        i += 1;
    }
};

/// The tile for `t` rows.
fn tile_for(t: usize) -> (usize, Tile) {
    let i = TILES
        .iter()
        .position(|tile| t <= tile.tokens)
        .unwrap_or(TILES.len() - 1);
    (i, TILES[i])
}

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

/// The most rows the device runs the kernel for (0: none): 32 on sm_90 and later (clusters),
/// 128 on sm_90 itself (wgmma), each tile's entry points loaded and granted their shared
/// memory, and no more than `cap` ([`crate::CudaTuning::skinny_gemm_max_rows`]: 0 turns
/// the kernel off, 32 sends everything past the mma.sync tile to cuBLAS).
pub(super) fn probe(arch: u32, kernels: &Kernels, cap: usize) -> usize {
    if arch < 90 {
        return 0;
    }
    let per_tile = SKINNY_KERNELS.len() / TILES.len();
    max_rows(cap, |i, tile| {
        (!tile.wgmma || arch == 90)
            && SKINNY_KERNELS[per_tile * i..per_tile * (i + 1)]
                .iter()
                .all(|&name| {
                    kernels.get(name).is_ok_and(|f| {
                        f.set_attribute(
                            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            tile.smem_bytes() as i32,
                        )
                        .is_ok()
                    })
                })
    })
}

/// The most rows under `cap` that usable tiles cover: tiles in order while each is usable
/// and the ones before it stop short of `cap`.
fn max_rows(cap: usize, usable: impl Fn(usize, Tile) -> bool) -> usize {
    let mut rows = 0;
    for (i, tile) in TILES.into_iter().enumerate() {
        if rows >= cap || !usable(i, tile) {
            break;
        }
        rows = tile.tokens;
    }
    rows.min(cap)
}

/// The cluster (k split) for `tiles` tiles over `stages` stages of k: the largest that keeps
/// the grid within one wave of resident blocks and gives every block a stage.
fn cluster_size(tiles: usize, stages: usize, wave: usize) -> usize {
    CLUSTERS
        .into_iter()
        .filter(|&c| c == 1 || (c <= stages && tiles * c <= wave))
        .max()
        .unwrap_or(1)
}

/// The entry point of token tile `tile`, mode `family` (plain, gated, slice) and a cluster.
fn kernel_index(tile: usize, family: usize, cluster: usize) -> usize {
    SKINNY_KERNELS.len() / TILES.len() * tile
        + CLUSTERS.len() * family
        + cluster.trailing_zeros() as usize
}

impl CudaBackend {
    /// One launch over `mats` (1 to 3 bf16 weights `[n_i, k]` sharing `xb [t, k]`), or,
    /// gated, over an MLP's gate and up (`mats[0]`, `mats[1]`, one shape) writing
    /// `act(gate) * up` to `mats[0]`'s outputs, or, sliced, over one weight. Callers check
    /// the shapes, the slice's reach and `PathLimits::skinny`.
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
                && t <= self.skinny_max_rows
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
        let (tile_index, tile) = tile_for(t);
        let cluster = cluster_size(tiles, k / STAGE_K, tile.blocks_per_sm * self.sm_count);
        let name = SKINNY_KERNELS[kernel_index(tile_index, family, cluster)];
        let f = self.kernels.get(name)?;
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(tiles).map_err(|_| too_big(OP, tiles))?,
                cluster as u32,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: tile.smem_bytes() as u32,
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
        // (checked by the callers; a slice's table reaches every row it is read at); t is
        // within the chosen tile's tokens, a tile the device runs (`probe`); k is a
        // multiple of 64 and every buffer starts an allocation, so the 16-byte copies
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
        // output projection; the 32-token tile has two blocks a multiprocessor.
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
            assert_eq!(cluster_size(tiles, stages, 264), want, "{tiles} x {stages}");
        }
    }

    /// The row limit follows the usable tiles and the cap, which need not be a tile edge.
    #[test]
    fn row_limit_follows_usable_tiles_and_cap() {
        let all = |_: usize, _: Tile| true;
        let no_wgmma = |_: usize, t: Tile| !t.wgmma;
        for (cap, want) in [
            (128, 128),
            (1000, 128),
            (96, 96),
            (48, 48),
            (32, 32),
            (5, 5),
            (0, 0),
        ] {
            assert_eq!(max_rows(cap, all), want, "cap {cap}");
        }
        assert_eq!(
            max_rows(128, no_wgmma),
            32,
            "later GPUs: the mma.sync tile only"
        );
        assert_eq!(
            max_rows(128, |i, _| i != 1),
            32,
            "a gap stops the tiles after it"
        );
    }

    /// Rows pick the smallest token tile that holds them.
    #[test]
    fn rows_take_the_smallest_tile_that_holds_them() {
        for (t, tokens) in [(3, 32), (32, 32), (33, 64), (64, 64), (65, 128), (128, 128)] {
            assert_eq!(tile_for(t).1.tokens, tokens, "{t} rows");
        }
    }

    /// The launcher's index into `SKINNY_KERNELS` names the entry point of that tile, mode
    /// and cluster.
    #[test]
    fn kernel_index_names_tile_mode_and_cluster() {
        for (i, tile) in TILES.into_iter().enumerate() {
            for (family, mode) in ["plain", "gated", "slice"].into_iter().enumerate() {
                for c in CLUSTERS {
                    assert_eq!(
                        SKINNY_KERNELS[kernel_index(i, family, c)],
                        format!("skinny_gemm_{mode}_t{}_c{c}", tile.tokens)
                    );
                }
            }
        }
    }
}
