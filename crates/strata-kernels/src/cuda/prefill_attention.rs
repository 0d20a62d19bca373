//! Long query runs (prefill chunks) on tensor cores: `prefill_attention_mma_d<head_dim>` in
//! `kernels/paged_mma.cu` (head_dim 64, 128, 256 or 512), for bf16 slabs in the bf16 mode,
//! and `prefill_attention_mma_{fp8,int8}_d<head_dim>` for the 8-bit per-token-head slabs.
//! A block takes 128 or 64 query rows (a run of tokens times one KV head's query group), so
//! each key crosses from L2 once per block, and the causal and window masks are applied per
//! row inside the kernel: no gathered K / V copies, no score matrix in memory, no masked
//! tiles past the diagonal.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg};

use super::buffer::twin_at;
use super::paged::{CudaKvSlab, MAX_SPLITS};
use super::paged_mma::{self, PREFILL_THREADS};
use super::{device_err, CudaBackend};
use crate::error::ensure;
use crate::{AttentionParams, KernelError, KvFormat, PagedSeq, Result};

/// A split takes at least this many keys (two 64-key or four 32-key tiles).
const MIN_SPLIT_KEYS: usize = 128;

/// Sequences one launch of `prefill_attention_mma_seqs_d<D>` takes (`PF_MAX_RUNS`).
pub(super) const MAX_RUNS: usize = 32;

/// The sequences of one launch and their first blocks, passed by value (`PrefillRuns` in
/// `kernels/paged_mma.cu`: the same fields in the same order).
#[repr(C)]
#[derive(Clone, Copy)]
struct PrefillRuns {
    n: i32,
    seq: [i32; MAX_RUNS],
    first: [i32; MAX_RUNS + 1],
}

// SAFETY: plain integers in C layout, as the kernel declares them.
unsafe impl DeviceRepr for PrefillRuns {}

/// Tokens a block takes: as many as fill its `rows` with whole query groups.
pub(super) fn tokens_per_block(rows: usize, group: usize) -> usize {
    (rows / group.max(1)).max(1)
}

/// The prefill kernel for `p`'s head_dim over a `format` slab and the tokens each of its
/// blocks takes.
fn prefill_kernel(
    op: &'static str,
    p: &AttentionParams,
    format: KvFormat,
) -> Result<(paged_mma::PrefillShape, usize)> {
    let d = p.head_dim;
    let shape = paged_mma::prefill_shape(d, format).ok_or_else(|| KernelError::Invalid {
        op,
        detail: format!("no prefill kernel for head_dim {d} over {format:?}"),
    })?;
    let tpb = tokens_per_block(shape.rows, p.n_heads / p.n_kv_heads);
    Ok((shape, tpb))
}

/// What both prefill launchers pass the same way, in the kernels' order: the split
/// workspace and the scalars between the output and each launcher's own arguments.
struct SplitArgs {
    ws_acc: CudaSlice<f32>,
    ws_ml: CudaSlice<f32>,
    heads: [i32; 2],
    scale: f32,
    window: i64,
    has_cap: i32,
    cap: f32,
    splits: i32,
    stages: i32,
    /// The grid's `blocks` x KV heads x splits, and the shared memory granted at start-up.
    cfg: LaunchConfig,
}

impl SplitArgs {
    fn push<'a>(&'a mut self, l: &mut LaunchArgs<'a>) {
        l.arg(&mut self.ws_acc)
            .arg(&mut self.ws_ml)
            .arg(&self.heads[0])
            .arg(&self.heads[1])
            .arg(&self.scale)
            .arg(&self.window)
            .arg(&self.has_cap)
            .arg(&self.cap)
            .arg(&self.splits)
            .arg(&self.stages);
    }
}

impl CudaBackend {
    /// The split workspace for `rows` query rows' (task, split) parts (nothing to hold
    /// with one split) and the scalars of a launch of `blocks` blocks a KV head.
    fn split_args(
        &self,
        p: &AttentionParams,
        format: KvFormat,
        rows: usize,
        splits: usize,
        blocks: usize,
    ) -> Result<SplitArgs> {
        let d = p.head_dim;
        let (ws_len, ml_len) = if splits > 1 {
            let tasks = rows * p.n_heads;
            (tasks * splits * d, tasks * splits * 2)
        } else {
            (1, 1)
        };
        let err = device_err("allocating prefill attention workspace");
        // SAFETY: every (task, split) part the launch covers is written by its kernel
        // before the combine reads it (rows without keys in a split write a zero sum).
        let (ws_acc, ws_ml) = unsafe {
            (
                self.stream.alloc::<f32>(ws_len).map_err(&err)?,
                self.stream.alloc::<f32>(ml_len).map_err(&err)?,
            )
        };
        let stages = self.paged_mma.prefill_stages(d, format);
        let smem = paged_mma::prefill_smem_bytes(d, format, stages).unwrap_or(0);
        Ok(SplitArgs {
            ws_acc,
            ws_ml,
            heads: [p.n_heads, p.n_kv_heads].map(|v| v as i32),
            scale: p.scale,
            window: p
                .window
                .map_or(-1, |w| i64::try_from(w).unwrap_or(i64::MAX)),
            has_cap: i32::from(p.softcap.is_some()),
            cap: p.softcap.unwrap_or(1.0),
            splits: splits as i32,
            stages: stages as i32,
            cfg: LaunchConfig {
                grid_dim: (blocks as u32, p.n_kv_heads as u32, splits as u32),
                block_dim: (PREFILL_THREADS, 1, 1),
                shared_mem_bytes: smem as u32,
            },
        })
    }
}

impl CudaBackend {
    /// Attends `seq`'s query rows of `q` into `out` (both `[rows, n_heads, d]` f32) over the
    /// keys its slots name, and into `out`'s bf16 twin at device address `twin` unless 0
    /// (same layout); the caller checked `MmaSupport::prefill_applies`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prefill_attention(
        &self,
        q: &CudaSlice<f32>,
        slab: &CudaKvSlab,
        slots: &CudaSlice<u32>,
        seq: &PagedSeq,
        p: AttentionParams,
        out: &mut CudaSlice<f32>,
        twin: u64,
    ) -> Result<()> {
        const OP: &str = "prefill_attention";
        let (d, nh, nkv) = (p.head_dim, p.n_heads, p.n_kv_heads);
        let n_keys = seq.k_len();
        if seq.q_len == 0 || n_keys == 0 {
            return Ok(());
        }
        let rows = seq.q_offset * nh * d..(seq.q_offset + seq.q_len) * nh * d;
        ensure(rows.end <= q.len() && rows.end <= out.len(), OP, || {
            format!("{seq:?} reads past q ({}) or out ({})", q.len(), out.len())
        })?;
        ensure(seq.slot_offset + n_keys <= slots.len(), OP, || {
            format!("{seq:?} reads past the {} slots", slots.len())
        })?;
        let (shape, tpb) = prefill_kernel(OP, &p, slab.shape.format)?;
        let blocks_x = seq.q_len.div_ceil(tpb);
        // Short prompts leave multiprocessors idle (one block each): split the keys.
        let most = n_keys.div_ceil(MIN_SPLIT_KEYS).clamp(1, MAX_SPLITS);
        let splits = paged_mma::wave_splits(blocks_x * nkv, self.sm_count, most);
        let tasks = seq.q_len * nh;
        let mut args = self.split_args(&p, slab.shape.format, seq.q_len, splits, blocks_x)?;
        // The twin's view of the sequence's rows.
        let twin_rows = twin_at(twin, rows.start);
        let qv = q.slice(rows.clone());
        let mut ov = out.slice_mut(rows);
        let sl = slots.slice(seq.slot_offset..seq.slot_offset + n_keys);
        let (q_len, tpb_i) = (seq.q_len as i32, tpb as i32);
        let (q_pos0, k_start) = (seq.q_start as i64, seq.k_start as i64);
        let cfg = args.cfg;
        let mut l = self.stream.launch_builder(self.kernels.get(shape.kernel)?);
        l.arg(&qv);
        slab.push_mma_args(&mut l);
        l.arg(&sl).arg(&mut ov).arg(&twin_rows);
        args.push(&mut l);
        l.arg(&q_len).arg(&q_pos0).arg(&k_start).arg(&tpb_i);
        // SAFETY: q / out views hold the sequence's q_len x n_heads x d values; its n_keys
        // slots are rows of the slab (the pool's invariant, checked on the batch through its
        // slot limit); the workspace holds tasks x splits parts; the shared memory was
        // granted at start-up (`MmaSupport::probe`) and the kernel is the one compiled for d.
        unsafe { l.launch(cfg) }.map_err(device_err(shape.kernel))?;
        if splits > 1 {
            self.combine_splits(
                &args.ws_acc.slice(..),
                &args.ws_ml.slice(..),
                &mut ov,
                twin_rows,
                tasks,
                d,
                splits,
            )?;
        }
        Ok(())
    }
}

impl CudaBackend {
    /// Attends several sequences' query rows in one launch: `runs` are (index in the batch's
    /// packed table `seqs`, the sequence), at most `MAX_RUNS`, in row order. A launch per
    /// sequence leaves most of the GPU idle for a short prompt and splits its keys with a
    /// combine each; together the prompts of a step fill it (`docs/perf-notes.md`, "Prompts
    /// of a step in one attention launch"). Same results as `prefill_attention` per sequence
    /// at the same split count.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prefill_attention_seqs(
        &self,
        q: &CudaSlice<f32>,
        slab: &CudaKvSlab,
        seqs: &CudaSlice<u32>,
        slots: &CudaSlice<u32>,
        runs: &[(usize, PagedSeq)],
        p: AttentionParams,
        out: &mut CudaSlice<f32>,
        twin: u64,
    ) -> Result<()> {
        const OP: &str = "prefill_attention_seqs";
        let (d, nh, nkv) = (p.head_dim, p.n_heads, p.n_kv_heads);
        ensure(!runs.is_empty() && runs.len() <= MAX_RUNS, OP, || {
            format!("{} sequences (1 to {MAX_RUNS} a launch)", runs.len())
        })?;
        let (shape, tpb) = prefill_kernel(OP, &p, slab.shape.format)?;
        let mut table = PrefillRuns {
            n: runs.len() as i32,
            seq: [0; MAX_RUNS],
            first: [0; MAX_RUNS + 1],
        };
        let mut blocks = 0usize;
        let mut most_keys = 0usize;
        for (i, (index, seq)) in runs.iter().enumerate() {
            ensure(seq.q_len > 0 && seq.k_len() > 0, OP, || {
                format!("{seq:?} has no query rows or no keys")
            })?;
            ensure(
                (seq.q_offset + seq.q_len) * nh * d <= q.len().min(out.len()),
                OP,
                || format!("{seq:?} reads past q ({}) or out ({})", q.len(), out.len()),
            )?;
            ensure(seq.slot_offset + seq.k_len() <= slots.len(), OP, || {
                format!("{seq:?} reads past the {} slots", slots.len())
            })?;
            ensure(
                i == 0 || runs[i - 1].1.q_offset + runs[i - 1].1.q_len <= seq.q_offset,
                OP,
                || "sequences out of row order".into(),
            )?;
            table.seq[i] = i32::try_from(*index).map_err(|_| KernelError::Invalid {
                op: OP,
                detail: format!("sequence index {index}"),
            })?;
            table.first[i] = blocks as i32;
            blocks += seq.q_len.div_ceil(tpb);
            most_keys = most_keys.max(seq.k_len());
        }
        table.first[runs.len()] = i32::try_from(blocks).map_err(|_| KernelError::Invalid {
            op: OP,
            detail: format!("{blocks} blocks"),
        })?;
        let most = most_keys.div_ceil(MIN_SPLIT_KEYS).clamp(1, MAX_SPLITS);
        let splits = paged_mma::wave_splits(blocks * nkv, self.sm_count, most);
        // The split workspace covers the rows from the first sequence's to the last's end;
        // the rows between runs are neither written nor combined.
        let row_base = runs[0].1.q_offset;
        let last = &runs[runs.len() - 1].1;
        let span = last.q_offset + last.q_len - row_base;
        let mut args = self.split_args(&p, slab.shape.format, span, splits, blocks)?;
        let tpb_i = tpb as i32;
        let base = row_base as i64;
        let cfg = args.cfg;
        let mut l = self
            .stream
            .launch_builder(self.kernels.get(shape.seqs_kernel)?);
        l.arg(q);
        slab.push_mma_args(&mut l);
        l.arg(slots).arg(seqs).arg(&mut *out).arg(&twin);
        args.push(&mut l);
        l.arg(&tpb_i).arg(&base).arg(&table);
        // SAFETY: each run's rows lie inside q and out and its keys' slots inside `slots`
        // (checked above against the host copy of the packed table the kernel reads); the
        // workspace holds every run row's parts; shared memory as in `prefill_attention`.
        unsafe { l.launch(cfg) }.map_err(device_err(shape.seqs_kernel))?;
        if splits > 1 {
            // One combine per stretch of adjacent sequences' rows.
            let mut i = 0;
            while i < runs.len() {
                let start = runs[i].1.q_offset;
                let mut end = start + runs[i].1.q_len;
                i += 1;
                while i < runs.len() && runs[i].1.q_offset == end {
                    end += runs[i].1.q_len;
                    i += 1;
                }
                let parts = (start - row_base) * nh * splits;
                let twin_rows = twin_at(twin, start * nh * d);
                self.combine_splits(
                    &args.ws_acc.slice(parts * d..),
                    &args.ws_ml.slice(parts * 2..),
                    &mut out.slice_mut(start * nh * d..end * nh * d),
                    twin_rows,
                    (end - start) * nh,
                    d,
                    splits,
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_hold_whole_query_groups() {
        let rows = |d| paged_mma::prefill_shape(d, KvFormat::Bf16).map(|s| s.rows);
        let (narrow, wide) = (rows(256).unwrap(), rows(512).unwrap());
        assert_eq!(rows(128), Some(128));
        assert_eq!(rows(320), None);
        assert_eq!((narrow, wide), (128, 64));
        assert_eq!(
            tokens_per_block(narrow, 8),
            16,
            "E2B sliding: 16 tokens x 8 heads"
        );
        assert_eq!(tokens_per_block(wide, 8), 8, "E2B full: 8 tokens x 8 heads");
        assert_eq!(tokens_per_block(wide, 4), 16, "E4B full");
        assert_eq!(tokens_per_block(narrow, 1), 128);
        assert_eq!(tokens_per_block(wide, 6), 10, "rows past 60 stay empty");
        assert_eq!(tokens_per_block(wide, 64), 1);
        // The 8-bit slabs' kernels cut the work the same way.
        for f in [KvFormat::Fp8E4m3PerTokenHead, KvFormat::Int8PerTokenHead] {
            for d in [64, 128, 256, 512] {
                let s = paged_mma::prefill_shape(d, f).unwrap();
                assert_eq!(Some(s.rows), rows(d));
                assert!(s.kernel.contains(if f == KvFormat::Int8PerTokenHead {
                    "_int8_"
                } else {
                    "_fp8_"
                }));
            }
        }
        assert_eq!(paged_mma::prefill_shape(256, KvFormat::F32), None);
        assert_eq!(paged_mma::prefill_shape(256, KvFormat::F16), None);
    }
}
