//! LoRA products by slot on the GPU (`kernels/lora.cu`): a shrink pass into an f32 scratch
//! of `[parts, splits, rows, rank]` (sums over splits of the columns), then an expand pass
//! that adds the splits and adds the product to each part's `out`. Parts that read the same
//! x (q, k and v; gate and up) share the two launches.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::buffer::dtype_code;
use super::fused::{buffer_ptr, f32_ptr_mut, too_big};
use super::{device_err, CudaBackend, CudaBuffer, CudaIndex};
use crate::error::ensure;
use crate::{Backend, DType, DeviceBuffer, LoraOut, LoraShape, LoraStacks, Result};

const OP: &str = "lora_bgmv";
/// Warps of a shrink block (`LORA_WARPS` in `kernels/lora.cu`): ranks a block computes.
const SHRINK_WARPS: usize = 8;
/// Output features of an expand block.
const EXPAND_THREADS: usize = 256;
/// Rows of a shrink or expand block (`LORA_TILE_ROWS`), taken in slot order.
const TILE_ROWS: usize = 8;
/// Parts one launch runs (`LORA_MAX_PARTS`).
const MAX_PARTS: usize = 3;

/// `LoraParts` in `lora.cu`, same layout: each part's stacks and output; unused entries
/// repeat the last part, and `block_end` counts the expand blocks of parts `0..=i`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct LoraParts {
    a: [u64; MAX_PARTS],
    b: [u64; MAX_PARTS],
    scales: [u64; MAX_PARTS],
    out: [u64; MAX_PARTS],
    out_n: [i32; MAX_PARTS],
    block_end: [i32; MAX_PARTS],
}

// SAFETY: plain integers in the kernel parameter's C layout (`LoraParts` in `lora.cu`).
unsafe impl cudarc::driver::DeviceRepr for LoraParts {}

impl CudaBackend {
    pub(super) fn lora_bgmv_impl(
        &self,
        x: &CudaBuffer,
        stacks: LoraStacks<'_, CudaBuffer>,
        slots: &CudaIndex,
        s: LoraShape,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        let mut parts = [LoraOut {
            stacks,
            out_features: s.out,
            out,
        }];
        self.lora_parts(x, &mut parts, slots, s)
    }

    pub(super) fn lora_shared_impl(
        &self,
        x: &CudaBuffer,
        parts: &mut [LoraOut<'_, CudaBuffer>],
        slots: &CudaIndex,
        s: LoraShape,
    ) -> Result<()> {
        for chunk in parts.chunks_mut(MAX_PARTS) {
            self.lora_parts(x, chunk, slots, s)?;
        }
        Ok(())
    }

    /// Up to [`MAX_PARTS`] parts over the same x in one shrink and one expand launch.
    fn lora_parts(
        &self,
        x: &CudaBuffer,
        parts: &mut [LoraOut<'_, CudaBuffer>],
        slots: &CudaIndex,
        s: LoraShape,
    ) -> Result<()> {
        ensure(!parts.is_empty() && parts.len() <= MAX_PARTS, OP, || {
            format!("{} parts in one launch", parts.len())
        })?;
        let dtype = parts[0].stacks.a.dtype;
        for p in parts.iter() {
            let st = p.stacks;
            let lens = (st.a.len(), st.b.len(), st.scales.len());
            let ps = LoraShape {
                out: p.out_features,
                ..s
            };
            crate::cpu::lora::check(x.len(), lens, slots.len(), ps, p.out.len())?;
            st.scales.f32s(OP)?;
            ensure(
                st.a.dtype == dtype
                    && st.b.dtype == dtype
                    && matches!(dtype, DType::F32 | DType::BF16),
                OP,
                || format!("stacks of {:?} and {:?}", st.a.dtype, st.b.dtype),
            )?;
        }
        if s.rows == 0 || s.rank == 0 || s.slots == 0 {
            return Ok(());
        }
        let mut lp = LoraParts::default();
        let mut blocks = 0usize;
        let n_parts = parts.len();
        for i in 0..MAX_PARTS {
            let p = &mut parts[i.min(n_parts - 1)];
            if i < n_parts {
                blocks += p.out_features.div_ceil(EXPAND_THREADS);
            }
            lp.a[i] = buffer_ptr(self, p.stacks.a);
            lp.b[i] = buffer_ptr(self, p.stacks.b);
            lp.scales[i] = buffer_ptr(self, p.stacks.scales);
            lp.out[i] = f32_ptr_mut(self, p.out, OP)?;
            lp.out_n[i] = i32::try_from(p.out_features).map_err(|_| too_big(OP, p.out_features))?;
            lp.block_end[i] = i32::try_from(blocks).map_err(|_| too_big(OP, blocks))?;
        }
        if blocks == 0 {
            return Ok(());
        }
        let xs = x.f32s(OP)?;
        let split = self.lora_split_cols;
        let splits = s.cols.div_ceil(split);
        let mut h = self.scratch(n_parts * splits * s.rows * s.rank, DType::F32)?;
        let code = dtype_code(dtype);
        let slots_n = s.slots as u32;
        let [rows, rank, cols, split_cols, splits_i] = [s.rows, s.rank, s.cols, split, splits]
            .map(|v| i32::try_from(v).map_err(|_| too_big(OP, v)));
        let (rows, rank, cols, split_cols, splits_i) =
            (rows?, rank?, cols?, split_cols?, splits_i?);
        {
            let hs = h.f32s_mut(OP)?;
            let mut l = self.stream.launch_builder(self.kernels.get("lora_shrink")?);
            l.arg(xs)
                .arg(&lp)
                .arg(&code)
                .arg(slots.data())
                .arg(&slots_n)
                .arg(&rows)
                .arg(&rank)
                .arg(&cols)
                .arg(&split_cols)
                .arg(hs);
            let cfg = LaunchConfig {
                grid_dim: (
                    s.rows.div_ceil(TILE_ROWS) as u32,
                    (n_parts * s.rank.div_ceil(SHRINK_WARPS)) as u32,
                    splits as u32,
                ),
                block_dim: (32 * SHRINK_WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match `lora_shrink`; x holds rows x cols, each part's a
            // slots x rank x cols of `code`'s dtype, the index 3 x rows and h parts x splits
            // x rows x rank (checked above); a listed row is used only below rows, its slot
            // only below slots_n, k below rank and a column below cols.
            unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        }
        let hs = h.f32s(OP)?;
        let mut l = self.stream.launch_builder(self.kernels.get("lora_expand")?);
        l.arg(hs)
            .arg(&splits_i)
            .arg(&lp)
            .arg(&code)
            .arg(slots.data())
            .arg(&slots_n)
            .arg(&rows)
            .arg(&rank);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, s.rows.div_ceil(TILE_ROWS) as u32, 1),
            block_dim: (EXPAND_THREADS as u32, 1, 1),
            shared_mem_bytes: (TILE_ROWS * s.rank * 4) as u32,
        };
        // SAFETY: the arguments match `lora_expand`; h holds parts x splits x rows x rank,
        // each part's b slots x out_n x rank of `code`'s dtype, its scales one a slot and
        // its out rows x out_n, the index 3 x rows (checked above); a block's part is the
        // first whose block_end passes it; a listed row is used only below rows; the
        // block's shared memory holds its tile's rank values of h.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}
