//! Attention launcher (`kernels/attention.cu`): one block of four warps per (query, head),
//! or, for at least [`TILED_MIN_QUERIES`] queries at a head_dim of at most
//! [`TILED_MAX_HEAD_DIM`], blocks of 64 queries of one head that share each tile of keys.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::buffer::CudaBuffer;
use super::{device_err, CudaBackend};
use crate::error::ensure;
use crate::{AttentionParams, DeviceBuffer, KernelError, Result};

/// Largest head_dim the kernel's shared memory and per-lane accumulators are sized for
/// (`ATTN_MAX_D` in the kernel).
pub const MAX_HEAD_DIM: usize = 512;
const THREADS: u32 = 128;
/// Largest head_dim of the tiled kernel (`TILE_D`): a query's row and accumulator live in
/// its thread's registers.
pub const TILED_MAX_HEAD_DIM: usize = 64;
/// Fewest queries for which the tiled kernel is taken: below, its blocks of 64 threads
/// would be mostly idle.
pub const TILED_MIN_QUERIES: usize = 8;
/// Queries a block of the tiled kernel (`TILE_Q`).
const TILE_Q: usize = 64;

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_impl(
        &self,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        q_positions: &[u32],
        k_positions: &[u32],
        p: AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "attention";
        let d = p.head_dim;
        if d == 0 || d > MAX_HEAD_DIM {
            return Err(KernelError::Invalid {
                op: OP,
                detail: format!("head_dim {d} outside 1..={MAX_HEAD_DIM}"),
            });
        }
        if p.n_kv_heads == 0 || !p.n_heads.is_multiple_of(p.n_kv_heads) {
            return Err(KernelError::Invalid {
                op: OP,
                detail: format!(
                    "{} query heads do not group over {} KV heads",
                    p.n_heads, p.n_kv_heads
                ),
            });
        }
        let (t, s) = (q_positions.len(), k_positions.len());
        ensure(q.len() == t * p.n_heads * d, OP, || {
            format!("q has {}, want {t} x {} x {d}", q.len(), p.n_heads)
        })?;
        ensure(
            k.len() == s * p.n_kv_heads * d && v.len() == k.len(),
            OP,
            || {
                format!(
                    "k has {}, v has {}, want {s} x {} x {d}",
                    k.len(),
                    v.len(),
                    p.n_kv_heads
                )
            },
        )?;
        ensure(out.len() == q.len(), OP, || {
            format!("out has {}, q has {}", out.len(), q.len())
        })?;
        let (qs, ks, vs) = (q.f32s(OP)?, k.f32s(OP)?, v.f32s(OP)?);
        let os = out.f32s_mut(OP)?;
        if t == 0 || p.n_heads == 0 {
            return Ok(());
        }
        let blocks = u32::try_from(t * p.n_heads).map_err(|_| KernelError::Invalid {
            op: OP,
            detail: format!("{t} queries x {} heads is too many blocks", p.n_heads),
        })?;
        let qp = self.to_device(q_positions)?;
        let kp = self.to_device(k_positions)?;
        let n_keys = i32::try_from(s).map_err(|_| KernelError::Invalid {
            op: OP,
            detail: format!("{s} keys"),
        })?;
        let (heads, kv_heads, d_i) = (p.n_heads as i32, p.n_kv_heads as i32, d as i32);
        // -1: no window. A window wider than any position distance is the same as none.
        let window: i64 = p
            .window
            .map_or(-1, |w| i64::try_from(w).unwrap_or(i64::MAX));
        let causal = i32::from(p.causal);
        let has_softcap = i32::from(p.softcap.is_some());
        let cap = p.softcap.unwrap_or(1.0);
        if p.softcap.is_some() && !(cap > 0.0 && cap.is_finite()) {
            return Err(KernelError::Invalid {
                op: OP,
                detail: format!("softcap {cap} must be positive and finite"),
            });
        }
        if d <= TILED_MAX_HEAD_DIM && t >= TILED_MIN_QUERIES {
            let (n_queries, hs) = (t as i32, p.n_heads as u32);
            let mut l = self
                .stream
                .launch_builder(self.kernels.get("attention_tiled")?);
            l.arg(qs)
                .arg(ks)
                .arg(vs)
                .arg(&qp)
                .arg(&kp)
                .arg(os)
                .arg(&n_queries)
                .arg(&n_keys)
                .arg(&heads)
                .arg(&kv_heads)
                .arg(&d_i)
                .arg(&p.scale)
                .arg(&window)
                .arg(&causal)
                .arg(&has_softcap)
                .arg(&cap);
            let cfg = LaunchConfig {
                grid_dim: (t.div_ceil(TILE_Q) as u32, hs, 1),
                block_dim: (TILE_Q as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: as below; d <= TILE_D, and each block's threads past t write nothing.
            unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
            return Ok(());
        }
        let mut l = self.stream.launch_builder(self.kernels.get(OP)?);
        l.arg(qs)
            .arg(ks)
            .arg(vs)
            .arg(&qp)
            .arg(&kp)
            .arg(os)
            .arg(&n_keys)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&d_i)
            .arg(&p.scale)
            .arg(&window)
            .arg(&causal)
            .arg(&has_softcap)
            .arg(&cap);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: q/out hold t x n_heads x d, k/v hold s x n_kv_heads x d, positions t and s
        // values (checked above); d <= MAX_HEAD_DIM.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}
