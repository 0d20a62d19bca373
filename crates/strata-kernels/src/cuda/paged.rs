//! The paged-KV ops on the GPU (`kernels/paged.cu`): slabs in device memory in the pool's
//! layout, the store kernel (bit-exact with the host encoder) and paged attention with
//! split-K for long keys and few query rows.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::attention_plan::{AttentionCall, AttentionLimits, AttentionPlan, DecodeLaunch};
use super::buffer::{twin_addr, twin_at, CudaBuffer};
use super::{device_err, CudaBackend};
use crate::error::ensure;
use crate::paged::{check_paged, page_slot_runs};
use crate::{
    AttentionParams, DeviceBuffer, KernelError, KvFormat, KvSlabContents, KvSlabShape, PagedSeq,
    Result,
};

/// A slab in device memory.
pub struct CudaKvSlab {
    /// The slab's format, heads, head_dim and slot count.
    pub shape: KvSlabShape,
    pub(super) k: CudaSlice<u8>,
    pub(super) v: CudaSlice<u8>,
    /// At least one element, so slabs without scales still have a pointer to pass.
    k_scales: CudaSlice<f32>,
    v_scales: CudaSlice<f32>,
}

impl CudaKvSlab {
    /// Pushes the slab's four arrays (K, V, K scales, V scales) as kernel arguments.
    pub(super) fn push_args<'a>(&'a self, l: &mut cudarc::driver::LaunchArgs<'a>) {
        l.arg(&self.k)
            .arg(&self.v)
            .arg(&self.k_scales)
            .arg(&self.v_scales);
    }

    /// The slab's arguments as the tensor-core kernels take them: a bf16 slab's codes alone,
    /// an 8-bit slab's codes and scales.
    pub(super) fn push_mma_args<'a>(&'a self, l: &mut cudarc::driver::LaunchArgs<'a>) {
        if self.shape.format == KvFormat::Bf16 {
            l.arg(&self.k).arg(&self.v);
        } else {
            self.push_args(l);
        }
    }
}

/// The rows from the first sequence shorter than `dense_min_q` query rows to the end of the
/// last: (first row, rows). (0, 0) when every sequence is long.
pub(super) fn short_row_span(seqs: &[PagedSeq], dense_min_q: usize) -> (usize, usize) {
    let mut short = seqs.iter().filter(|s| s.q_len < dense_min_q);
    let Some(first) = short.next() else {
        return (0, 0);
    };
    let end = short
        .next_back()
        .map_or(first.q_offset + first.q_len, |s| s.q_offset + s.q_len);
    (first.q_offset, end - first.q_offset)
}

/// A u32 array on the device.
pub struct CudaIndex {
    data: CudaSlice<u32>,
    len: usize,
}

impl CudaIndex {
    /// Number of u32 values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn data(&self) -> &CudaSlice<u32> {
        &self.data
    }

    pub(super) fn data_mut(&mut self) -> &mut CudaSlice<u32> {
        &mut self.data
    }
}

/// A paged batch on the device.
pub struct CudaPagedBatch {
    seqs: CudaSlice<u32>,
    row_seq: CudaSlice<u32>,
    slots: CudaSlice<u32>,
    rows: usize,
    /// The sequences as described on the host (the dense path picks its own from them).
    host_seqs: Vec<PagedSeq>,
    slot_limit: u32,
    /// Set for batches made to be rewritten in place (graphs): the slot capacity, and the
    /// split count is the one for long keys.
    capacity: Option<usize>,
    /// Page starts and pages of the last update by pages (`expand_page_slots`), grown as
    /// needed.
    pages: Option<CudaSlice<u32>>,
}

impl CudaPagedBatch {
    /// Most keys any sequence addresses (chooses the split count).
    fn max_keys(&self) -> usize {
        self.host_seqs.iter().map(|s| s.k_len()).max().unwrap_or(0)
    }
}

/// Format codes of `kernels/paged.cu` (`KV_F32` ...).
pub(super) fn format_code(f: KvFormat) -> i32 {
    match f {
        KvFormat::F32 => 0,
        KvFormat::Bf16 => 1,
        KvFormat::F16 => 2,
        KvFormat::Fp8E4m3PerTokenHead => 3,
        KvFormat::Int8PerTokenHead => 4,
    }
}

/// Tokens a decode attention block takes: every sequence's query run when all of them have
/// the same length and follow each other, two or more tokens whose query heads (`group` a
/// token) fit the mma's rows (a verification's tokens), and the sequences' blocks with
/// their key splits (`blocks_per_seq`: KV heads times the most splits allowed) still fill
/// a wave of `resident` blocks; else 1 (a block a row).
pub(super) fn tokens_per_block(
    seqs: &[PagedSeq],
    group: usize,
    blocks_per_seq: usize,
    resident: usize,
) -> usize {
    let Some(q) = seqs.first().map(|s| s.q_len) else {
        return 1;
    };
    let fits = q >= 2 && q * group <= super::paged_mma::ROWS;
    let uniform = seqs
        .iter()
        .enumerate()
        .all(|(i, s)| s.q_len == q && s.q_offset == i * q);
    if fits && uniform && seqs.len() * blocks_per_seq >= resident {
        q
    } else {
        1
    }
}

/// The kernel's view of a batch: five u32 fields per sequence (`q_offset, q_len, q_start,
/// k_start, slot_offset`) and each query row's sequence index.
fn pack_seqs(seqs: &[PagedSeq]) -> Result<(Vec<u32>, Vec<u32>)> {
    let mut packed = Vec::with_capacity(seqs.len() * 5);
    let mut row_seq = Vec::new();
    for (i, s) in seqs.iter().enumerate() {
        for x in [s.q_offset, s.q_len, s.q_start, s.k_start, s.slot_offset] {
            packed.push(u32::try_from(x).map_err(|_| KernelError::Invalid {
                op: "paged_attention",
                detail: "a sequence field exceeds 32 bits".into(),
            })?);
        }
        row_seq.extend(std::iter::repeat_n(i as u32, s.q_len));
    }
    Ok((packed, row_seq))
}

/// Largest head_dim the attention kernel is sized for (`PA_MAX_D`).
const PA_MAX_D: usize = 512;
const PA_THREADS: u32 = 128;
/// Keys one split walks at least; below this, splitting costs more than it saves.
pub(super) const MIN_SPLIT_KEYS: usize = 256;
/// Must match `PA_MAX_SPLITS` in `kernels/paged.cu` (the combine kernel's weight array).
pub(super) const MAX_SPLITS: usize = 64;
/// Columns one combine block merges (`COMBINE_COLS`).
const COMBINE_COLS: usize = 128;

impl CudaBackend {
    pub(super) fn kv_slab_impl(&self, shape: KvSlabShape) -> Result<CudaKvSlab> {
        let err = device_err("allocating a KV slab");
        let bytes = (shape.elements() * shape.format.element_bytes()).max(1);
        let scales = shape.scales().max(1);
        Ok(CudaKvSlab {
            shape,
            k: self.stream.alloc_zeros::<u8>(bytes).map_err(&err)?,
            v: self.stream.alloc_zeros::<u8>(bytes).map_err(&err)?,
            k_scales: self.stream.alloc_zeros::<f32>(scales).map_err(&err)?,
            v_scales: self.stream.alloc_zeros::<f32>(scales).map_err(&err)?,
        })
    }

    pub(super) fn kv_slab_contents_impl(&self, slab: &CudaKvSlab) -> Result<KvSlabContents> {
        let err = device_err("copying a KV slab to the host");
        let s = slab.shape;
        let bytes = s.elements() * s.format.element_bytes();
        let n = s.scales();
        let get_bytes = |x: &CudaSlice<u8>| -> Result<Vec<u8>> {
            if bytes == 0 {
                return Ok(vec![]);
            }
            self.stream.clone_dtoh(&x.slice(..bytes)).map_err(&err)
        };
        let get_scales = |x: &CudaSlice<f32>| -> Result<Vec<f32>> {
            if n == 0 {
                return Ok(vec![]);
            }
            self.stream.clone_dtoh(&x.slice(..n)).map_err(&err)
        };
        let out = KvSlabContents {
            k: get_bytes(&slab.k)?,
            v: get_bytes(&slab.v)?,
            k_scales: get_scales(&slab.k_scales)?,
            v_scales: get_scales(&slab.v_scales)?,
        };
        self.synchronize()?;
        Ok(out)
    }

    pub(super) fn upload_index_impl(&self, index: &[u32]) -> Result<CudaIndex> {
        Ok(CudaIndex {
            data: self.to_device(index)?,
            len: index.len(),
        })
    }

    pub(super) fn kv_store_impl(
        &self,
        slab: &mut CudaKvSlab,
        k: &CudaBuffer,
        v: &CudaBuffer,
        slots: &CudaIndex,
    ) -> Result<()> {
        const OP: &str = "kv_store";
        let s = slab.shape;
        let (heads, d) = (s.num_kv_heads, s.head_dim);
        let t = slots.len;
        ensure(k.len() == t * heads * d && v.len() == k.len(), OP, || {
            format!(
                "k has {}, v has {}, want {t} rows of {heads} x {d}",
                k.len(),
                v.len()
            )
        })?;
        if t == 0 || heads == 0 || d == 0 {
            return Ok(());
        }
        // Slot bounds are the caller's (the pool's) invariant; a device-side check would
        // cost a copy back per store. The CPU op checks them.
        let (ks, vs) = (k.f32s(OP)?, v.f32s(OP)?);
        let (heads_i, d_i, fmt) = (heads as i32, d as i32, format_code(s.format));
        // bf16 rows of even length take their own entry point (value pairs as words).
        let pairs = s.format == KvFormat::Bf16 && d.is_multiple_of(2);
        let name = if pairs { "kv_store_bf16" } else { OP };
        let mut l = self.stream.launch_builder(self.kernels.get(name)?);
        l.arg(ks)
            .arg(vs)
            .arg(&slots.data)
            .arg(&mut slab.k)
            .arg(&mut slab.v);
        if pairs {
            l.arg(&heads_i).arg(&d_i);
        } else {
            l.arg(&mut slab.k_scales)
                .arg(&mut slab.v_scales)
                .arg(&heads_i)
                .arg(&d_i)
                .arg(&fmt);
        }
        let cfg = LaunchConfig {
            grid_dim: (t as u32, heads as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: k/v hold t rows of heads x d (checked); every slot indexes a row of the
        // slab (the pool hands out only its own slots); the bf16 entry's 4-byte words align,
        // since d is even and every buffer starts an allocation.
        unsafe { l.launch(cfg) }.map_err(device_err(OP))?;
        Ok(())
    }

    pub(super) fn paged_batch_impl(
        &self,
        seqs: &[PagedSeq],
        slots: &[u32],
    ) -> Result<CudaPagedBatch> {
        check_paged(seqs, slots)?;
        let (packed, row_seq) = pack_seqs(seqs)?;
        Ok(CudaPagedBatch {
            seqs: self.to_device(&packed)?,
            row_seq: self.to_device(&row_seq)?,
            slots: self.to_device(slots)?,
            rows: row_seq.len(),
            host_seqs: seqs.to_vec(),
            slot_limit: slots.iter().copied().max().unwrap_or(0),
            capacity: None,
            pages: None,
        })
    }

    pub(super) fn paged_batch_with_capacity_impl(
        &self,
        seqs: &[PagedSeq],
        slots: &[u32],
        capacity: usize,
    ) -> Result<CudaPagedBatch> {
        ensure(slots.len() <= capacity, "paged_batch", || {
            format!("{} slots exceed the capacity of {capacity}", slots.len())
        })?;
        let mut b = self.paged_batch_impl(seqs, slots)?;
        let mut room = self
            .stream
            .alloc_zeros::<u32>(capacity.max(1))
            .map_err(device_err("allocating a slot table"))?;
        if !slots.is_empty() {
            self.stream
                .memcpy_htod(slots, &mut room.slice_mut(..slots.len()))
                .map_err(device_err("copying a slot table"))?;
        }
        b.slots = room;
        b.capacity = Some(capacity);
        Ok(b)
    }

    pub(super) fn paged_batch_update_impl(
        &self,
        b: &mut CudaPagedBatch,
        seqs: &[PagedSeq],
        slots: &[u32],
    ) -> Result<()> {
        const OP: &str = "paged_batch_update";
        check_paged(seqs, slots)?;
        let capacity = b.capacity.ok_or_else(|| KernelError::Invalid {
            op: OP,
            detail: "the batch was not made with a capacity".into(),
        })?;
        let rows: usize = seqs.iter().map(|s| s.q_len).sum();
        ensure(
            seqs.len() == b.host_seqs.len() && rows == b.rows && slots.len() <= capacity,
            OP,
            || {
                format!("{} sequences, {rows} rows, {} slots for a batch of {} sequences, {} rows, {capacity} slots",
                seqs.len(), slots.len(), b.host_seqs.len(), b.rows)
            },
        )?;
        self.rewrite_seqs(b, seqs)?;
        let err = device_err("rewriting a paged batch");
        if !slots.is_empty() {
            self.stream
                .memcpy_htod(slots, &mut b.slots.slice_mut(..slots.len()))
                .map_err(&err)?;
        }
        b.host_seqs = seqs.to_vec();
        b.slot_limit = slots.iter().copied().max().unwrap_or(0);
        Ok(())
    }

    /// Copies the packed sequences and each row's sequence of `seqs` over a batch's (the
    /// same counts, checked by the caller).
    fn rewrite_seqs(&self, b: &mut CudaPagedBatch, seqs: &[PagedSeq]) -> Result<()> {
        let (packed, row_seq) = pack_seqs(seqs)?;
        let err = device_err("rewriting a paged batch");
        self.stream
            .memcpy_htod(&packed, &mut b.seqs.slice_mut(..packed.len()))
            .map_err(&err)?;
        if !row_seq.is_empty() {
            self.stream
                .memcpy_htod(&row_seq, &mut b.row_seq.slice_mut(..row_seq.len()))
                .map_err(&err)?;
        }
        Ok(())
    }

    pub(super) fn paged_batch_update_pages_impl(
        &self,
        b: &mut CudaPagedBatch,
        seqs: &[PagedSeq],
        pages: &[u32],
        page_start: &[u32],
        page_size: usize,
    ) -> Result<()> {
        const OP: &str = "paged_batch_update_pages";
        let capacity = b.capacity.ok_or_else(|| KernelError::Invalid {
            op: OP,
            detail: "the batch was not made with a capacity".into(),
        })?;
        // The checks `check_paged` and `expand_page_slots` make, and the largest slot read
        // (the attention's bounds check), from the pages alone.
        let mut slot_limit = 0;
        let keys = page_slot_runs(seqs, pages, page_start, page_size, |run| {
            slot_limit = slot_limit.max(run.end - 1)
        })?;
        let rows: usize = seqs.iter().map(|s| s.q_len).sum();
        ensure(
            seqs.len() == b.host_seqs.len() && rows == b.rows && keys <= capacity,
            OP,
            || {
                format!(
                    "{} sequences, {rows} rows and {keys} keys for a batch of {} sequences, {} rows and {capacity} slots",
                    seqs.len(),
                    b.host_seqs.len(),
                    b.rows
                )
            },
        )?;
        self.rewrite_seqs(b, seqs)?;
        let err = device_err("rewriting a paged batch");
        let mut host = Vec::with_capacity(page_start.len() + pages.len());
        host.extend_from_slice(page_start);
        host.extend_from_slice(pages);
        if b.pages.as_ref().is_none_or(|d| d.len() < host.len()) {
            b.pages = Some(
                self.stream
                    .alloc_zeros::<u32>(host.len().next_power_of_two())
                    .map_err(device_err("allocating a page list"))?,
            );
        }
        let buf = b.pages.as_mut().expect("allocated above");
        if !host.is_empty() {
            self.stream
                .memcpy_htod(&host, &mut buf.slice_mut(..host.len()))
                .map_err(&err)?;
        }
        if !seqs.is_empty() {
            let (ps, n) = (page_size as u32, seqs.len() as u32);
            let mut l = self
                .stream
                .launch_builder(self.kernels.get("expand_page_slots")?);
            l.arg(&b.seqs).arg(&*buf).arg(&mut b.slots).arg(&ps).arg(&n);
            let cfg = LaunchConfig {
                grid_dim: (n, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: every sequence's keys lie within `pages` and its slots within the
            // capacity (checked above); the packed sequences were copied first.
            unsafe { l.launch(cfg) }.map_err(device_err("expand_page_slots"))?;
        }
        b.host_seqs = seqs.to_vec();
        b.slot_limit = slot_limit;
        Ok(())
    }

    pub(super) fn write_index_impl(&self, index: &mut CudaIndex, data: &[u32]) -> Result<()> {
        ensure(data.len() == index.len, "write_index", || {
            format!("{} values for an index of {}", data.len(), index.len)
        })?;
        if data.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_htod(data, &mut index.data.slice_mut(..data.len()))
            .map_err(device_err("write_index"))
    }

    /// The kernel that attention over a slab of `format` runs for rows of one token (decode
    /// steps), so that tests can tell which path they exercised.
    pub fn decode_attention_kernel(&self, format: KvFormat, p: &AttentionParams) -> &'static str {
        if self.paged_mma.applies(self.bf16_gemm, format, p) {
            self.paged_mma.decode_kernel(p.head_dim, format).0
        } else {
            "paged_attention"
        }
    }

    /// The kernel that long query runs (prefill chunks of `dense_min_q` rows or more) over a
    /// slab of `format` run: a tensor-core prefill entry point, or the GEMM path (None).
    pub fn prefill_attention_kernel(
        &self,
        format: KvFormat,
        p: &AttentionParams,
    ) -> Option<&'static str> {
        if !self.paged_mma.prefill_applies(self.bf16_gemm, format, p) {
            return None;
        }
        super::paged_mma::prefill_shape(p.head_dim, format).map(|s| s.seqs_kernel)
    }

    pub(super) fn paged_attention_impl(
        &self,
        q: &CudaBuffer,
        slab: &CudaKvSlab,
        batch: &CudaPagedBatch,
        p: AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "paged_attention";
        let s = slab.shape;
        let d = p.head_dim;
        ensure(
            d == s.head_dim && p.n_kv_heads == s.num_kv_heads,
            OP,
            || format!("params {p:?} do not match the slab {s:?}"),
        )?;
        ensure(d > 0 && d <= PA_MAX_D, OP, || {
            format!("head_dim {d} outside 1..={PA_MAX_D}")
        })?;
        ensure(
            p.n_kv_heads > 0 && p.n_heads.is_multiple_of(p.n_kv_heads),
            OP,
            || format!("{} heads over {} KV heads", p.n_heads, p.n_kv_heads),
        )?;
        ensure(
            (batch.slot_limit as usize) < s.slots || batch.max_keys() == 0,
            OP,
            || format!("slot {} outside the slab's {}", batch.slot_limit, s.slots),
        )?;
        let rows = batch.rows;
        ensure(
            q.len() == rows * p.n_heads * d && out.len() == q.len(),
            OP,
            || format!("q has {}, out {}, want {rows} rows", q.len(), out.len()),
        )?;
        let cap = p.softcap.unwrap_or(1.0);
        ensure(cap > 0.0 && cap.is_finite(), OP, || {
            format!("softcap {cap} must be positive and finite")
        })?;
        if rows == 0 || p.n_heads == 0 {
            return Ok(());
        }
        let plan = AttentionPlan::choose(
            AttentionCall {
                seqs: &batch.host_seqs,
                rows,
                graph: batch.capacity.is_some(),
                format: s.format,
                p: &p,
            },
            AttentionLimits {
                bf16_gemm: self.bf16_gemm,
                gemv_max_rows: self.gemv_max_rows,
                dense_min_q: self.dense_min_q,
                sm_count: self.sm_count,
                mma: &self.paged_mma,
            },
        );
        let dense_min_q = plan.dense_min_q;
        let qs = q.f32s(OP)?;
        let (os, mut ob) = out.f32s_maybe_twin_mut(&self.stream, plan.twin, OP)?;
        let ob_addr = twin_addr(&self.stream, &mut ob);
        let Some(launch) = plan.decode else {
            return self.dense_sequences(qs, slab, batch, p, dense_min_q, os, ob_addr);
        };
        let DecodeLaunch {
            mma,
            kernel: name,
            smem: mma_smem,
            row0,
            span,
            tokens_per_block: tpb,
            splits,
        } = launch;
        let tasks = span * p.n_heads;
        let err = device_err("allocating attention workspace");
        // Every split block writes its whole part of the workspace (empty splits write a
        // zero sum), so it needs no zero fill.
        let (ws_len, ml_len) = if splits > 1 {
            (tasks * splits * d, tasks * splits * 2)
        } else {
            (1, 1)
        };
        // SAFETY: device memory written by the attention kernel before the combine reads it.
        let (mut ws_acc, mut ws_ml) = unsafe {
            (
                self.stream.alloc::<f32>(ws_len).map_err(&err)?,
                self.stream.alloc::<f32>(ml_len).map_err(&err)?,
            )
        };
        let window: i64 = p
            .window
            .map_or(-1, |w| i64::try_from(w).unwrap_or(i64::MAX));
        let (heads, kv_heads, d_i) = (p.n_heads as i32, p.n_kv_heads as i32, d as i32);
        let fmt = format_code(s.format);
        let has_cap = i32::from(p.softcap.is_some());
        let splits_i = splits as i32;
        let dense_min_q_i = i32::try_from(dense_min_q).unwrap_or(i32::MAX);
        let mut l = self.stream.launch_builder(self.kernels.get(name)?);
        l.arg(qs);
        // The bf16 tensor-core kernels take the codes alone; the others take all four arrays.
        if mma {
            slab.push_mma_args(&mut l);
        } else {
            slab.push_args(&mut l);
        }
        l.arg(&batch.seqs)
            .arg(&batch.row_seq)
            .arg(&batch.slots)
            .arg(&mut *os);
        if mma {
            l.arg(&ob_addr);
        }
        l.arg(&mut ws_acc)
            .arg(&mut ws_ml)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&d_i);
        if !mma {
            l.arg(&fmt);
        }
        l.arg(&p.scale)
            .arg(&window)
            .arg(&has_cap)
            .arg(&cap)
            .arg(&splits_i)
            .arg(&dense_min_q_i);
        let stages = self.paged_mma.stages(d);
        let (stages_i, row0_i, tpb_i) = (stages as i32, row0 as i32, tpb as i32);
        let cfg = if mma {
            l.arg(&stages_i).arg(&row0_i);
            if name != super::paged_mma::KERNEL {
                l.arg(&tpb_i);
            }
            LaunchConfig {
                grid_dim: ((span / tpb) as u32, p.n_kv_heads as u32, splits as u32),
                block_dim: (super::paged_mma::THREADS, 1, 1),
                shared_mem_bytes: mma_smem as u32,
            }
        } else {
            LaunchConfig {
                grid_dim: (rows as u32, p.n_heads as u32, splits as u32),
                block_dim: (PA_THREADS, 1, 1),
                shared_mem_bytes: 0,
            }
        };
        // SAFETY: q/out hold rows x n_heads x d and the grid covers rows row0 .. row0 + span
        // (inside them); every slot read is below the slab's slots (checked through
        // slot_limit); the workspace holds the span's tasks x splits partials; the
        // tensor-core kernel gets a slab of a format it takes (bf16, or fp8 / int8 on the
        // 8-bit entry points), d a multiple of 64 and the shared memory its layout needs
        // (granted at start-up, `MmaSupport::probe`).
        unsafe { l.launch(cfg) }.map_err(device_err(name))?;
        if splits > 1 {
            // (Without mma there is no twin: ob_addr is 0.) The span's rows only.
            let first = row0 * p.n_heads * d;
            let twin_span = twin_at(ob_addr, first);
            self.combine_splits(
                &ws_acc.slice(..),
                &ws_ml.slice(..),
                &mut os.slice_mut(first..first + tasks * d),
                twin_span,
                tasks,
                d,
                splits,
            )?;
        }
        if plan.prefill {
            self.dense_sequences(qs, slab, batch, p, dense_min_q, os, ob_addr)?;
        }
        Ok(())
    }

    /// Attends the sequences with at least `dense_min_q` query rows: the tensor-core
    /// prefill kernel in the bf16 mode on bf16 slabs (with the output's bf16 twin at device
    /// address `twin` unless 0), else the GEMM path.
    #[allow(clippy::too_many_arguments)]
    fn dense_sequences(
        &self,
        qs: &CudaSlice<f32>,
        slab: &CudaKvSlab,
        batch: &CudaPagedBatch,
        p: AttentionParams,
        dense_min_q: usize,
        os: &mut CudaSlice<f32>,
        twin: u64,
    ) -> Result<()> {
        let mma = self
            .paged_mma
            .prefill_applies(self.bf16_gemm, slab.shape.format, &p);
        let long: Vec<(usize, PagedSeq)> = batch
            .host_seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.q_len >= dense_min_q && s.k_len() > 0)
            .map(|(i, s)| (i, *s))
            .collect();
        if mma && long.len() > 1 {
            // The step's prompts in one launch (up to MAX_RUNS at a time).
            for runs in long.chunks(super::prefill_attention::MAX_RUNS) {
                self.prefill_attention_seqs(
                    qs,
                    slab,
                    &batch.seqs,
                    &batch.slots,
                    runs,
                    p,
                    os,
                    twin,
                )?;
            }
            return Ok(());
        }
        for (_, seq) in &long {
            if mma {
                self.prefill_attention(qs, slab, &batch.slots, seq, p, os, twin)?;
            } else {
                self.dense_attention(qs, slab, &batch.slots, seq, p, os)?;
            }
        }
        Ok(())
    }

    /// Merges `splits` partial results per task (`paged_combine`) into `out`'s
    /// `tasks` x `d` values, and into their bf16 twin at device address `twin` unless 0.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn combine_splits(
        &self,
        ws_acc: &cudarc::driver::CudaView<'_, f32>,
        ws_ml: &cudarc::driver::CudaView<'_, f32>,
        out: &mut cudarc::driver::CudaViewMut<'_, f32>,
        twin: u64,
        tasks: usize,
        d: usize,
        splits: usize,
    ) -> Result<()> {
        ensure(
            out.len() >= tasks * d
                && ws_acc.len() >= tasks * splits * d
                && ws_ml.len() >= tasks * splits * 2,
            "paged_combine",
            || format!("{tasks} tasks of {d} over {splits} splits do not fit the buffers"),
        )?;
        let (d_i, splits_i) = (d as i32, splits as i32);
        let mut l = self
            .stream
            .launch_builder(self.kernels.get("paged_combine")?);
        l.arg(ws_acc)
            .arg(ws_ml)
            .arg(out)
            .arg(&twin)
            .arg(&d_i)
            .arg(&splits_i);
        let cfg = LaunchConfig {
            grid_dim: (tasks as u32, d.div_ceil(COMBINE_COLS) as u32, 1),
            block_dim: (COMBINE_COLS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the workspace holds tasks x splits partials (checked); out holds tasks x d,
        // and so does the twin where the caller passed one.
        unsafe { l.launch(cfg) }.map_err(device_err("paged_combine"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(q_offset: usize, q_len: usize) -> PagedSeq {
        PagedSeq {
            q_offset,
            q_len,
            q_start: 0,
            k_start: 0,
            slot_offset: 0,
        }
    }

    #[test]
    fn short_rows_span_from_the_first_short_sequence_to_the_last() {
        // Decode rows after two prompts (a server's mixed step).
        let step = [seq(0, 512), seq(512, 512), seq(1024, 1), seq(1025, 1)];
        assert_eq!(short_row_span(&step, 64), (1024, 2));
        // Decode rows first, then a prompt.
        let step = [seq(0, 1), seq(1, 8), seq(9, 300)];
        assert_eq!(short_row_span(&step, 64), (0, 9));
        // A prompt between decode rows stays inside the span (its blocks find no keys).
        let step = [seq(0, 1), seq(1, 300), seq(301, 1)];
        assert_eq!(short_row_span(&step, 64), (0, 302));
        assert_eq!(short_row_span(&[seq(0, 100)], 64), (0, 0));
    }

    #[test]
    fn a_verifications_tokens_share_a_block_where_blocks_still_fill_a_wave() {
        let run = |n: usize, q: usize| -> Vec<PagedSeq> { (0..n).map(|i| seq(i * q, q)).collect() };
        // E4B (4 query heads a KV head): 100 requests checking 1-3 drafts, 2 KV heads times
        // 16 splits a sequence against 264 resident blocks.
        for q in 2..=4 {
            assert_eq!(tokens_per_block(&run(100, q), 4, 32, 264), q);
        }
        // More tokens than the mma's 16 rows hold; E2B's group of 8 holds two.
        assert_eq!(tokens_per_block(&run(100, 5), 4, 32, 264), 1);
        assert_eq!(tokens_per_block(&run(100, 2), 8, 16, 264), 2);
        assert_eq!(tokens_per_block(&run(100, 3), 8, 16, 264), 1);
        // One request: too few blocks for a wave, a block a token keeps the GPU busier.
        assert_eq!(tokens_per_block(&run(1, 4), 4, 32, 264), 1);
        // Decode rows, and runs of different lengths.
        assert_eq!(tokens_per_block(&run(100, 1), 4, 32, 264), 1);
        let mixed = [seq(0, 2), seq(2, 3), seq(5, 2)];
        assert_eq!(tokens_per_block(&mixed, 4, 1000, 264), 1);
        assert_eq!(tokens_per_block(&[], 4, 32, 264), 1);
    }
}
