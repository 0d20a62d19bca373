//! What a forward pass needs from the KV pool: store a layer's K/V for the batch's tokens,
//! and attend a layer's queries over the K/V its sequences can see.
//!
//! Two pools implement it:
//! - `KvPool<HostStorage>`: slabs in host memory; K/V cross to the host to be stored and
//!   are gathered back per sequence for attention (any backend; the CPU path).
//! - `KvPool<PagedStorage<B>>`: slabs in the backend's memory; the backend's `kv_store` and
//!   `paged_attention` address them through slot tables built once per step (the GPU path).

use rayon::prelude::*;
use strata_kernels::{AttentionParams, Backend, HostSlice, QkvPrep, RopeAt, StridedCopy};
use strata_kv::{HostStorage, KvPool};

use crate::assistant::{Assistant, DraftSeq};
use crate::batch::ForwardBatch;
use crate::error::Result;
use crate::forward::Prepared;
use crate::greedy_rows::GreedyRows;
use crate::launch::Launched;
use crate::model::Model;

pub use crate::paged_kv::{DecodeGraphs, PagedStorage};

/// Per-token K/V storage addressed by (layer, request, position).
pub trait KvCache<B: Backend> {
    /// Called once per forward pass before the first layer.
    fn begin_step(&mut self, b: &B, batch: &ForwardBatch) -> Result<()>;

    /// Runs the whole step by replaying a captured graph, if this cache keeps graphs and
    /// the batch is one it can replay; `None` sends the step down the op-by-op path.
    #[allow(private_interfaces)]
    /// Ids marked as fed take `fed`'s greedy tokens ([`Model::launch`]).
    fn replay_decode(
        &mut self,
        _model: &Model<B>,
        _batch: &ForwardBatch,
        _prep: &Prepared,
        _fed: Option<&B::Tokens>,
    ) -> Result<Option<Launched<B>>> {
        Ok(None)
    }

    /// Runs a verification step (every sequence the same number of tokens, every row's
    /// greedy token wanted) by replaying a captured graph, if this cache keeps graphs;
    /// `None` sends it down the op-by-op path.
    #[allow(private_interfaces)]
    fn replay_rows(
        &mut self,
        _model: &Model<B>,
        _batch: &ForwardBatch,
        _prep: &Prepared,
        _choices: crate::greedy_rows::RowChoices,
    ) -> Result<Option<GreedyRows<B>>> {
        Ok(None)
    }

    /// A round of `steps` draft steps replayed as a captured graph, if this cache keeps
    /// graphs and the round can be one ([`Assistant::draft`]); `None` runs it op by op.
    fn draft_round(
        &mut self,
        _assistant: &Assistant<B>,
        _target: &Model<B>,
        _seqs: &[DraftSeq],
        _tokens: &[u32],
        _hidden: &B::Buffer,
        _steps: usize,
    ) -> Result<Option<Vec<Vec<u32>>>> {
        Ok(None)
    }

    /// Stores rows of `k` and `v` (`[T, num_kv_heads * head_dim]`, the batch's tokens in
    /// order) for a KV-owning `layer`; a KV-shared layer stores nothing.
    fn store(
        &mut self,
        b: &B,
        layer: usize,
        batch: &ForwardBatch,
        k: &B::Buffer,
        v: &B::Buffer,
    ) -> Result<()>;

    /// A KV-owning `layer`'s q, k and v prepared ([`Backend::qkv_norm_rope_idx`]), then its
    /// k and v stored as [`KvCache::store`] does. A cache whose slabs the backend addresses
    /// hands both to [`Backend::qkv_norm_rope_store_idx`] (one launch on the GPU).
    #[allow(clippy::too_many_arguments)]
    fn prepare_and_store(
        &mut self,
        b: &B,
        layer: usize,
        batch: &ForwardBatch,
        [q, k, v]: [&mut B::Buffer; 3],
        norms: [&B::Buffer; 2],
        at: RopeAt<'_, B>,
        prep: QkvPrep,
    ) -> Result<()> {
        b.qkv_norm_rope_idx([q, &mut *k, &mut *v], norms, at, prep)?;
        self.store(b, layer, batch, k, v)
    }

    /// Attention of `layer`'s queries `q [T, n_heads * head_dim]` over the K/V it reads (its
    /// source's, for a KV-shared layer), into `out`.
    fn attend(
        &mut self,
        b: &B,
        layer: usize,
        batch: &ForwardBatch,
        q: &B::Buffer,
        p: AttentionParams,
        out: &mut B::Buffer,
    ) -> Result<()>;
}

/// Positions from which the host pool's gather of a sequence's K/V runs on all threads.
const PAR_GATHER_MIN: usize = 256;

/// Copies `rows` rows of `cols` values between token-major buffers.
pub(crate) fn copy_rows<B: Backend>(
    b: &B,
    src: &B::Buffer,
    dst: &mut B::Buffer,
    rows: usize,
    cols: usize,
    src_row: usize,
    dst_row: usize,
) -> Result<()> {
    b.copy_strided(
        src,
        dst,
        StridedCopy {
            rows,
            cols,
            src_offset: src_row * cols,
            src_stride: cols,
            dst_offset: dst_row * cols,
            dst_stride: cols,
        },
    )?;
    Ok(())
}

impl<B: Backend> KvCache<B> for KvPool<HostStorage> {
    fn begin_step(&mut self, _: &B, _: &ForwardBatch) -> Result<()> {
        Ok(())
    }

    fn store(
        &mut self,
        b: &B,
        layer: usize,
        batch: &ForwardBatch,
        k: &B::Buffer,
        v: &B::Buffer,
    ) -> Result<()> {
        let (kh, vh) = (b.download(k)?, b.download(v)?);
        let tokens: usize = batch.seqs.iter().map(|s| s.tokens.len()).sum();
        let row = kh.len() / tokens.max(1);
        let mut at = 0;
        for seq in &batch.seqs {
            for i in 0..seq.tokens.len() {
                let slot = self.slot(seq.request, seq.start + i)?;
                self.write_kv(layer, slot, &kh[at..at + row], &vh[at..at + row])?;
                at += row;
            }
        }
        Ok(())
    }

    fn attend(
        &mut self,
        b: &B,
        layer: usize,
        batch: &ForwardBatch,
        q: &B::Buffer,
        p: AttentionParams,
        out: &mut B::Buffer,
    ) -> Result<()> {
        let act = b.activation_dtype();
        let (qrow, kvrow) = (p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim);
        let (mut kh, mut vh) = (Vec::new(), Vec::new());
        let mut offset = 0;
        for seq in &batch.seqs {
            let len = seq.tokens.len();
            // Keys the chunk's queries can see: all earlier positions, or the last W - 1
            // before the chunk for a sliding layer.
            let end = seq.start + len;
            let lo = p.window.map_or(0, |w| seq.start.saturating_sub(w - 1));
            kh.clear();
            vh.clear();
            kh.resize((end - lo) * kvrow, 0.0);
            vh.resize((end - lo) * kvrow, 0.0);
            // Each position's rows on their own (a slot lookup and a conversion each): over
            // a long context, split over the threads, which would otherwise idle here.
            let pool = &*self;
            let read = |(i, (k, v)): (usize, (&mut [f32], &mut [f32]))| {
                let slot = pool.slot(seq.request, lo + i)?;
                pool.read_kv(layer, slot, k, v)
            };
            if end - lo >= PAR_GATHER_MIN {
                let rows = kh.par_chunks_mut(kvrow).zip(vh.par_chunks_mut(kvrow));
                rows.enumerate().try_for_each(read)?;
            } else {
                let rows = kh.chunks_mut(kvrow).zip(vh.chunks_mut(kvrow));
                rows.enumerate().try_for_each(read)?;
            }
            let kbuf = b.upload(HostSlice::F32(&kh))?;
            let vbuf = b.upload(HostSlice::F32(&vh))?;
            let k_pos: Vec<u32> = (lo..end).map(|x| x as u32).collect();
            let q_pos: Vec<u32> = (seq.start..end).map(|x| x as u32).collect();
            let mut qs = b.zeros(len * qrow, act)?;
            copy_rows(b, q, &mut qs, len, qrow, offset, 0)?;
            let mut os = b.zeros(len * qrow, act)?;
            b.attention(&qs, &kbuf, &vbuf, &q_pos, &k_pos, p, &mut os)?;
            copy_rows(b, &os, out, len, qrow, 0, offset)?;
            offset += len;
        }
        Ok(())
    }
}
