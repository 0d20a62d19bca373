//! LoRA products by slot on the GPU (`kernels/lora.cu`): a shrink pass into an f32 scratch
//! of `[splits, rows, rank]` (parts over splits of the columns), then an expand pass that
//! adds the parts and adds the product to `out`.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::buffer::dtype_code;
use super::ops::arg_any;
use super::{device_err, CudaBackend, CudaBuffer, CudaIndex};
use crate::error::ensure;
use crate::{Backend, DType, DeviceBuffer, LoraShape, LoraStacks, Result};

const OP: &str = "lora_bgmv";
/// Warps of a shrink block (`LORA_WARPS` in `kernels/lora.cu`): ranks a block computes.
const SHRINK_WARPS: usize = 8;
/// Output features of an expand block.
const EXPAND_THREADS: usize = 256;
/// Rows of a shrink or expand block (`LORA_TILE_ROWS`), taken in slot order.
const TILE_ROWS: usize = 8;

impl CudaBackend {
    pub(super) fn lora_bgmv_impl(
        &self,
        x: &CudaBuffer,
        stacks: LoraStacks<'_, CudaBuffer>,
        slots: &CudaIndex,
        s: LoraShape,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        let (a, b) = (stacks.a, stacks.b);
        let scales = stacks.scales.f32s(OP)?;
        let lens = (a.len(), b.len(), stacks.scales.len());
        crate::cpu::lora::check(x.len(), lens, slots.len(), s, out.len())?;
        ensure(
            a.dtype == b.dtype && matches!(a.dtype, DType::F32 | DType::BF16),
            OP,
            || format!("stacks of {:?} and {:?}", a.dtype, b.dtype),
        )?;
        if s.rows == 0 || s.rank == 0 || s.out == 0 || s.slots == 0 {
            return Ok(());
        }
        let xs = x.f32s(OP)?;
        let split = self.lora_split_cols;
        let splits = s.cols.div_ceil(split);
        let mut h = self.scratch(splits * s.rows * s.rank, DType::F32)?;
        let code = dtype_code(a.dtype);
        let (slots_n, rank, cols, out_n) =
            (s.slots as u32, s.rank as i32, s.cols as i32, s.out as i32);
        let (rows, split_cols) = (s.rows as i32, split as i32);
        {
            let hs = h.f32s_mut(OP)?;
            let mut l = self.stream.launch_builder(self.kernels.get("lora_shrink")?);
            l.arg(xs);
            arg_any(&mut l, a);
            l.arg(&code)
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
                    s.rank.div_ceil(SHRINK_WARPS) as u32,
                    splits as u32,
                ),
                block_dim: (32 * SHRINK_WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match `lora_shrink`; x holds rows x cols, a slots x rank
            // x cols of `code`'s dtype, the index 3 x rows and h splits x rows x rank
            // (checked above); a listed row is used only below rows, its slot only below
            // slots_n, k below rank and a column below cols.
            unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        }
        let hs = h.f32s(OP)?;
        let o = out.f32s_mut(OP)?;
        let mut l = self.stream.launch_builder(self.kernels.get("lora_expand")?);
        let splits = splits as i32;
        l.arg(hs).arg(&splits);
        arg_any(&mut l, b);
        l.arg(&code)
            .arg(scales)
            .arg(slots.data())
            .arg(&slots_n)
            .arg(&rows)
            .arg(&rank)
            .arg(&out_n)
            .arg(o);
        let cfg = LaunchConfig {
            grid_dim: (
                s.out.div_ceil(EXPAND_THREADS) as u32,
                s.rows.div_ceil(TILE_ROWS) as u32,
                1,
            ),
            block_dim: (EXPAND_THREADS as u32, 1, 1),
            shared_mem_bytes: (TILE_ROWS * s.rank * 4) as u32,
        };
        // SAFETY: the arguments match `lora_expand`; h holds splits x rows x rank, b slots
        // x out x rank of `code`'s dtype, scales one a slot, the index 3 x rows and out rows x out
        // (checked above); a listed row is used only below rows; the block's shared memory
        // holds its tile's rank values of h.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}
