//! Launchers for the small kernels: embedding, RMSNorm, RoPE and the elementwise family.
//! Each checks lengths and dtypes on the host first (a mismatch is an error, never an
//! out-of-bounds launch), then queues the kernel.

use cudarc::driver::{CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};

use super::buffer::{arg_twin, dtype_code, CudaBuffer, Storage, NULL_PTR};
use super::{device_err, grid_for, CudaBackend};
use crate::error::ensure;
use crate::RopeStyle;
use crate::{
    Activation, DType, DeviceBuffer, KernelError, NextNorm, Result, RmsNormParams, RopeParams,
};

/// Pushes a buffer of any dtype as a `const void*` argument.
pub(super) fn arg_any<'a>(l: &mut LaunchArgs<'a>, buf: &'a CudaBuffer) {
    match &buf.storage {
        Storage::F32(s) => l.arg(s),
        Storage::Bits16(s) => l.arg(s),
    };
}

pub(super) fn act_code(act: Activation) -> i32 {
    match act {
        Activation::GeluTanh => 0,
        Activation::Silu => 1,
        Activation::Sigmoid => 2,
    }
}

/// Values of a row one embedding block writes (`EMB_SLICE` in `kernels/embedding.cu`).
const EMB_SLICE: usize = 2048;

fn same_len(op: &'static str, a: &CudaBuffer, b: &CudaBuffer) -> Result<()> {
    ensure(a.len() == b.len(), op, || {
        format!("lengths {} and {} differ", a.len(), b.len())
    })
}

/// A norm's input `x` in `parts` parts holds `parts` times the values of `b`, one of its
/// whole-row buffers (the residual, the output).
fn whole_len(op: &'static str, x: &CudaBuffer, b: &CudaBuffer, parts: usize) -> Result<()> {
    ensure(x.len() == b.len() * parts, op, || {
        format!(
            "an input of {} values in {parts} parts against {} whole values",
            x.len(),
            b.len()
        )
    })
}

/// The most parts of a norm's input the vector path adds (`NORM_MAX_PARTS`).
const NORM_MAX_PARTS: usize = 4;

/// Which of the four RMSNorm forms `kernels/norm.cu` runs.
#[derive(Clone, Copy)]
enum NormMode {
    Plain = 0,
    AddThenNorm = 1,
    NormThenAdd = 2,
    NormAddNorm = 3,
}

impl NormMode {
    /// The mode's entry point in `kernels/norm.cu` (one per mode, each with its own
    /// register count; the `mode` argument they all take must match).
    fn kernel(self) -> &'static str {
        match self {
            NormMode::Plain => "rms_norm_plain",
            NormMode::AddThenNorm => "rms_norm_add_then_norm",
            NormMode::NormThenAdd => "rms_norm_then_add",
            NormMode::NormAddNorm => "rms_norm_add_norm",
        }
    }

    /// The mode's entry point for f32 or bf16 weights on the vector path
    /// (`NORM_ENTRY_TYPED`); None for other dtypes.
    fn kernel_typed(self, dtype: DType) -> Option<&'static str> {
        Some(match (dtype, self) {
            (DType::F32, NormMode::Plain) => "rms_norm_plain_f32",
            (DType::F32, NormMode::AddThenNorm) => "rms_norm_add_then_norm_f32",
            (DType::F32, NormMode::NormThenAdd) => "rms_norm_then_add_f32",
            (DType::F32, NormMode::NormAddNorm) => "rms_norm_add_norm_f32",
            (DType::BF16, NormMode::Plain) => "rms_norm_plain_bf16",
            (DType::BF16, NormMode::AddThenNorm) => "rms_norm_add_then_norm_bf16",
            (DType::BF16, NormMode::NormThenAdd) => "rms_norm_then_add_bf16",
            (DType::BF16, NormMode::NormAddNorm) => "rms_norm_add_norm_bf16",
            _ => return None,
        })
    }

    /// The mode's entry point for f32 weights on the vector path over an input in 2 to
    /// `NORM_MAX_PARTS` parts (`NORM_ENTRY_PARTS`); None for other cases.
    fn kernel_parts(self, dtype: DType) -> Option<&'static str> {
        Some(match (dtype, self) {
            (DType::F32, NormMode::AddThenNorm) => "rms_norm_add_then_norm_f32_parts",
            (DType::F32, NormMode::NormThenAdd) => "rms_norm_then_add_f32_parts",
            (DType::F32, NormMode::NormAddNorm) => "rms_norm_add_norm_f32_parts",
            _ => return None,
        })
    }
}

/// The optional parts of a norm launch: the second norm's weight (`NormAddNorm`) and the
/// residual's scale after `NormThenAdd`.
#[derive(Clone, Copy)]
struct NormExtra<'a> {
    weight2: Option<&'a CudaBuffer>,
    post_scale: f32,
}

const NO_EXTRA: NormExtra<'static> = NormExtra {
    weight2: None,
    post_scale: 1.0,
};

/// float4 chunks per thread on the norm kernel's vector path (`NORM_VEC` in
/// `kernels/norm.cu`), taken when `dim % 4 == 0` and `dim / 4 <= NORM_VEC * threads`.
const NORM_VEC: usize = 2;

/// Values per thread of the scalar strided path (`dim % 4 != 0`) before the block grows.
const NORM_SCALAR_PER_THREAD: usize = 8;

/// Threads for a norm over rows of `dim` (one block per row; whole warps, 32 to 1024):
/// with `dim % 4 == 0`, the fewest warps that give each thread at most NORM_VEC float4
/// chunks (1536 -> 192, 2560 -> 320; up to dim 8192 at 1024 threads, longer rows loop);
/// otherwise about NORM_SCALAR_PER_THREAD values per thread for the strided loops.
fn norm_threads(dim: usize) -> u32 {
    let per_thread = if dim.is_multiple_of(4) {
        4 * NORM_VEC
    } else {
        NORM_SCALAR_PER_THREAD
    };
    (dim.div_ceil(per_thread).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// Every id below `vocab`, the rows of the table it looks up (checked on the host, before
/// the ids go to the device).
pub(super) fn check_ids(op: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(&bad) => Err(KernelError::Invalid {
            op,
            detail: format!("id {bad} outside a vocabulary of {vocab}"),
        }),
        None => Ok(()),
    }
}

impl CudaBackend {
    pub(super) fn embedding_impl(
        &self,
        ids: &[u32],
        table: &CudaBuffer,
        hidden: usize,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "embedding";
        ensure(hidden > 0 && table.len().is_multiple_of(hidden), OP, || {
            format!("table of {} is not rows of {hidden}", table.len())
        })?;
        check_ids(OP, ids, table.len() / hidden)?;
        ensure(out.len() == ids.len() * hidden, OP, || {
            format!("out has {}, want {} x {hidden}", out.len(), ids.len())
        })?;
        if ids.is_empty() {
            return Ok(());
        }
        let ids_dev = self.to_device(ids)?;
        self.embedding_dev(ids.len(), &ids_dev, table, hidden, scale, out)
    }

    /// Embedding with the ids already on the device (`n` of them, each below the table's
    /// rows: the caller checked them on the host).
    pub(super) fn embedding_dev(
        &self,
        n: usize,
        ids_dev: &cudarc::driver::CudaSlice<u32>,
        table: &CudaBuffer,
        hidden: usize,
        scale: f32,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "embedding";
        ensure(
            hidden > 0 && table.len().is_multiple_of(hidden) && out.len() == n * hidden,
            OP,
            || format!("out has {}, want {n} x {hidden}", out.len()),
        )?;
        let o = out.f32s_mut(OP)?;
        if n == 0 {
            return Ok(());
        }
        let ids = ids_dev;
        let f = self.kernels.get("embedding")?;
        let (dtype, hidden_i) = (dtype_code(table.dtype), hidden as i32);
        let mut l = self.stream.launch_builder(f);
        arg_any(&mut l, table);
        l.arg(&dtype).arg(ids).arg(o).arg(&hidden_i).arg(&scale);
        // One block per token and slice of `EMB_SLICE` values (`kernels/embedding.cu`).
        let cfg = LaunchConfig {
            grid_dim: (n as u32, hidden.div_ceil(EMB_SLICE) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: ids < vocab (checked by the caller) and out holds n x hidden.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }

    fn norm_checks(
        &self,
        op: &'static str,
        x: &CudaBuffer,
        weight: Option<&CudaBuffer>,
        p: &RmsNormParams,
    ) -> Result<()> {
        ensure(p.parts > 0, op, || "an input of zero parts".to_string())?;
        ensure(
            p.dim > 0 && x.len().is_multiple_of(p.dim * p.parts),
            op,
            || {
                format!(
                    "length {} is not rows of {} parts of dim {}",
                    x.len(),
                    p.parts,
                    p.dim
                )
            },
        )?;
        if let Some(w) = weight {
            ensure(w.len() == p.dim, op, || {
                format!("weight has {} elements, dim is {}", w.len(), p.dim)
            })?;
        }
        Ok(())
    }

    /// Queues `kernels/norm.cu`; `residual` is read and written in the fused modes, `out`
    /// written unless the mode adds into the residual.
    #[allow(clippy::too_many_arguments)]
    fn launch_norm(
        &self,
        op: &'static str,
        mode: NormMode,
        x: &CudaBuffer,
        residual: Option<&mut CudaBuffer>,
        weight: Option<&CudaBuffer>,
        p: RmsNormParams,
        out: Option<&mut CudaBuffer>,
        extra: NormExtra<'_>,
    ) -> Result<()> {
        let rows = x.len() / (p.dim * p.parts);
        if rows == 0 {
            return Ok(());
        }
        // f32 or bf16 weights on the vector path (every buffer here is a whole allocation,
        // so 16-byte aligned) take that case's own entry point.
        let second_ok = match (mode, weight, extra.weight2) {
            (NormMode::NormAddNorm, Some(w), Some(w2)) => w.dtype == w2.dtype,
            (NormMode::NormAddNorm, _, _) => false,
            (_, _, w2) => w2.is_none(),
        };
        let vector =
            p.dim.is_multiple_of(4) && p.dim / 4 <= NORM_VEC * norm_threads(p.dim) as usize;
        // An input in parts: its own entries up to NORM_MAX_PARTS, else the general entry's
        // strided path (which adds any count).
        let typed = |w: &CudaBuffer| match p.parts {
            1 => mode.kernel_typed(w.dtype),
            n if n <= NORM_MAX_PARTS => mode.kernel_parts(w.dtype),
            _ => None,
        };
        let name = weight
            .filter(|_| second_ok && vector)
            .and_then(typed)
            .unwrap_or_else(|| mode.kernel());
        let f = self.kernels.get(name)?;
        let xs = x.f32s(op)?;
        // The kernel's result (the residual for NormThenAdd, else `out`) also goes out in
        // bf16 when a bf16 GEMM reads it next.
        let twin = self.gemm_reads_bf16(rows);
        let (twin_res, twin_out) = match mode {
            NormMode::NormThenAdd => (twin, false),
            _ => (false, twin),
        };
        let parts = p.parts as i32;
        let (dim, mode, w_dtype, w2_dtype) = (
            p.dim as i32,
            mode as i32,
            weight.map_or(-1, |w| dtype_code(w.dtype)),
            extra.weight2.map_or(-1, |w| dtype_code(w.dtype)),
        );
        let mut twin_ptr = None;
        let mut l = self.stream.launch_builder(f);
        l.arg(xs);
        // An unused pointer argument gets `x` (never dereferenced by that mode).
        match residual {
            Some(r) => {
                let (values, b) = r.f32s_maybe_twin_mut(&self.stream, twin_res, op)?;
                twin_ptr = b.or(twin_ptr);
                l.arg(values)
            }
            None => l.arg(xs),
        };
        match weight {
            Some(w) => arg_any(&mut l, w),
            None => {
                l.arg(xs);
            }
        }
        l.arg(&w_dtype);
        match extra.weight2 {
            Some(w) => arg_any(&mut l, w),
            None => {
                l.arg(xs);
            }
        }
        l.arg(&w2_dtype).arg(&p.weight_offset);
        match out {
            Some(o) => {
                let (values, b) = o.f32s_maybe_twin_mut(&self.stream, twin_out, op)?;
                twin_ptr = b.or(twin_ptr);
                l.arg(values)
            }
            None => l.arg(xs),
        };
        arg_twin(&mut l, twin_ptr);
        l.arg(&dim)
            .arg(&p.eps)
            .arg(&mode)
            .arg(&extra.post_scale)
            .arg(&parts);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (norm_threads(p.dim), 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every buffer holds rows x dim elements (weight: dim), checked by callers.
        unsafe { l.launch(cfg) }.map_err(device_err(op))?;
        Ok(())
    }

    pub(super) fn rms_norm_plain(
        &self,
        x: &CudaBuffer,
        weight: Option<&CudaBuffer>,
        p: RmsNormParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "rms_norm";
        self.norm_checks(OP, x, weight, &p)?;
        whole_len(OP, x, out, p.parts)?;
        self.launch_norm(OP, NormMode::Plain, x, None, weight, p, Some(out), NO_EXTRA)
    }

    pub(super) fn add_then_rms_norm(
        &self,
        residual: &mut CudaBuffer,
        x: &CudaBuffer,
        weight: Option<&CudaBuffer>,
        p: RmsNormParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "add_rms_norm";
        self.norm_checks(OP, x, weight, &p)?;
        whole_len(OP, x, residual, p.parts)?;
        whole_len(OP, x, out, p.parts)?;
        self.launch_norm(
            OP,
            NormMode::AddThenNorm,
            x,
            Some(residual),
            weight,
            p,
            Some(out),
            NO_EXTRA,
        )
    }

    /// `residual = (residual + rms_norm(x)) * post_scale`.
    pub(super) fn rms_norm_then_add(
        &self,
        residual: &mut CudaBuffer,
        x: &CudaBuffer,
        weight: Option<&CudaBuffer>,
        p: RmsNormParams,
        post_scale: f32,
    ) -> Result<()> {
        const OP: &str = "rms_norm_add";
        self.norm_checks(OP, x, weight, &p)?;
        whole_len(OP, x, residual, p.parts)?;
        let extra = NormExtra {
            weight2: None,
            post_scale,
        };
        self.launch_norm(
            OP,
            NormMode::NormThenAdd,
            x,
            Some(residual),
            weight,
            p,
            None,
            extra,
        )
    }

    /// `residual = (residual + rms_norm(x, weight)) * post_scale;
    /// next.out = rms_norm(residual, next.weight)`.
    pub(super) fn rms_norm_add_then_norm(
        &self,
        residual: &mut CudaBuffer,
        x: &CudaBuffer,
        weight: Option<&CudaBuffer>,
        p: RmsNormParams,
        post_scale: f32,
        next: NextNorm<'_, CudaBuffer>,
    ) -> Result<()> {
        let (weight2, out) = (next.weight, next.out);
        const OP: &str = "rms_norm_add_norm";
        self.norm_checks(OP, x, weight, &p)?;
        self.norm_checks(OP, x, weight2, &p)?;
        whole_len(OP, x, residual, p.parts)?;
        whole_len(OP, x, out, p.parts)?;
        let extra = NormExtra {
            weight2,
            post_scale,
        };
        self.launch_norm(
            OP,
            NormMode::NormAddNorm,
            x,
            Some(residual),
            weight,
            p,
            Some(out),
            extra,
        )
    }

    pub(super) fn rope_impl(
        &self,
        x: &mut CudaBuffer,
        positions: &[u32],
        inv_freq: &CudaBuffer,
        p: RopeParams,
    ) -> Result<()> {
        const OP: &str = "rope";
        ensure(p.head_dim > 0 && p.head_dim.is_multiple_of(2), OP, || {
            format!("head_dim {} must be even", p.head_dim)
        })?;
        ensure(
            x.len() == positions.len() * p.n_heads * p.head_dim,
            OP,
            || {
                format!(
                    "x has {}, want {} tokens x {} heads x {}",
                    x.len(),
                    positions.len(),
                    p.n_heads,
                    p.head_dim
                )
            },
        )?;
        ensure(inv_freq.len() == p.head_dim / 2, OP, || {
            format!("inv_freq has {}, want {}", inv_freq.len(), p.head_dim / 2)
        })?;
        if positions.is_empty() {
            return Ok(());
        }
        let pos = self.to_device(positions)?;
        self.rope_dev(x, positions.len(), &pos, inv_freq, p)
    }

    /// RoPE with the positions already on the device (`n_tokens` of them); shapes are the
    /// caller's to check against `positions`.
    pub(super) fn rope_dev(
        &self,
        x: &mut CudaBuffer,
        n_tokens: usize,
        pos: &cudarc::driver::CudaSlice<u32>,
        inv_freq: &CudaBuffer,
        p: RopeParams,
    ) -> Result<()> {
        const OP: &str = "rope";
        ensure(
            x.len() == n_tokens * p.n_heads * p.head_dim && inv_freq.len() == p.head_dim / 2,
            OP,
            || {
                format!(
                    "x has {}, want {n_tokens} tokens x {} heads x {}",
                    x.len(),
                    p.n_heads,
                    p.head_dim
                )
            },
        )?;
        let freqs = inv_freq.f32s(OP)?;
        let xs = x.f32s_mut(OP)?;
        let pairs = n_tokens * p.n_heads * p.head_dim / 2;
        if pairs == 0 {
            return Ok(());
        }
        let f = self.kernels.get("rope")?;
        let (tokens, heads, d) = (n_tokens as i32, p.n_heads as i32, p.head_dim as i32);
        let interleaved = i32::from(p.style == RopeStyle::Interleaved);
        let mut l = self.stream.launch_builder(f);
        l.arg(xs)
            .arg(pos)
            .arg(freqs)
            .arg(&tokens)
            .arg(&heads)
            .arg(&d)
            .arg(&interleaved);
        // SAFETY: the arguments match `rope(float*, const u32*, const float*, int, int, int,
        // int)`; x holds n_tokens x heads x head_dim values and inv_freq head_dim / 2
        // (checked above), `pos` n_tokens (the caller's contract); the kernel's grid-stride
        // loop touches only the `pairs` pairs.
        unsafe { l.launch(grid_for(pairs)) }.map_err(device_err(OP))?;
        Ok(())
    }

    /// `out = act(gate) * up`; with `twin`, `out`'s bf16 twin too (a bf16 GEMM reads it).
    pub(super) fn act_mul_impl(
        &self,
        act: Activation,
        gate: &CudaBuffer,
        up: &CudaBuffer,
        out: &mut CudaBuffer,
        twin: bool,
    ) -> Result<()> {
        const OP: &str = "act_mul";
        same_len(OP, gate, up)?;
        same_len(OP, gate, out)?;
        let n = gate.len();
        let (g, u) = (gate.f32s(OP)?, up.f32s(OP)?);
        let (o, ob) = out.f32s_maybe_twin_mut(&self.stream, twin, OP)?;
        if n == 0 {
            return Ok(());
        }
        let (n64, code) = (n as u64, act_code(act));
        let mut l = self.stream.launch_builder(self.kernels.get("act_mul")?);
        l.arg(g).arg(u).arg(o);
        arg_twin(&mut l, ob);
        l.arg(&n64).arg(&code);
        // SAFETY: the arguments match `act_mul(const float*, const float*, float*, u16*, u64,
        // int)` (the twin or a null pointer); gate, up and out (and its twin) hold n values
        // (equal lengths checked above), and the grid-stride loop stops at n.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(OP))?;
        Ok(())
    }

    /// `out = act(gate) * up` over bf16 `gate` and `up` (a bf16 GEMM's outputs); with
    /// `twin`, into `out`'s bf16 twin alone (`CudaBuffer::twin_only_mut`: the MLP's down
    /// projection reads it next, as a bf16 GEMM).
    pub(super) fn act_mul_bf16_in(
        &self,
        act: Activation,
        gate: &CudaSlice<u16>,
        up: &CudaSlice<u16>,
        out: &mut CudaBuffer,
        twin: bool,
    ) -> Result<()> {
        const OP: &str = "act_mul";
        let n = out.len();
        ensure(gate.len() >= n && up.len() >= n, OP, || {
            format!("gate {}, up {}, out {n}", gate.len(), up.len())
        })?;
        if n == 0 {
            return Ok(());
        }
        let (n64, code) = (n as u64, act_code(act));
        let mut l = self
            .stream
            .launch_builder(self.kernels.get("act_mul_bf16_in")?);
        l.arg(gate).arg(up);
        if twin {
            // The bf16 GEMM of the MLP's down projection is the one reader: the f32 values
            // (two thirds of the bytes written) are skipped.
            l.arg(&NULL_PTR).arg(out.twin_only_mut(&self.stream, OP)?);
        } else {
            l.arg(out.f32s_mut(OP)?);
            arg_twin(&mut l, None);
        }
        l.arg(&n64).arg(&code);
        // SAFETY: gate and up hold at least n elements (checked above), out n; all start
        // allocations (16-byte aligned), as the kernel's vector accesses need.
        unsafe { l.launch(grid_for(n.div_ceil(8))) }.map_err(device_err(OP))?;
        Ok(())
    }

    /// [`Self::act_mul_bf16_in`] over one batched GEMM's `[rows, 2, n]` bf16 products, the
    /// gate's first in each row when `gate_first` (else the up's); `n % 8 == 0`.
    pub(super) fn act_mul_bf16_pairs(
        &self,
        act: Activation,
        y: &CudaSlice<u16>,
        (rows, n): (usize, usize),
        gate_first: bool,
        out: &mut CudaBuffer,
        twin: bool,
    ) -> Result<()> {
        const OP: &str = "act_mul";
        const THREADS: usize = 256;
        ensure(
            n.is_multiple_of(8) && y.len() >= rows * 2 * n && out.len() == rows * n,
            OP,
            || {
                format!(
                    "{} products for {rows} pairs of {n}, out {}",
                    y.len(),
                    out.len()
                )
            },
        )?;
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let (gate_at, up_at) = if gate_first {
            (0, n as u64)
        } else {
            (n as u64, 0)
        };
        let (n64, code) = (n as u64, act_code(act));
        let mut l = self
            .stream
            .launch_builder(self.kernels.get("act_mul_bf16_pairs")?);
        l.arg(y);
        if twin {
            l.arg(&NULL_PTR).arg(out.twin_only_mut(&self.stream, OP)?);
        } else {
            l.arg(out.f32s_mut(OP)?);
            arg_twin(&mut l, None);
        }
        l.arg(&n64).arg(&gate_at).arg(&up_at).arg(&code);
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(rows).map_err(|_| super::fused::too_big(OP, rows))?,
                (n / 8).div_ceil(THREADS) as u32,
                1,
            ),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: y holds rows x 2n values and out rows x n (checked above); n % 8 == 0 and
        // every buffer starts an allocation, so the kernel's 16-byte vectors align.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }

    pub(super) fn activation_impl(
        &self,
        act: Activation,
        x: &CudaBuffer,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "activation";
        same_len(OP, x, out)?;
        let n = x.len();
        let (xs, o) = (x.f32s(OP)?, out.f32s_mut(OP)?);
        if n == 0 {
            return Ok(());
        }
        let (n64, code) = (n as u64, act_code(act));
        let mut l = self.stream.launch_builder(self.kernels.get("activation")?);
        l.arg(xs).arg(o).arg(&n64).arg(&code);
        // SAFETY: the arguments match `activation(const float*, float*, u64, int)`; x and
        // out hold n values (equal lengths checked above), and the loop stops at n.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(OP))?;
        Ok(())
    }

    pub(super) fn softcap_impl(&self, x: &mut CudaBuffer, cap: f32) -> Result<()> {
        const OP: &str = "softcap";
        if !(cap > 0.0 && cap.is_finite()) {
            return Err(KernelError::Invalid {
                op: OP,
                detail: format!("cap {cap} must be positive and finite"),
            });
        }
        let n = x.len();
        let xs = x.f32s_mut(OP)?;
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        let mut l = self.stream.launch_builder(self.kernels.get("softcap")?);
        l.arg(xs).arg(&n64).arg(&cap);
        // SAFETY: the arguments match `softcap(float*, u64, float)`; x holds n values and
        // the kernel touches one element per index below n.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(OP))?;
        Ok(())
    }

    /// `add` or `mul`: `acc op= x`.
    pub(super) fn binary_impl(
        &self,
        op: &'static str,
        acc: &mut CudaBuffer,
        x: &CudaBuffer,
    ) -> Result<()> {
        same_len(op, acc, x)?;
        let n = x.len();
        let (a, xs) = (acc.f32s_mut(op)?, x.f32s(op)?);
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        let mut l = self.stream.launch_builder(self.kernels.get(op)?);
        l.arg(a).arg(xs).arg(&n64);
        // SAFETY: the arguments match `add` / `mul(float*, const float*, u64)`; acc and x
        // hold n values (equal lengths checked above), and the loop stops at n.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(op))?;
        Ok(())
    }

    pub(super) fn scale_impl(&self, x: &mut CudaBuffer, s: f32) -> Result<()> {
        const OP: &str = "scale";
        let n = x.len();
        let xs = x.f32s_mut(OP)?;
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        let mut l = self.stream.launch_builder(self.kernels.get("scale")?);
        l.arg(xs).arg(&n64).arg(&s);
        // SAFETY: the arguments match `scale(float*, u64, float)`; x holds n values and the
        // kernel touches one element per index below n.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(OP))?;
        Ok(())
    }

    /// Widens a 16-bit weight buffer into `dst` (f32, same length).
    pub(super) fn widen_into(
        &self,
        src: &CudaBuffer,
        dst: &mut cudarc::driver::CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "widen_to_f32";
        let n = src.len();
        if n == 0 || src.dtype == DType::F32 {
            return Ok(());
        }
        let (code, n64) = (dtype_code(src.dtype), n as u64);
        let mut l = self.stream.launch_builder(self.kernels.get(OP)?);
        arg_any(&mut l, src);
        l.arg(&code).arg(dst).arg(&n64);
        // SAFETY: the arguments match `widen_to_f32(const void*, int, float*, u64)`, the
        // code naming src's dtype; src holds n values and dst at least n (allocated so by
        // the caller), and the loop stops at n.
        unsafe { l.launch(grid_for(n)) }.map_err(device_err(OP))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of a multiple of 4 up to 8 x 1024 values take the vector path (at most NORM_VEC
    /// float4 chunks per thread, no more warps than needed); blocks are whole warps.
    #[test]
    fn norm_threads_keep_rows_in_registers() {
        for dim in [4, 12, 100, 256, 1536, 2560, 4096, 8192] {
            let t = norm_threads(dim) as usize;
            let chunks = dim / 4;
            assert_eq!(t % 32, 0, "dim {dim}");
            assert!(t * NORM_VEC >= chunks, "dim {dim}: {t} threads");
            assert!(
                t == 32 || (t - 32) * NORM_VEC < chunks,
                "dim {dim}: {t} threads is more than needed"
            );
        }
        assert_eq!(norm_threads(1536), 192);
        assert_eq!(norm_threads(2560), 320);
        for dim in [1, 31, 255, 1537, 9001] {
            let t = norm_threads(dim) as usize;
            assert_eq!(t % 32, 0, "dim {dim}");
            assert!((32..=1024).contains(&t), "dim {dim}: {t} threads");
        }
        assert_eq!(
            norm_threads(100_000),
            1024,
            "longer rows loop in a full block"
        );
    }
}
