//! Launchers for the fused decode kernels: the bf16 GEMV (`kernels/gemv.cu`), the per-head
//! norm + RoPE (with the K/V store of a KV-owning layer) and the gated slice product. Each
//! replaces a chain of the small kernels in `ops.rs` whose launches, not their bytes,
//! dominated a decode step.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::buffer::{dtype_code, CudaBuffer, Storage};
use super::matmul_path::{Form, MatmulPath};
use super::sources::GEMV_KERNELS;
use super::{device_err, CudaBackend, CudaIndex, CudaKvSlab};
use crate::error::ensure;
use crate::{
    Activation, DType, DeviceBuffer, KernelError, KvFormat, MatmulShape, Result, RmsNormParams,
    RopeAt, RopeParams, RopeStyle, TableSlice,
};

/// Rows of x up to which a bf16 matmul runs as a GEMV (one kernel per row count, plain,
/// gated and sliced).
pub(super) const GEMV_MAX_ROWS: usize = GEMV_KERNELS.len() / 3;

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

/// Weights one GEMV launch reads (`GemvMats` in `gemv.cu`, same layout).
pub(super) const GEMV_MAX_MATS: usize = 3;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GemvMats {
    w: [u64; GEMV_MAX_MATS],
    y: [u64; GEMV_MAX_MATS],
    n: [i32; GEMV_MAX_MATS],
    /// Feature groups in matrices `0..=m`; unused slots repeat the last matrix and its end.
    group_end: [i32; GEMV_MAX_MATS],
}

// SAFETY: plain integers in the kernel parameter's C layout (`GemvMats` in `gemv.cu`).
unsafe impl cudarc::driver::DeviceRepr for GemvMats {}

/// `GemvSlice` in `gemv.cu`, same layout: the table a slice-form GEMV multiplies by.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct GemvSlice {
    pub(super) table: u64,
    pub(super) offset: u64,
    pub(super) stride: u64,
}

// SAFETY: plain integers in the kernel parameter's C layout.
unsafe impl cudarc::driver::DeviceRepr for GemvSlice {}

/// What a GEMV launch writes (the kernel's `MODE`).
#[derive(Clone, Copy)]
pub(super) enum GemvOut {
    /// The products.
    Plain,
    /// `act(gate) * up` of an MLP's two matrices.
    Gated(Activation),
    /// `act(product) * table[t * stride + offset + i]`.
    Slice(Activation, GemvSlice),
}

/// One tensor of a `head_norm_rope` launch: its per-head norm weight (none: scale-free),
/// head count and whether RoPE follows the norm.
pub(super) struct HeadSeg<'a> {
    pub(super) x: &'a mut CudaBuffer,
    pub(super) weight: Option<&'a CudaBuffer>,
    pub(super) n_heads: usize,
    pub(super) rope: bool,
}

/// Where a `head_norm_rope` launch also writes its k and v segments: a bf16 slab's two
/// arrays, each token's row at its slot (what `kv_store_bf16` does after it otherwise).
pub(super) struct SlabRows<'a> {
    pub(super) slots: &'a CudaSlice<u32>,
    pub(super) k: &'a mut CudaSlice<u8>,
    pub(super) v: &'a mut CudaSlice<u8>,
}

/// What a `head_norm_rope` launch does besides its segments' norm and rotation.
pub(super) enum SegsExtra<'a> {
    Nothing,
    /// Also stores k and v into a bf16 slab (three segments).
    Store(SlabRows<'a>),
    /// Segment 0's input is a product in `parts` parts `[tokens, parts, heads * head_dim]`,
    /// its `x` the output (`head_norm_rope_parts_f32_d<D>`).
    FromParts(&'a CudaSlice<f32>, usize),
}

/// `HeadSegs` in `kernels/rope.cu`, same layout; unused slots have no heads, so no block
/// touches them.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct HeadSegs {
    x: [u64; 3],
    w: [u64; 3],
    w_dtype: [i32; 3],
    n_heads: [i32; 3],
    rope: [i32; 3],
}

// SAFETY: plain integers in the kernel parameter's C layout.
unsafe impl cudarc::driver::DeviceRepr for HeadSegs {}

/// One weight of a GEMV launch: its device address, output features and output address.
#[derive(Clone, Copy)]
pub(super) struct GemvMat {
    pub(super) w: u64,
    pub(super) n: usize,
    pub(super) y: u64,
}

/// The device address of a weight buffer (any dtype).
pub(super) fn buffer_ptr(b: &CudaBackend, w: &CudaBuffer) -> u64 {
    use cudarc::driver::DevicePtr;
    match &w.storage {
        Storage::Bits16(s) => s.device_ptr(&b.stream).0,
        Storage::F32(s) => s.device_ptr(&b.stream).0,
    }
}

/// The device address of an f32 activation buffer `op` writes.
pub(super) fn f32_ptr_mut(b: &CudaBackend, out: &mut CudaBuffer, op: &'static str) -> Result<u64> {
    use cudarc::driver::DevicePtrMut;
    Ok(out.f32s_mut(op)?.device_ptr_mut(&b.stream).0)
}

/// The device addresses of an f32 activation `op` writes and of its bf16 twin, which the
/// kernel writes too when `twin` is set (0 otherwise).
pub(super) fn f32_and_twin_ptrs_mut(
    b: &CudaBackend,
    out: &mut CudaBuffer,
    twin: bool,
    op: &'static str,
) -> Result<(u64, u64)> {
    use cudarc::driver::DevicePtrMut;
    let (y, mut yb) = out.f32s_maybe_twin_mut(&b.stream, twin, op)?;
    let y = y.device_ptr_mut(&b.stream).0;
    Ok((y, super::buffer::twin_addr(&b.stream, &mut yb)))
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
        let y = f32_ptr_mut(self, out, "matmul (gemv)")?;
        let mat = GemvMat {
            w: buffer_ptr(self, w),
            n,
            y,
        };
        self.gemv_launch(xs, t, k, &[mat], GemvOut::Plain)
    }

    /// One GEMV launch over `mats` (1 to 3 bf16 weights `[n_i, k]` sharing x `[t, k]`), or,
    /// gated, over an MLP's gate and up (`mats[0]`, `mats[1]`, one shape) writing
    /// `act(gate) * up` to `mats[0].y`, or, sliced, over one matrix whose activated
    /// products are multiplied by a table slice. Callers check the shapes (and the slice's
    /// reach) and `k % 8 == 0`.
    pub(super) fn gemv_launch(
        &self,
        xs: &CudaSlice<f32>,
        t: usize,
        k: usize,
        mats: &[GemvMat],
        mode: GemvOut,
    ) -> Result<()> {
        const OP: &str = "matmul (gemv)";
        let (family, act, wants) = match mode {
            GemvOut::Plain => (0, None, None),
            GemvOut::Gated(a) => (1, Some(a), Some(2)),
            GemvOut::Slice(a, _) => (2, Some(a), Some(1)),
        };
        let gated = matches!(mode, GemvOut::Gated(_));
        ensure(
            !mats.is_empty()
                && mats.len() <= GEMV_MAX_MATS
                && wants.is_none_or(|w| mats.len() == w),
            OP,
            || format!("{} weights in one launch", mats.len()),
        )?;
        let per_warp = GEMV_FEATURES_PER_WARP[t - 1] as usize;
        let mut p = GemvMats::default();
        let mut groups = 0usize;
        for slot in 0..GEMV_MAX_MATS {
            let m = mats[slot.min(mats.len() - 1)];
            // A gated launch's groups are the gate's features; the up rows ride along.
            if slot < mats.len() && (!gated || slot == 0) {
                groups += m.n.div_ceil(per_warp);
            }
            p.w[slot] = m.w;
            p.y[slot] = m.y;
            p.n[slot] = i32::try_from(m.n).map_err(|_| too_big(OP, m.n))?;
            p.group_end[slot] = i32::try_from(groups).map_err(|_| too_big(OP, groups))?;
        }
        if groups == 0 {
            return Ok(());
        }
        let k_i = i32::try_from(k).map_err(|_| too_big(OP, k))?;
        let split = gemv_split(groups * per_warp, per_warp, k);
        let split_i = split as i32;
        let act = act.map_or(0, super::ops::act_code);
        let name = GEMV_KERNELS[t - 1 + family * GEMV_MAX_ROWS];
        let f = self.kernels.get(name)?;
        let cfg = LaunchConfig {
            grid_dim: ((groups as u32).div_ceil(GEMV_WARPS / split), 1, 1),
            block_dim: (32 * GEMV_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = self.stream.launch_builder(f);
        l.arg(xs).arg(&p).arg(&k_i).arg(&split_i);
        match &mode {
            GemvOut::Plain => {}
            GemvOut::Gated(_) => {
                l.arg(&act);
            }
            GemvOut::Slice(_, s) => {
                l.arg(&act).arg(s);
            }
        }
        // SAFETY: x holds t*k, each W n_i*k and each output t*n_i elements (checked by the
        // callers; a slice's table reaches every row it is read at); k is a multiple of 8
        // and every buffer starts an allocation, so the 16-byte loads align.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }

    /// [`crate::Backend::qkv_norm_rope_idx`], and with `store` then
    /// [`crate::Backend::kv_store`] of k and v: in the same launch where the slab is bf16
    /// and the head_dim has a register path, else by `kv_store` after it.
    pub(super) fn qkv_norm_rope_impl(
        &self,
        [q, k, v]: [&mut CudaBuffer; 3],
        norms: [&CudaBuffer; 2],
        positions: &CudaIndex,
        inv_freq: &CudaBuffer,
        p: crate::QkvPrep,
        store: Option<(&mut CudaKvSlab, &CudaIndex)>,
    ) -> Result<()> {
        let n = positions.len();
        let mut segs = vec![
            HeadSeg {
                x: &mut *q,
                weight: Some(norms[0]),
                n_heads: p.rope.n_heads,
                rope: true,
            },
            HeadSeg {
                x: &mut *k,
                weight: Some(norms[1]),
                n_heads: p.kv_heads,
                rope: true,
            },
        ];
        if p.v_norm {
            segs.push(HeadSeg {
                x: &mut *v,
                weight: None,
                n_heads: p.kv_heads,
                rope: false,
            });
        }
        let Some((slab, slots)) = store else {
            self.head_norm_rope_segs(
                segs,
                p.norm,
                n,
                positions.data(),
                inv_freq,
                p.rope,
                SegsExtra::Nothing,
            )?;
            return Ok(());
        };
        let s = slab.shape;
        let fits = s.format == KvFormat::Bf16
            && s.num_kv_heads == p.kv_heads
            && s.head_dim == p.rope.head_dim
            && slots.len() == n;
        let extra = if fits {
            SegsExtra::Store(SlabRows {
                slots: slots.data(),
                k: &mut slab.k,
                v: &mut slab.v,
            })
        } else {
            SegsExtra::Nothing
        };
        let stored =
            self.head_norm_rope_segs(segs, p.norm, n, positions.data(), inv_freq, p.rope, extra)?;
        if !stored {
            self.kv_store_impl(slab, k, v, slots)?;
        }
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
        let seg = HeadSeg {
            x,
            weight,
            n_heads: rope.n_heads,
            rope: true,
        };
        let extra = SegsExtra::Nothing;
        self.head_norm_rope_segs(vec![seg], norm, n_tokens, pos, inv_freq, rope, extra)?;
        Ok(())
    }

    /// [`crate::Backend::head_norm_rope_parts_idx`]: one launch that adds the parts as it
    /// loads them where the register path's f32 case applies, else the composed ops.
    pub(super) fn head_norm_rope_parts_impl(
        &self,
        x: &CudaBuffer,
        out: &mut CudaBuffer,
        weight: Option<&CudaBuffer>,
        norm: RmsNormParams,
        at: RopeAt<'_, Self>,
        rope: RopeParams,
    ) -> Result<()> {
        const OP: &str = "head_norm_rope_parts";
        let (n, parts, inv_freq) = (at.positions.len(), norm.parts, at.inv_freq);
        ensure(
            parts > 0 && x.len() == n * parts * rope.n_heads * rope.head_dim,
            OP,
            || format!("{} values in {parts} parts for {n} tokens", x.len()),
        )?;
        let seg = HeadSeg {
            x: &mut *out,
            weight,
            n_heads: rope.n_heads,
            rope: true,
        };
        let extra = SegsExtra::FromParts(x.f32s(OP)?, parts);
        let pos = at.positions.data();
        if self.head_norm_rope_segs(vec![seg], norm.whole(), n, pos, inv_freq, rope, extra)? {
            return Ok(());
        }
        crate::backend::head_norm_rope_parts_composed(self, x, out, weight, norm, at, rope)
    }

    /// `kernels/rope.cu`'s `head_norm_rope` over up to three tensors of `n_tokens` tokens
    /// (one launch); `rope` gives the head_dim and style, each segment its head count.
    /// With `store`, three segments (q, k, v) and the register path's f32 case, the same
    /// launch writes k and v into the slab (`head_norm_rope_store_f32_d<D>`) and this
    /// returns true; false means nothing was stored (the caller stores). With parts (one
    /// segment and that case), likewise true; false means nothing ran.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn head_norm_rope_segs(
        &self,
        segs: Vec<HeadSeg<'_>>,
        norm: RmsNormParams,
        n_tokens: usize,
        pos: &CudaSlice<u32>,
        inv_freq: &CudaBuffer,
        rope: RopeParams,
        extra: SegsExtra<'_>,
    ) -> Result<bool> {
        const OP: &str = "head_norm_rope";
        let d = rope.head_dim;
        ensure(
            norm.dim == d && d > 0 && !segs.is_empty() && segs.len() <= 3,
            OP,
            || {
                format!(
                    "{} tensors, head_dim {d}, norm dim {}",
                    segs.len(),
                    norm.dim
                )
            },
        )?;
        ensure(inv_freq.len() == d / 2, OP, || {
            format!("{} frequencies for head_dim {d}", inv_freq.len())
        })?;
        let mut p = HeadSegs::default();
        let mut max_rows = 0;
        let count = segs.len() as u32;
        let f32_weights = segs
            .iter()
            .all(|seg| seg.weight.is_none_or(|w| w.dtype == DType::F32));
        for (i, seg) in segs.into_iter().enumerate() {
            ensure(seg.x.len() == n_tokens * seg.n_heads * d, OP, || {
                format!(
                    "x has {}, want {n_tokens} tokens x {} heads x {d}",
                    seg.x.len(),
                    seg.n_heads
                )
            })?;
            if let Some(w) = seg.weight {
                ensure(w.len() == d, OP, || {
                    format!("weight has {} elements, head_dim is {d}", w.len())
                })?;
                p.w[i] = buffer_ptr(self, w);
            }
            p.w_dtype[i] = seg.weight.map_or(-1, |w| dtype_code(w.dtype));
            p.x[i] = f32_ptr_mut(self, seg.x, OP)?;
            p.n_heads[i] = i32::try_from(seg.n_heads).map_err(|_| too_big(OP, seg.n_heads))?;
            p.rope[i] = i32::from(seg.rope);
            max_rows = max_rows.max(n_tokens * seg.n_heads);
        }
        if max_rows == 0 {
            return Ok(false);
        }
        let freqs = inv_freq.f32s(OP)?;
        let (tokens_i, d_i) = (
            i32::try_from(n_tokens).map_err(|_| too_big(OP, n_tokens))?,
            d as i32,
        );
        let interleaved = i32::from(rope.style == RopeStyle::Interleaved);
        // The register path's entry point for this head_dim (the model's case, f32 weights
        // and the half-split rotation, on one of its own), else the strided loops.
        let typed = f32_weights && rope.style != RopeStyle::Interleaved;
        let registers = matches!(d, 64 | 128 | 256 | 512);
        let (store, from_parts) = match extra {
            SegsExtra::Nothing => (None, None),
            SegsExtra::Store(rows) => (
                Some(rows).filter(|_| typed && count == 3 && registers),
                None,
            ),
            SegsExtra::FromParts(xs, parts) => {
                if !(typed && count == 1 && registers) {
                    return Ok(false);
                }
                let parts = i32::try_from(parts).map_err(|_| too_big(OP, parts))?;
                (None, Some((xs, parts)))
            }
        };
        let name = match (d, typed, store.is_some()) {
            (64, _, _) if from_parts.is_some() => "head_norm_rope_parts_f32_d64",
            (128, _, _) if from_parts.is_some() => "head_norm_rope_parts_f32_d128",
            (256, _, _) if from_parts.is_some() => "head_norm_rope_parts_f32_d256",
            (512, _, _) if from_parts.is_some() => "head_norm_rope_parts_f32_d512",
            (64, _, true) => "head_norm_rope_store_f32_d64",
            (128, _, true) => "head_norm_rope_store_f32_d128",
            (256, _, true) => "head_norm_rope_store_f32_d256",
            (512, _, true) => "head_norm_rope_store_f32_d512",
            (64, true, _) => "head_norm_rope_f32_d64",
            (128, true, _) => "head_norm_rope_f32_d128",
            (256, true, _) => "head_norm_rope_f32_d256",
            (512, true, _) => "head_norm_rope_f32_d512",
            (64, false, _) => "head_norm_rope_d64",
            (128, false, _) => "head_norm_rope_d128",
            (256, false, _) => "head_norm_rope_d256",
            (512, false, _) => "head_norm_rope_d512",
            _ => "head_norm_rope",
        };
        let f = self.kernels.get(name)?;
        let mut l = self.stream.launch_builder(f);
        l.arg(&p)
            .arg(pos)
            .arg(freqs)
            .arg(&norm.weight_offset)
            .arg(&norm.eps)
            .arg(&tokens_i)
            .arg(&d_i)
            .arg(&interleaved);
        let done = store.is_some() || from_parts.is_some();
        if let Some(st) = store {
            l.arg(st.slots).arg(st.k).arg(st.v);
        }
        if let Some((xs, parts)) = &from_parts {
            l.arg(*xs).arg(parts);
        }
        const WARPS: u32 = 8;
        let cfg = LaunchConfig {
            grid_dim: ((max_rows as u32).div_ceil(WARPS), count, 1),
            block_dim: (32 * WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: each tensor holds n_tokens x its heads x head_dim, positions n_tokens,
        // inv_freq head_dim / 2 and each weight head_dim elements (checked above and by
        // the caller); with a store, the caller's slab holds a bf16 row of head_dim for
        // every (slot, KV head) and the slots one a token; with parts, the input holds
        // parts x the output's values (checked by the caller).
        unsafe { l.launch(cfg) }.map_err(device_err(name))?;
        Ok(done)
    }

    /// [`crate::Backend::gated_slice_matmul`]: one GEMV launch for few rows of bf16
    /// weights (the product stays in registers), else the product and `act_mul_slice`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gated_slice_matmul_impl(
        &self,
        act: Activation,
        x: &CudaBuffer,
        gate: &CudaBuffer,
        shape: MatmulShape,
        table: &CudaBuffer,
        s: TableSlice,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "gated_slice_matmul";
        let (k, n) = (shape.in_features, shape.out_features);
        let t = x.len().checked_div(k).unwrap_or(0);
        ensure(
            s.cols == n && x.len() == t * k && gate.len() == n * k,
            OP,
            || {
                format!(
                    "x of {}, gate of {} for {n} x {k}, slice of {} columns",
                    x.len(),
                    gate.len(),
                    s.cols
                )
            },
        )?;
        let rows = slice_rows(OP, out.len(), out.len(), table.len(), s)?;
        // The kernels read the table as f32.
        table.f32s(OP)?;
        let slice = GemvSlice {
            table: buffer_ptr(self, table),
            offset: s.offset as u64,
            stride: s.stride as u64,
        };
        let bf16 = gate.dtype() == DType::BF16;
        let path = self.matmul_path(Form::Slice, bf16, (t, k, n));
        if path == MatmulPath::SmallGemm {
            let xb = self.bf16_operand(x, t * k)?;
            // The per-layer-input projection reads `out` next.
            let (y, yb) = f32_and_twin_ptrs_mut(self, out, self.gemm_reads_bf16(rows), OP)?;
            let mode = super::small_gemm::SmallOut::Slice(act, slice);
            return self.small_gemm_launch(&xb, buffer_ptr(self, gate), (t, k, n), y, yb, mode);
        }
        if path == MatmulPath::Skinny {
            let xb = self.bf16_operand(x, t * k)?;
            // The per-layer-input projection reads `out` next.
            let (y, yb) = f32_and_twin_ptrs_mut(self, out, self.gemm_reads_bf16(rows), OP)?;
            let mat = super::skinny_gemm::SkinnyMat {
                w: buffer_ptr(self, gate),
                n,
                y,
                yb,
            };
            return self.skinny_launch(&xb, t, k, &[mat], GemvOut::Slice(act, slice));
        }
        if path == MatmulPath::Separate {
            let mut g = self.scratch_impl(out.len(), crate::Backend::activation_dtype(self))?;
            self.matmul_impl(x, gate, shape, &mut g)?;
            return self.act_mul_slice_impl(act, &g, table, s, out);
        }
        let y = f32_ptr_mut(self, out, OP)?;
        let mat = GemvMat {
            w: buffer_ptr(self, gate),
            n,
            y,
        };
        self.gemv_launch(x.f32s(OP)?, t, k, &[mat], GemvOut::Slice(act, slice))
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
        let rows = slice_rows(OP, n, out.len(), table.len(), s)?;
        if n == 0 {
            return Ok(());
        }
        let (g, tb) = (gate.f32s(OP)?, table.f32s(OP)?);
        let (o, ob) = out.f32s_maybe_twin_mut(&self.stream, self.gemm_reads_bf16(rows), OP)?;
        let (cols, offset, stride) = (s.cols as u64, s.offset as u64, s.stride as u64);
        // One entry point per activation; a block per row and 256 columns.
        let name = match act {
            Activation::GeluTanh => "act_mul_slice_gelu_tanh",
            Activation::Silu => "act_mul_slice_silu",
            Activation::Sigmoid => "act_mul_slice_sigmoid",
        };
        let mut l = self.stream.launch_builder(self.kernels.get(name)?);
        l.arg(g).arg(tb).arg(o);
        super::buffer::arg_twin(&mut l, ob);
        l.arg(&cols).arg(&offset).arg(&stride);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, s.cols.div_ceil(256) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: gate and out hold rows x cols values and the slice reaches only table rows
        // that exist (checked above); the grid covers exactly those rows and columns.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }
}

/// Rows of a gated slice product of `n` values into `out_len`, after checking the shapes
/// and that the slice stays inside the table's rows.
fn slice_rows(
    op: &'static str,
    n: usize,
    out_len: usize,
    table_len: usize,
    s: TableSlice,
) -> Result<usize> {
    ensure(
        out_len == n && s.cols > 0 && n.is_multiple_of(s.cols),
        op,
        || format!("gate of {n}, out of {out_len}, slice of {} columns", s.cols),
    )?;
    let rows = n / s.cols;
    let needed = if rows == 0 {
        0
    } else {
        (rows - 1) * s.stride + s.offset + s.cols
    };
    ensure(
        s.offset + s.cols <= s.stride && needed <= table_len,
        op,
        || {
            format!(
                "slice {}..{} of rows of {} beyond a table of {table_len}",
                s.offset,
                s.offset + s.cols,
                s.stride,
            )
        },
    )?;
    Ok(rows)
}

/// The error for a dimension a kernel takes as a 32-bit integer.
pub(super) fn too_big(op: &'static str, v: usize) -> KernelError {
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
}
