//! Launchers of `kernels/conformer.cu`: the audio conformer's clamp, causal depthwise
//! convolution and chunked attention (the CPU's `cpu/conformer.rs` is the definition).

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::buffer::CudaBuffer;
use super::{device_err, grid_for, CudaBackend};
use crate::error::ensure;
use crate::{ChunkedAttentionParams, DepthwiseConv, DeviceBuffer, KernelError, Result};

/// The most frames a block's keys span (`CHUNKED_MAX_CONTEXT` in the kernel).
const MAX_CONTEXT: usize = 256;

fn as_i32(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Invalid {
        op,
        detail: format!("{v} past 32 bits"),
    })
}

impl CudaBackend {
    pub(super) fn clamp_impl(&self, x: &mut CudaBuffer, lo: f32, hi: f32) -> Result<()> {
        const OP: &str = "clamp";
        ensure(lo <= hi, OP, || format!("bounds {lo} > {hi}"))?;
        let n = x.len();
        let xs = x.f32s_mut(OP)?;
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        let mut l = self.stream.launch_builder(self.kernels.get("clamp_f32")?);
        l.arg(xs).arg(&n64).arg(&lo).arg(&hi);
        // SAFETY: the arguments match `clamp_f32(float*, u64, float, float)`; x holds n
        // values and the kernel touches one element per index below n.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(OP))?;
        Ok(())
    }

    pub(super) fn depthwise_conv1d_causal_impl(
        &self,
        x: &CudaBuffer,
        w: &CudaBuffer,
        p: DepthwiseConv,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "depthwise_conv1d_causal";
        p.check_sizes(OP, x.len(), w.len(), out.len())?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        let (frames, channels, kernel) = (
            (n / p.channels) as u64,
            as_i32(OP, p.channels)?,
            as_i32(OP, p.kernel)?,
        );
        let (xs, ws) = (x.f32s(OP)?, w.f32s(OP)?);
        let os = super::fused::f32_ptr_mut(self, out, OP)?;
        let mut l = self
            .stream
            .launch_builder(self.kernels.get("depthwise_conv1d_causal_f32")?);
        l.arg(xs)
            .arg(ws)
            .arg(&os)
            .arg(&frames)
            .arg(&channels)
            .arg(&kernel);
        // SAFETY: x and out hold frames x channels f32 values and w channels x kernel
        // (checked above); one thread an output element.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(OP))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn chunked_attention_impl(
        &self,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        rel_k: &CudaBuffer,
        p: ChunkedAttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "chunked_attention";
        p.check_sizes(OP, (q.len(), k.len(), v.len(), rel_k.len(), out.len()))?;
        ensure(p.context() <= MAX_CONTEXT, OP, || {
            format!(
                "a context of {} frames (at most {MAX_CONTEXT})",
                p.context()
            )
        })?;
        let frames = q.len() / (p.n_heads * p.head_dim);
        if frames == 0 {
            return Ok(());
        }
        let ints = [
            as_i32(OP, frames)?,
            as_i32(OP, p.n_heads)?,
            as_i32(OP, p.head_dim)?,
            as_i32(OP, p.chunk)?,
            as_i32(OP, p.left)?,
            as_i32(OP, p.right)?,
        ];
        let (qs, ks, vs, rs) = (q.f32s(OP)?, k.f32s(OP)?, v.f32s(OP)?, rel_k.f32s(OP)?);
        let os = super::fused::f32_ptr_mut(self, out, OP)?;
        let mut l = self
            .stream
            .launch_builder(self.kernels.get("chunked_attention_f32")?);
        l.arg(qs).arg(ks).arg(vs).arg(rs).arg(&os);
        for v in &ints {
            l.arg(v);
        }
        l.arg(&p.logit_cap).arg(&p.invalid_logit);
        let cfg = LaunchConfig {
            grid_dim: (frames as u32, p.n_heads as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: q, k, v and out hold frames x heads x d f32 values and rel_k positions
        // rows of heads x d (checked above); the context fits the kernel's shared logits.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}
